import Foundation
import Testing
import WhendWire

/// Sends `lines` with acks on a fresh connection and returns what the daemon answered before it
/// closed, or nil if it did not close within `seconds` (a daemon stuck on the event path).
private func exchangeWithin(_ seconds: Double, _ socketPath: String, _ lines: [String]) throws -> [[String: Any]]? {
    let connection = try BlockingSocket(path: socketPath)
    for line in lines { try connection.send(line + "\n") }
    connection.finishSending()
    var text: [UInt8] = []
    let deadline = Date().addingTimeInterval(seconds)
    while true {
        guard connection.waitReadable(timeout: deadline.timeIntervalSinceNow) else { return nil }
        let chunk = try connection.receive()
        if chunk.isEmpty { break }
        text += chunk
    }
    return String(decoding: text, as: UTF8.self).split(separator: "\n").compactMap {
        try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
    }
}

private func whens(_ range: ClosedRange<Int>) -> [String] {
    [helloWithAcks] + range.map { #"{"type":"when","name":"tap","id":"t\#($0)"}"# }
}

/// The configuration boundary: what a plugin refuses is refused before it is taken up, with the
/// plugin's own words, and the configuration in force stays.
@Suite(.serialized) struct ConfigurationBoundaryTests {
    /// A pipeline plugin whose `create` refuses its configuration refuses the reload (it used to
    /// be taken up, exit 0, and its worker crash in a loop with the reason only in the log); the
    /// pipeline running goes on with its old configuration, events flowing through it. A
    /// `create` that crashes or hangs refuses it too, without taking whend down.
    @Test func aReloadAPipelinePluginRefusesIsRefusedWithItsMessageAndTheOldPipelineRuns() throws {
        let (daemon, seen) = try pipelineDaemon("cfg-refuse")
        let config = daemon.directory + "/whend.conf"
        let plugins = daemon.directory + "/plugins"
        try daemon.start()
        defer { daemon.stop() }
        #expect(try exchange(daemon.socketPath, whens(1...10)).acks.last == 10)
        #expect(try daemon.waitForPipeline("rec", cursor: 10))

        for (settings, expected) in [
            (#"{"every": 0}"#, #"pipeline rec: plugin recorder would not start: "every" must be 1 or more"#),
            (#"{"create_crashes":true}"#, "killed by signal 11 while plugin recorder of pipeline rec was created"),
            (
                #"{"create_hangs":true}"# + "\npipeline_watchdog = 1",
                "did not finish within 1 s while plugin recorder of pipeline rec was created"
            ),
        ] {
            try "plugin_dirs = \(plugins)\npipeline.rec = recorder\nplugin.recorder = \(settings)\n".write(
                toFile: config, atomically: true, encoding: .utf8)
            let reload = try daemon.whenctl(["reload"])
            #expect(reload.status == 1, "\(reload)")
            #expect(reload.error.contains(expected), "\(reload.error)")
            // --check-config says the same, as a refused configuration (exit 2).
            let check = try runCommand(executable("whend"), ["--check-config", "--config", config])
            #expect(check.status == 2 && check.error.contains(expected), "\(check)")
        }

        // The old configuration stays: every record still reaches the recorder (every 1), from
        // the worker that was running, never restarted.
        #expect(try exchange(daemon.socketPath, whens(11...20)).acks.last == 10)
        #expect(try daemon.waitForPipeline("rec", cursor: 20))
        #expect(Set(seenSeqs(seen)) == Set(1...20))
        #expect(try daemon.pipeline("rec")?["restarts"] as? Int == 0)
        let status = try daemon.status()
        #expect(
            ((status["last_reload"] as? [String: Any])?["outcome"] as? String)?.contains("refused") == true,
            "\(status)")

        // A configuration the plugin takes is applied.
        try "plugin_dirs = \(plugins)\npipeline.rec = recorder\nplugin.recorder = {\"every\": 2}\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let good = try daemon.whenctl(["reload"])
        #expect(good.status == 0, "\(good)")
        #expect(try exchange(daemon.socketPath, whens(21...30)).acks.last == 10)
        #expect(try daemon.waitForPipeline("rec", cursor: 30))
        #expect(Set(seenSeqs(seen).filter { $0 > 20 }) == [22, 24, 26, 28, 30])
    }

    /// `whend --check-config` creates every plugin instance the configuration names: a plugin
    /// that does not exist, or that is not what its place asks for, fails naming it; the
    /// embedded defaults (the built-in pipelines) pass.
    @Test func checkConfigFailsNamingAPluginThatDoesNotExist() throws {
        let directory = scratchDirectory("cfg-check")
        let plugins = try pluginDirectory(in: directory)
        _ = try buildTestPlugin("recorder", into: plugins, name: "recorder")
        _ = try buildGatePlugin(into: plugins, name: "gate")
        let config = directory + "/whend.conf"
        func check(_ text: String) throws -> (status: Int32, output: String, error: String) {
            try "plugin_dirs = \(plugins)\n\(text)\n".write(toFile: config, atomically: true, encoding: .utf8)
            return try runCommand(executable("whend"), ["--check-config", "--config", config])
        }
        let missing = try check("pipeline.p = recorder, nosuch")
        #expect(missing.status == 2, "\(missing)")
        #expect(missing.error.contains("pipeline p: no plugin nosuch (libnosuch.so or nosuch.so)"), "\(missing.error)")
        let missingIngest = try check("ingest = gate, absent")
        #expect(missingIngest.status == 2 && missingIngest.error.contains("no plugin absent"), "\(missingIngest)")
        let wrongPlace = try check("ingest = recorder")
        #expect(wrongPlace.status == 2 && wrongPlace.error.contains("is not ingest middleware"), "\(wrongPlace)")
        let fine = try check("ingest = gate\npipeline.p = recorder\nplugin.recorder = {\"every\": 3}")
        #expect(fine.status == 0 && fine.output.hasPrefix("# configuration OK"), "\(fine)")
        // Each instance was created in a scratch state directory of its own, since removed.
        #expect(!FileManager.default.fileExists(atPath: directory + "/state"))

        // The built-in pipelines, from the plugins built beside whend, on the embedded defaults.
        let builtin = try runCommand(
            executable("whend"), ["--check-config", "--state-dir", directory + "/state"],
            environment: ["WHEND_CONFIG": "/dev/null"])
        #expect(builtin.status == 0, "\(builtin)")
    }

    /// Two plugin names that reach one library (a symbolic link) are one plugin: a chain naming
    /// both is refused like one naming a plugin twice. On reload the second name used to be
    /// given the first's running instance, whose `next` then waited on itself: every
    /// connection's events hung.
    @Test func twoNamesOfOneLibraryAreRefusedNotDeadlocked() throws {
        let daemon = TestDaemon("cfg-symlink")
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildGatePlugin(into: plugins, name: "gate")
        try FileManager.default.createSymbolicLink(atPath: plugins + "/libgate2.so", withDestinationPath: "libgate.so")
        _ = try buildTestPlugin("recorder", into: plugins, name: "recorder")
        try FileManager.default.createSymbolicLink(
            atPath: plugins + "/librecorder2.so", withDestinationPath: plugins + "/librecorder.so")
        let config = daemon.directory + "/whend.conf"
        func configure(_ text: String) throws {
            try "plugin_dirs = \(plugins)\n\(text)\n".write(toFile: config, atomically: true, encoding: .utf8)
        }
        try configure("ingest = gate")
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        defer { daemon.stop() }
        #expect(try exchangeWithin(10, daemon.socketPath, whens(1...3))?.acks.last == 3)

        try configure("ingest = gate, gate2")
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 1, "\(reload)")
        #expect(reload.error.contains("plugins gate and gate2 are one library"), "\(reload.error)")
        let answers = try exchangeWithin(10, daemon.socketPath, whens(4...6))
        #expect(answers?.acks.last == 3, "events must still be acknowledged: \(String(describing: answers))")

        try configure("pipeline.p = recorder, recorder2")
        let pipeline = try daemon.whenctl(["reload"])
        #expect(pipeline.status == 1 && pipeline.error.contains("plugins recorder and recorder2 are one library"))
        let check = try runCommand(executable("whend"), ["--check-config", "--config", config])
        #expect(check.status == 2 && check.error.contains("plugins recorder and recorder2 are one library"))
    }

    /// Past `max_connections` a connection is answered with one `unavailable` error about the
    /// connection and closed, counted and logged; once one closes, another is served.
    @Test func connectionsPastTheCapAreRefusedWithAnErrorLine() throws {
        let daemon = TestDaemon("cfg-cap", arguments: ["--max-connections", "3"])
        try daemon.start()
        defer { daemon.stop() }
        // The start's own probe is closed before the count is taken.
        #expect(eventually { (try? daemon.status()["connections"] as? Int) == 0 })
        var open: [BlockingSocket] = []
        for _ in 0..<3 {
            let connection = try BlockingSocket(path: daemon.socketPath).bounded()
            try connection.send(helloWithAcks + "\n")
            #expect(connection.waitReadable(timeout: 10))
            #expect(String(decoding: try connection.receive(), as: UTF8.self).contains("welcome"))
            open.append(connection)
        }
        let extra = try BlockingSocket(path: daemon.socketPath)
        var answer: [UInt8] = []
        while extra.waitReadable(timeout: 10) {
            let chunk = try extra.receive()
            if chunk.isEmpty { break }
            answer += chunk
        }
        let lines = String(decoding: answer, as: UTF8.self).split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(lines.count == 1, "\(lines)")
        #expect(lines.errors.first?.code == "unavailable" && lines.errors.first?.event == nil, "\(lines)")
        #expect(lines.errors.first?.message.contains("max_connections") == true, "\(lines)")
        let metrics = try daemon.whenctl(["metrics"])
        #expect(metrics.output.contains("whend_connections_refused_total 1"), "\(metrics.output)")
        #expect(try daemon.status()["connections_refused"] as? Int == 1)
        #expect(daemon.waitForLog("max_connections"))

        open.removeLast()
        #expect(eventually { (try? daemon.status()["connections"] as? Int) == 2 })
        #expect(try exchangeWithin(10, daemon.socketPath, whens(1...2))?.acks.last == 2)
    }
}
