import Foundation
import Testing

/// The shared pipeline host, seen from outside: which pipelines share it, and what its death,
/// or another pipeline's, does to them. (Killing a built-in pipeline's worker kills the host:
/// KillTimingTests and SnapshotTests check, over seeded kill schedules, that its pipelines
/// still derive what a replay derives.)
@Suite(.serialized) struct PipelineHostTests {
    /// The built-in pipelines and a fixture plugin's (Tests/Fixtures/chatty.c, which aborts its
    /// process on a record named "crash"), with `settings` added.
    func mixedDaemon(_ name: String, settings: String = "") throws -> DaemonProcess {
        let daemon = DaemonProcess(name, arguments: ["--builtin-pipelines", "true"])
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildTestPlugin("chatty", into: plugins, name: "chatty")
        let built = (executable("whend") as NSString).deletingLastPathComponent
        let config = daemon.directory + "/whend.conf"
        try """
        plugin_dirs = \(plugins):\(built)
        pipeline.chat = chatty
        plugin.chatty = {"quiet": true}
        pipeline_retry_limit = 2
        \(settings)
        """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/chatty", withIntermediateDirectories: true)
        return daemon
    }

    /// Each running pipeline's worker pid, by pipeline, once all of `names` run.
    func workers(_ daemon: DaemonProcess, _ names: Set<String>) -> [String: Int] {
        var pids: [String: Int] = [:]
        _ = eventually {
            let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]] ?? []
            pids = [:]
            for p in pipelines where p["state"] as? String == "running" {
                if let name = p["name"] as? String, let pid = p["pid"] as? Int, pid > 0 { pids[name] = pid }
            }
            return names.isSubset(of: pids.keys)
        }
        return pids
    }

    func restarts(_ daemon: DaemonProcess, _ name: String) -> Int {
        ((try? daemon.status())?["pipelines"] as? [[String: Any]])?.first { $0["name"] as? String == name }?[
            "restarts"] as? Int ?? -1
    }

    static let builtins: Set<String> = ["screens", "analytics", "crashes", "sessions"]

    /// The four built-in pipelines run in one process, not whend's; a plugin whend did not
    /// build runs in a process of its own, and when it crashes (here, until its record goes to
    /// the dead letters) the shared host's pipelines neither die nor restart, and go on.
    @Test func aCrashOfAnIsolatedPluginLeavesTheSharedHostsPipelinesRunning() throws {
        let daemon = try mixedDaemon("host-isolated")
        try daemon.start()
        defer { daemon.stop() }
        let whend = Int(try #require(daemon.process?.processIdentifier))
        let before = workers(daemon, Self.builtins.union(["chat"]))
        let host = try #require(before["screens"])
        #expect(Self.builtins.allSatisfy { before[$0] == host }, "\(before)")
        #expect(host != whend && before["chat"] != host && before["chat"] != whend, "\(before)")
        let events = [
            #"{"type":"when","name":"tap","id":"a"}"#, #"{"type":"when","name":"crash","id":"b"}"#,
            #"{"type":"when","name":"tap","id":"c"}"#,
        ]
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 3)
        // The chat worker died on "crash" twice; the next one wrote it to the dead letters.
        let deadLetters = daemon.stateDirectory + "/pipelines/chat/dead-letter.jsonl"
        #expect(
            eventually(30) { (try? String(contentsOfFile: deadLetters, encoding: .utf8))?.contains("crash") == true },
            "\(daemon.log.suffix(2000))")
        #expect(try daemon.waitForPipeline("chat", cursor: 3, seconds: 30))
        #expect(restarts(daemon, "chat") >= 2)
        for name in Self.builtins {
            #expect(try daemon.waitForPipeline(name, cursor: 3, seconds: 30), "\(name)")
            #expect(restarts(daemon, name) == 0, "\(name): \(daemon.log.suffix(2000))")
        }
        let after = workers(daemon, Self.builtins)
        #expect(Self.builtins.allSatisfy { after[$0] == host }, "the shared host changed: \(before) → \(after)")
        #expect(!daemon.log.contains("shared pipeline host \(host) killed"), "\(daemon.log.suffix(2000))")
    }

    /// `isolation.chatty = shared` puts the fixture in the shared host: its crash is then every
    /// shared pipeline's, and each restarts from its cursor in a new host and goes on.
    @Test func aPluginConfiguredSharedRunsInTheHostAndItsCrashRestartsIt() throws {
        let daemon = try mixedDaemon("host-shared", settings: "isolation.chatty = shared")
        try daemon.start()
        defer { daemon.stop() }
        let before = workers(daemon, Self.builtins.union(["chat"]))
        let host = try #require(before["screens"])
        #expect(before["chat"] == host, "\(before)")
        let events = [#"{"type":"when","name":"crash","id":"b"}"#, #"{"type":"when","name":"tap","id":"c"}"#]
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 2)
        for name in Self.builtins.union(["chat"]) {
            #expect(try daemon.waitForPipeline(name, cursor: 2, seconds: 30), "\(name): \(daemon.log.suffix(2000))")
        }
        #expect(restarts(daemon, "screens") >= 1)
        let after = workers(daemon, Self.builtins.union(["chat"]))
        #expect(after["screens"] != host && Set(after.values).count == 1, "\(before) → \(after)")
    }

    /// A reload that changes one shared pipeline (its plugin's configuration) stops it alone
    /// and starts it anew in the same host: the others keep running and never restart.
    @Test func aReloadStopsOneSharedPipelineAlone() throws {
        let daemon = try mixedDaemon("host-reload")
        try daemon.start()
        defer { daemon.stop() }
        let before = workers(daemon, Self.builtins)
        let host = try #require(before["screens"])
        let config = try #require(daemon.environment["WHEND_CONFIG"])
        let text = try String(contentsOfFile: config, encoding: .utf8)
        try (text + "\nplugin.analytics = {\"flush_interval\": 0.5}\n").write(
            toFile: config, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0 && reload.output.contains("plugin.analytics"), "\(reload)")
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"tap"}"#]).acks.last == 1)
        for name in Self.builtins {
            #expect(try daemon.waitForPipeline(name, cursor: 1, seconds: 30), "\(name)")
            #expect(restarts(daemon, name) == 0, "\(name): \(daemon.log.suffix(2000))")
        }
        let after = workers(daemon, Self.builtins)
        #expect(Self.builtins.allSatisfy { after[$0] == host }, "\(before) → \(after)")
        #expect(!daemon.log.contains("killing the shared pipeline host"), "\(daemon.log.suffix(2000))")
        #expect(!daemon.log.contains("worker killed"), "\(daemon.log.suffix(2000))")
    }
}
