import Foundation
import Testing
import WhendWire

/// Builds the C test plugin with the system's compiler, against the ABI header.
func buildGatePlugin(into directory: String, name: String, defines: [String] = []) throws -> String {
    try buildTestPlugin("gate", into: directory, name: name, defines: defines)
}

/// Builds one of the C test plugins in Tests/Fixtures as lib<name>.so.
func buildTestPlugin(_ source: String, into directory: String, name: String, defines: [String] = []) throws -> String {
    let root = DocumentationTests.root
    let output = directory + "/lib\(name).so"
    let r = try runCommand(
        "/usr/bin/cc",
        ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I", root + "/Sources/CWhendPlugin/include"] + defines + [
            root + "/Tests/Fixtures/\(source).c", "-o", output,
        ])
    guard r.status == 0 else { throw TestFailure(description: "cc failed: \(r.error)") }
    return output
}

@Suite(.serialized) struct PluginTests {
    /// The Swift redact plugin (built by `swift build` through the SDK) and the C gate plugin
    /// (built here with cc), loaded with dlopen into a running daemon as ingest middleware.
    @Test func swiftAndCPluginsChangeDropAndRejectBeforeTheJournal() throws {
        let daemon = TestDaemon("plugins")
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildGatePlugin(into: plugins, name: "gate")
        let marker = daemon.directory + "/old-plugin-ran"
        _ = try buildGatePlugin(
            into: plugins, name: "old", defines: ["-DGATE_ABI=2", "-DGATE_MARKER=\"\(marker)\""])
        let builtPlugins = (executable("whend") as NSString).deletingLastPathComponent
        let config = daemon.directory + "/whend.conf"
        func configure(ingest: String) throws {
            try """
            plugin_dirs = \(plugins):\(builtPlugins)
            ingest = \(ingest)
            plugin.redact = {"fields": ["email", "password"]}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        }
        try configure(ingest: "gate, redact")
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()

        let events = [
            #"{"type":"when","name":"changeEmail","params":{"email":"ann@example.com","password":"x","step":1}}"#,
            #"{"type":"when","name":"debugTrace","params":{"email":"ann@example.com"}}"#,
            #"{"type":"when","name":"forbidden"}"#,
            #"{"type":"screen","name":"Settings","id":"s-1"}"#,
            // The same key spelled with an escape is the same key: redacted all the same.
            #"{"type":"when","name":"escaped","params":{"em\u0061il":"escaped@x.com","step":2}}"#,
        ]
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + events)
        #expect(answers.acks.last == 5)
        #expect(answers.errors.map(\.code) == ["rejected"])
        #expect(answers.errors.first?.event == 3)
        #expect(answers.errors.first?.message.contains("gate") == true)
        #expect(answers.errors.first?.message.contains("forbidden events are not allowed here") == true)

        let listed = try daemon.whenctl(["plugins"])
        #expect(listed.status == 0 && listed.output.contains("redact 1.0.0 (ABI 1)"), "\(listed.output)")
        // The counter the C plugin keeps through the host: it saw all four events.
        #expect(listed.output.contains("gate 0.1.0 (ABI 1) running in ingest; seen 5"), "\(listed.output)")

        // An ABI this whend does not speak: refused with the reason, never called; the daemon
        // carries on with the chain it had.
        try configure(ingest: "old")
        let refused = try daemon.whenctl(["reload"])
        #expect(refused.status == 1)
        #expect(refused.error.contains("built for plugin ABI 2; this whend speaks ABI 1"), "\(refused.error)")
        #expect(!FileManager.default.fileExists(atPath: marker))
        #expect(try exchange(daemon.socketPath, [helloWithAcks, events[0]]).acks == [1])

        // A plugin directory others may write is refused.
        chmod(plugins, 0o777)
        try configure(ingest: "gate")
        let unsafe = try daemon.whenctl(["reload"])
        #expect(unsafe.status == 1 && unsafe.error.contains("others may write it"), "\(unsafe.error)")
        chmod(plugins, 0o755)
        #expect(daemon.stop() == 0)

        // The journal: the changed event without its secrets but with its trusted fields, the
        // screen; not the dropped or the rejected one.
        let records = daemon.records()
        #expect(records.map { $0["name"] as? String } == ["changeEmail", "Settings", "escaped", "changeEmail"])
        let journalText = try runCommand(executable("whenctl"), ["cat", "--state-dir", daemon.stateDirectory]).output
        #expect(!journalText.contains("ann@example.com") && !journalText.contains("password"))
        #expect(!journalText.contains("escaped@x.com"), "\(journalText)")
        #expect((records[0]["params"] as? [String: Any])?["step"] as? Int == 1)
        #expect(records[0]["_pid"] as? Int == Int(getpid()) && records[0]["_comm"] != nil)
    }

    @Test func aPluginThatWillNotStartStopsTheDaemonFromStarting() throws {
        let builtPlugins = (executable("whend") as NSString).deletingLastPathComponent
        let directory = scratchDirectory("plugin-bad")
        let r = try runCommand(
            executable("whend"),
            [
                "--socket", directory + "/events.sock", "--state-dir", directory + "/state",
            ],
            environment: ["WHEND_PLUGIN_DIRS": builtPlugins, "WHEND_INGEST": "redact"])
        #expect(r.status == 1)
        #expect(r.error.contains("plugin redact would not start") && r.error.contains("fields"), "[\(r.error)]")
    }
}

/// A daemon (not started) with one pipeline, `pipeline`, of the C fixture `plugin`
/// (Tests/Fixtures/`plugin`.c, built for it into its plugin directory), then `settings`.
func fixturePipelineDaemon(
    _ name: String, plugin: String, pipeline: String, settings: String = "", _ mode: DaemonMode = .inProcess
) throws -> TestDaemon {
    let daemon = TestDaemon(name, mode)
    let plugins = try pluginDirectory(in: daemon.directory)
    _ = try buildTestPlugin(plugin, into: plugins, name: plugin)
    let config = daemon.directory + "/whend.conf"
    try "plugin_dirs = \(plugins)\npipeline.\(pipeline) = \(plugin)\n\(settings)".write(
        toFile: config, atomically: true, encoding: .utf8)
    daemon.environment = ["WHEND_CONFIG": config]
    return daemon
}

/// A daemon with one pipeline, `rec`, of the C recorder plugin.
func pipelineDaemon(_ name: String, settings: String = "", _ mode: DaemonMode = .inProcess) throws -> (
    TestDaemon, seen: String
) {
    let daemon = try fixturePipelineDaemon(name, plugin: "recorder", pipeline: "rec", settings: settings, mode)
    let state = daemon.stateDirectory + "/plugins/recorder"
    try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
    return (daemon, state + "/seen")
}

extension TestDaemon {
    /// The pipeline's entry in `whenctl status`.
    func pipeline(_ name: String) throws -> [String: Any]? {
        (try status()["pipelines"] as? [[String: Any]])?.first { $0["name"] as? String == name }
    }

    /// Waits until every pipeline has handled every record in the journal, the records they
    /// derived included: two answers of `status` in a row in which the journal's last `_seq`
    /// is the same and no cursor is behind it. What a pipeline would still do (derive, deliver:
    /// its cursor passes a record only then) is done; a test that checks something did not
    /// happen need not give it time to.
    func waitForPipelinesToCatchUp(seconds: Double = 60) throws -> Bool {
        var caughtUpAt: Int?
        return eventually(seconds) {
            guard let status = try? status(), let last = (status["journal"] as? [String: Any])?["last_seq"] as? Int,
                let pipelines = status["pipelines"] as? [[String: Any]],
                pipelines.allSatisfy({ ($0["cursor"] as? Int ?? -1) >= last })
            else {
                caughtUpAt = nil
                return false
            }
            defer { caughtUpAt = last }
            return caughtUpAt == last
        }
    }

    /// Waits until the pipeline's cursor reaches `seq`.
    func waitForPipeline(_ name: String, cursor seq: Int, seconds: Double = 60) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let cursor = try pipeline(name)?["cursor"] as? Int, cursor >= seq { return true }
            usleep(100_000)
        }
        return false
    }
}

func seenSeqs(_ path: String) -> [Int] {
    ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { Int($0) }
}

/// In order, at least once: every `_seq` from 1 to n appears, and the list only ever goes back
/// to repeat (after a restart), never forward past one it has not seen.
func isInOrderAtLeastOnce(_ seqs: [Int], upTo n: Int) -> Bool {
    var highest = 0
    for seq in seqs {
        if seq > highest + 1 { return false }
        highest = max(highest, seq)
    }
    return highest == n && Set(seqs) == Set(1...n)
}

/// 500 `when` events named `name` on each of `connections` connections in turn, each acked.
private func sendWhens(_ daemon: TestDaemon, named name: String, connections: Int) throws {
    for part in 0..<connections {
        let events = (1...500).map { #"{"type":"when","name":"\#(name)","id":"\#(part)-\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 500)
    }
}

@Suite(.serialized) struct PipelineTests {
    /// A C plugin that segfaults on _seq 1000: ingestion goes on, the worker restarts from its
    /// cursor, and the pipeline sees every record, in order, at least once.
    @Test func aPluginThatCrashesOnItsThousandthRecordLosesNothing() throws {
        let (daemon, seen) = try pipelineDaemon("pipe-crash", settings: #"plugin.recorder = {"crash_at": 1000}"#)
        try daemon.start()
        try sendWhens(daemon, named: "tap", connections: 6)
        #expect(try daemon.waitForPipeline("rec", cursor: 3000))
        let pipeline = try daemon.pipeline("rec")
        #expect((pipeline?["restarts"] as? Int ?? 0) >= 1)
        #expect(daemon.log.contains("killed by signal 11"))
        let seqs = seenSeqs(seen)
        #expect(isInOrderAtLeastOnce(seqs, upTo: 3000), "\(seqs.count) seen")
        #expect(daemon.stop() == 0)
    }

    /// A worker that crashes handles again the records after its saved cursor, and derives
    /// again from them: each record's derived records are appended once all the same.
    @Test func derivedRecordsAreNotAppendedTwiceAfterAWorkerRestart() throws {
        let (daemon, _) = try pipelineDaemon("pipe-derive", settings: #"plugin.recorder = {"crash_at": 1000}"#)
        try daemon.start()
        try sendWhens(daemon, named: "derive", connections: 4)
        // 2000 events, each deriving one record: the pipeline ends at 4000.
        #expect(try daemon.waitForPipeline("rec", cursor: 4000))
        #expect(daemon.log.contains("killed by signal 11"))
        #expect(daemon.stop() == 0)
        let derived = daemon.records().filter { $0["_origin"] as? String == "recorder" }
        #expect(derived.count == 2000)
        #expect(Set(derived.compactMap { $0["_cause"] as? Int }).count == 2000)
    }

    /// whend SIGKILLed while a pipeline derives: the worker restarts from its saved cursor and
    /// derives again what whend had already appended after it; whend finds those in the
    /// journal at start and appends each derived record once.
    @Test func derivedRecordsAreNotAppendedTwiceAfterTheDaemonIsKilled() throws {
        let (daemon, _) = try pipelineDaemon("pipe-kill-derive", .live)
        try daemon.start()
        for part in 0..<10 {
            let events = (1...1000).map { #"{"type":"when","name":"derive","id":"\#(part)-\#($0)"}"# }
            #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 1000)
        }
        let deadline = Date().addingTimeInterval(20)
        while daemon.records().filter({ $0["_origin"] != nil }).count < 500 && Date() < deadline { usleep(20_000) }
        daemon.crash()
        try daemon.start()
        #expect(try daemon.waitForPipeline("rec", cursor: 20_000))
        #expect(daemon.stop() == 0)
        let derived = daemon.records().filter { $0["_origin"] as? String == "recorder" }
        #expect(derived.count == 10_000)
        let causes = Set(derived.compactMap { $0["_cause"] as? Int })
        #expect(causes.count == 10_000)
        #expect(derived.allSatisfy { $0["_pipeline"] as? String == "rec" })
    }

    /// A plugin that hangs: the worker stops reporting, the watchdog kills it, and the new
    /// worker goes on from the cursor.
    @Test func aWorkerThatHangsIsKilledByItsWatchdogAndResumes() throws {
        let (daemon, seen) = try pipelineDaemon(
            "pipe-hang", settings: "pipeline_watchdog = 1\nplugin.recorder = {\"hang_at\": 20}")
        try daemon.start()
        let events = (1...40).map { #"{"type":"when","name":"tap","id":"h\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 40)
        #expect(try daemon.waitForPipeline("rec", cursor: 40, seconds: 30))
        #expect(daemon.log.contains("silent for"))
        #expect(isInOrderAtLeastOnce(seenSeqs(seen), upTo: 40))
        #expect(daemon.stop() == 0)
    }

    /// A destination that is down: the pipeline retries and does not move on; whend restarts;
    /// when the destination is back, the pipeline catches up from its cursor. Derived records
    /// land in the journal with their origin and cause.
    @Test func aPipelineWhoseDestinationIsDownCatchesUpAcrossARestart() throws {
        let (daemon, seen) = try pipelineDaemon("pipe-down")
        let down = (seen as NSString).deletingLastPathComponent + "/down"
        #expect(FileManager.default.createFile(atPath: down, contents: nil))
        try daemon.start()
        let first = (1...50).map { #"{"type":"when","name":"tap","id":"a\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + first).acks.last == 50)
        #expect(eventually { ((try? daemon.pipeline("rec"))??["failures"] as? Int ?? 0) > 0 })
        let stuck = try daemon.pipeline("rec")
        #expect(stuck?["cursor"] as? Int == 0)
        #expect((stuck?["failures"] as? Int ?? 0) > 0)
        #expect(stuck?["lag"] as? Int == 50)
        #expect(try daemon.whenctl(["metrics"]).output.contains(#"whend_pipeline_lag_records{pipeline="rec"} 50"#))
        #expect(daemon.stop() == 0)

        try daemon.start()
        let second =
            (1...49).map { #"{"type":"when","name":"tap","id":"b\#($0)"}"# } + [#"{"type":"when","name":"derive"}"#]
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + second).acks.last == 50)
        unlink(down)
        // 100 records, then the derived one (seen by the pipeline like any other).
        #expect(try daemon.waitForPipeline("rec", cursor: 101))
        #expect(seenSeqs(seen) == Array(1...101))
        #expect(daemon.stop() == 0)
        let derived = daemon.records().first { $0["name"] as? String == "derived" }
        #expect(derived?["_origin"] as? String == "recorder")
        #expect(derived?["_cause"] as? Int == 100)
        #expect(derived?["_seq"] as? Int == 101)
    }

    /// With a retry limit, a record that always fails goes to the dead letters and the
    /// pipeline moves on.
    @Test func aRecordThatAlwaysFailsGoesToTheDeadLettersAfterTheRetryLimit() throws {
        let (daemon, seen) = try pipelineDaemon("pipe-dead", settings: "pipeline_retry_limit = 3")
        try daemon.start()
        let events = [
            #"{"type":"when","name":"tap"}"#, #"{"type":"when","name":"poison"}"#, #"{"type":"when","name":"tap"}"#,
        ]
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 3)
        #expect(try daemon.waitForPipeline("rec", cursor: 3))
        #expect(seenSeqs(seen) == [1, 3])
        let dead = try String(
            contentsOfFile: daemon.stateDirectory + "/pipelines/rec/dead-letter.jsonl", encoding: .utf8)
        #expect(dead.contains(#""_seq":2"#) && dead.contains("cannot digest this record") && dead.contains("poison"))
        #expect(try daemon.pipeline("rec")?["dead_letters"] as? Int == 1)
        #expect(daemon.stop() == 0)
    }

    /// `unload` stops routing to a plugin without closing it: its pipeline waits at its
    /// cursor; `load` routes to it again and the pipeline catches up.
    @Test func unloadStopsRoutingAndLoadResumesFromTheCursor() throws {
        let (daemon, seen) = try pipelineDaemon("pipe-unload")
        try daemon.start()
        #expect(try daemon.whenctl(["plugins", "unload", "recorder"]).status == 0)
        #expect(try daemon.whenctl(["plugins"]).output.contains("recorder unloaded"))
        let events = (1...5).map { #"{"type":"when","name":"tap","id":"u\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 5)
        usleep(500_000)
        #expect(seenSeqs(seen).isEmpty)
        #expect(try daemon.whenctl(["plugins", "load", "recorder"]).status == 0)
        #expect(try daemon.waitForPipeline("rec", cursor: 5))
        #expect(seenSeqs(seen) == [1, 2, 3, 4, 5])
        #expect(try daemon.whenctl(["plugins", "unload", "nosuch"]).status == 1)
        #expect(daemon.stop() == 0)
    }

    /// `load` of a plugin whose library is not installed says so and fails: its built-in
    /// pipeline is off, and would stay off (it answered that the plugin was loaded).
    @Test func loadingAPluginThatIsNotInstalledFails() throws {
        let empty = scratchDirectory("no-plugins")
        chmod(empty, 0o755)
        let daemon = TestDaemon(
            "load-missing", arguments: ["--builtin-pipelines", "true", "--plugin-dirs", empty])
        try daemon.start()
        defer { daemon.stop() }
        #expect(try daemon.whenctl(["plugins", "unload", "analytics"]).status == 0)
        let load = try daemon.whenctl(["plugins", "load", "analytics"])
        #expect(load.status == 1, "\(load)")
        #expect(load.error.contains("cannot be loaded") && load.error.contains(empty), "\(load)")
    }
}
