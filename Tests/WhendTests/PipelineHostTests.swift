import Foundation
import Testing

/// The shared pipeline host, seen from outside: which pipelines share it, and what its death,
/// or another pipeline's, does to them. (Killing a built-in pipeline's worker kills the host:
/// KillTimingTests and SnapshotTests check, over seeded kill schedules, that its pipelines
/// still derive what a replay derives.)
@Suite(.serialized) struct PipelineHostTests {
    /// The built-in pipelines and a fixture plugin's (Tests/Fixtures/chatty.c, which aborts its
    /// process on a record named "crash"), with `settings` added.
    /// Live unless a test says: what the workers and the host log is on whend's standard error.
    func mixedDaemon(
        _ name: String, retryLimit: Int = 2, settings: String = "", _ mode: DaemonMode = .live
    ) throws -> TestDaemon {
        let daemon = TestDaemon(name, arguments: ["--builtin-pipelines", "true"], mode)
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildTestPlugin("chatty", into: plugins, name: "chatty")
        let built = (executable("whend") as NSString).deletingLastPathComponent
        let config = daemon.directory + "/whend.conf"
        try """
        plugin_dirs = \(plugins):\(built)
        pipeline.chat = chatty
        plugin.chatty = {"quiet": true}
        pipeline_retry_limit = \(retryLimit)
        \(settings)
        """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/chatty", withIntermediateDirectories: true)
        return daemon
    }

    /// Each running pipeline's worker pid, by pipeline, once all of `names` run.
    func workers(_ daemon: TestDaemon, _ names: Set<String>) -> [String: Int] {
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

    func restarts(_ daemon: TestDaemon, _ name: String) -> Int {
        ((try? daemon.status())?["pipelines"] as? [[String: Any]])?.first { $0["name"] as? String == name }?[
            "restarts"] as? Int ?? -1
    }

    static let builtins: Set<String> = ["screens", "analytics", "crashes", "sessions"]

    /// Waits until every built-in pipeline has read through `cursor`, and checks that none of
    /// them restarted and that they all still run in `host` (`before` is for the message).
    func expectBuiltinsUndisturbed(
        _ daemon: TestDaemon, through cursor: Int, host: Int, before: [String: Int],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        for name in Self.builtins {
            #expect(
                try daemon.waitForPipeline(name, cursor: cursor, seconds: 30), "\(name)", sourceLocation: sourceLocation
            )
            #expect(
                restarts(daemon, name) == 0, "\(name): \(daemon.log.suffix(2000))", sourceLocation: sourceLocation)
        }
        let after = workers(daemon, Self.builtins)
        #expect(
            Self.builtins.allSatisfy { after[$0] == host }, "the shared host changed: \(before) → \(after)",
            sourceLocation: sourceLocation)
    }

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
        try expectBuiltinsUndisturbed(daemon, through: 3, host: host, before: before)
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
        try expectBuiltinsUndisturbed(daemon, through: 1, host: host, before: before)
        #expect(!daemon.log.contains("killing the shared pipeline host"), "\(daemon.log.suffix(2000))")
        #expect(!daemon.log.contains("worker killed"), "\(daemon.log.suffix(2000))")
    }

    /// Whose plugin killed the shared host is not known: a pipeline that had a record in hand
    /// (here recorder, stuck on _seq 1) is not charged with the death, and handles that record
    /// again in a process of its own; the one whose plugin crashes (chatty, on _seq 2) crashes
    /// there alone, and with pipeline_retry_limit = 1 its record goes to its dead letters. Both
    /// go back to the host. (Charged with the host's death, recorder's _seq 1 went to its dead
    /// letters: a record lost to a pipeline that never failed on it.)
    @Test func aHostsDeathIsNotChargedToAnotherPipelinesRecord() throws {
        let daemon = try mixedDaemon(
            "host-quarantine", retryLimit: 1,
            settings: """
                isolation.chatty = shared
                isolation.recorder = shared
                pipeline.rec = recorder
                plugin.recorder = {"hang_at": 1}
                """)
        let plugins = daemon.directory + "/plugins"
        _ = try buildTestPlugin("recorder", into: plugins, name: "recorder")
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/recorder", withIntermediateDirectories: true)
        try daemon.start()
        defer { daemon.stop() }
        let before = workers(daemon, ["chat", "rec", "screens"])
        #expect(before["chat"] == before["screens"] && before["rec"] == before["screens"], "\(before)")
        #expect(
            try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"tap","id":"a"}"#]).acks.last == 1)
        // recorder stuck on _seq 1 before chatty meets _seq 2.
        #expect(eventually { FileManager.default.fileExists(atPath: daemon.stateDirectory + "/plugins/recorder/hung") })
        #expect(
            try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"crash","id":"b"}"#]).acks.last == 1
        )
        #expect(try daemon.waitForPipeline("rec", cursor: 2, seconds: 30), "\(daemon.log.suffix(3000))")
        #expect(try daemon.waitForPipeline("chat", cursor: 2, seconds: 30), "\(daemon.log.suffix(3000))")
        let deadLetters = { (pipeline: String) in
            (try? String(
                contentsOfFile: daemon.stateDirectory + "/pipelines/\(pipeline)/dead-letter.jsonl", encoding: .utf8))
                ?? ""
        }
        #expect(deadLetters("rec").isEmpty, "recorder's record was charged: \(deadLetters("rec"))")
        #expect(deadLetters("chat").contains("\"crash\""), "\(daemon.log.suffix(3000))")
        let seen =
            (try? String(contentsOfFile: daemon.stateDirectory + "/plugins/recorder/seen", encoding: .utf8)) ?? ""
        #expect(seen.split(separator: "\n") == ["1", "2"], "\(seen)")
        #expect(daemon.log.contains("pipeline rec: the shared pipeline host died while it handled _seq 1"))
        // Back in one host, a new one.
        var after: [String: Int] = [:]
        #expect(
            eventually(30) {
                after = workers(daemon, ["chat", "rec", "screens"])
                return Set(after.values).count == 1
            }, "\(after)")
        #expect(after["screens"] != before["screens"])
    }

    /// A built-in plugin's name is not trust: a library called otlp found first in another
    /// plugin directory (here the chatty fixture) runs in a process of its own.
    @Test func aLibraryNamedLikeABuiltinElsewhereIsNotTrusted() throws {
        let daemon = try mixedDaemon("host-spoof", settings: "pipeline.spoof = otlp", .inProcess)
        _ = try buildTestPlugin("chatty", into: daemon.directory + "/plugins", name: "otlp")
        try daemon.start()
        defer { daemon.stop() }
        let pids = workers(daemon, Self.builtins.union(["spoof"]))
        #expect(pids["spoof"] != nil && pids["spoof"] != pids["screens"], "\(pids)")
    }

    /// A plugin's library replaced (an upgrade: a new file renamed over the old) and whend
    /// reloaded: the pipeline runs the new file, in a new host (the running one would have
    /// answered its dlopen with the old code, and derived what a replay no longer derives).
    @Test func aReplacedLibraryIsLoadedByANewHost() throws {
        let daemon = try mixedDaemon("host-upgrade", settings: "isolation.chatty = shared", .inProcess)
        try daemon.start()
        defer { daemon.stop() }
        let before = workers(daemon, ["chat", "screens"])
        let host = try #require(before["chat"])
        #expect(before["screens"] == host)
        let plugins = daemon.directory + "/plugins"
        let upgrade = daemon.directory + "/upgrade"
        try FileManager.default.createDirectory(atPath: upgrade, withIntermediateDirectories: true)
        let built = try buildTestPlugin("chatty", into: upgrade, name: "chatty")
        #expect(rename(built, plugins + "/libchatty.so") == 0)
        let reload = try daemon.whenctl(["reload"])
        // Said so (it said "nothing changed" while the pipeline restarted).
        #expect(
            reload.status == 0 && reload.output.contains("pipeline chat: a plugin library was replaced; restarted"),
            "\(reload)")
        var after: [String: Int] = [:]
        #expect(
            eventually(30) {
                after = workers(daemon, ["chat", "screens"])
                return after["chat"] != host && after["screens"] == after["chat"]
            }, "\(before) → \(after)")
        // Its plugin loaded there (once its thread started), from the file now at the path.
        var chatty: [Substring] = []
        #expect(
            eventually {
                // Read to its end: /proc's files say they are empty, and a read by their size stops short.
                let file = FileHandle(forReadingAtPath: "/proc/\(after["chat"] ?? 0)/maps")
                let maps = String(decoding: file?.readDataToEndOfFile() ?? Data(), as: UTF8.self)
                chatty = maps.split(separator: "\n").filter { $0.contains("libchatty.so") }
                return !chatty.isEmpty
            }, "\(after)")
        #expect(chatty.allSatisfy { !$0.contains("(deleted)") }, "\(chatty)")
    }

    /// whend SIGKILLed while a shared pipeline is stuck in its plugin: the host does not run on
    /// without it (for ever, or for the seconds its pipelines take to stop, saving cursors beside
    /// the next whend's), but exits at once.
    @Test func anOrphanedHostExitsEvenWithAPipelineStuck() throws {
        let daemon = try mixedDaemon(
            "host-orphan",
            settings: "isolation.recorder = shared\npipeline.rec = recorder\nplugin.recorder = {\"hang_at\": 1}")
        _ = try buildTestPlugin("recorder", into: daemon.directory + "/plugins", name: "recorder")
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/recorder", withIntermediateDirectories: true)
        try daemon.start()
        let host = try #require(workers(daemon, ["rec", "screens"])["rec"])
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"tap"}"#]).acks.last == 1)
        // Stuck: recorder's marker says it hangs.
        #expect(eventually { FileManager.default.fileExists(atPath: daemon.stateDirectory + "/plugins/recorder/hung") })
        daemon.crash()
        // At once: its pipelines must not go on beside those of the next whend, on the same files.
        #expect(eventually(2) { kill(pid_t(host), 0) != 0 }, "the host \(host) outlived whend")
        if kill(pid_t(host), 0) == 0 { kill(pid_t(host), SIGKILL) }
    }

    /// A plugin that kills the host with no record in hand (here: in its create) is never
    /// caught by a record. After three such deaths in a row, the host's pipelines run in
    /// processes of their own: the culprit crashes only itself, and the built-ins go on.
    @Test func aHostThatKeepsDyingWithNoRecordInHandSplitsUp() throws {
        let daemon = try mixedDaemon(
            "host-split",
            settings:
                "isolation.recorder = shared\npipeline.rec = recorder\nplugin.recorder = {\"create_crashes\":true}")
        _ = try buildTestPlugin("recorder", into: daemon.directory + "/plugins", name: "recorder")
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/recorder", withIntermediateDirectories: true)
        try daemon.start()
        defer { daemon.stop() }
        #expect(
            eventually(30) { daemon.log.contains("pipeline screens: the shared pipeline host died 3 times in a row") },
            "\(daemon.log.suffix(3000))")
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"tap"}"#]).acks.last == 1)
        #expect(try daemon.waitForPipeline("screens", cursor: 1, seconds: 30))
        // Alone, screens no longer dies with the host: its restarts stay put.
        let restartsThen = restarts(daemon, "screens")
        usleep(3_000_000)
        #expect(restarts(daemon, "screens") == restartsThen, "\(daemon.log.suffix(2000))")
        let pids = workers(daemon, ["screens", "crashes"])
        #expect(pids["screens"] != pids["crashes"], "\(pids)")
    }
}
