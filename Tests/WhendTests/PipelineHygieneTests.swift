import Foundation
import Testing

/// The pipeline workers as other local users and the service manager see them.
@Suite(.serialized) struct PipelineHygieneTests {
    /// Plugin configuration (a write key) never reaches a worker's command line, which every
    /// local user can read in /proc/PID/cmdline; the worker gets it over a pipe.
    @Test func aPluginsSecretIsNotOnTheWorkersCommandLine() throws {
        let directory = scratchDirectory("secret-conf")
        let secret = "wk-\(UInt32.random(in: 0...UInt32.max))"
        try """
        plugin.analytics = {"write_key": "\(secret)", "endpoint": "http://127.0.0.1:9/v1/batch"}
        """.write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live(
            "secret", arguments: ["--builtin-pipelines", "true", "--config", directory + "/whend.conf"])
        try daemon.start()
        var workers: [Int] = []
        #expect(
            eventually {
                let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]] ?? []
                workers = pipelines.compactMap { $0["pid"] as? Int }.filter { $0 > 0 }
                return workers.count == 4
            })
        for pid in workers {
            let cmdline = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
            #expect(!cmdline.isEmpty)
            #expect(!String(decoding: cmdline, as: UTF8.self).contains(secret), "worker \(pid)")
            let environ = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ"))) ?? Data()
            #expect(!String(decoding: environ, as: UTF8.self).contains(secret), "worker \(pid)")
        }
        #expect(daemon.stop() == 0)
    }

    /// A pipeline plugin runs in processes of its own, never in whend: not its `create` or
    /// `handle`, and not its library's constructors or entry point either. whend learnt a
    /// pipeline stage's roles and name by loading its library itself, at start and at every
    /// reload; the plugin check's process tells it now. The fixture's constructor writes the pid
    /// of every process that loads it.
    ///
    /// And a library that closes descriptors 3 and 4 (its own idea of free ones) at load closes
    /// nothing of the process that loads it: each library finds /dev/null there, the second one
    /// of a chain too. The plugin check started with 4 free: the runtime took it for its event
    /// poll, the check put /dev/null over it, and died of a trap (signal 4) when the runtime
    /// next polled.
    @Test func whendNeverLoadsAPipelinePluginsLibrary() throws {
        let daemon = TestDaemon.live("no-dlopen")
        let plugins = try pluginDirectory(in: daemon.directory)
        let marker = daemon.directory + "/loaded-by"
        for name in ["constructor", "careless"] {
            _ = try buildTestPlugin("constructor", into: plugins, name: name, defines: ["-DMARKER=\"\(marker)\""])
        }
        let config = daemon.directory + "/whend.conf"
        try "plugin_dirs = \(plugins)\npipeline.c = constructor, careless\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        defer { daemon.stop() }
        let whend = try #require(daemon.process?.processIdentifier)
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"a"}"#]).acks.last == 1)
        #expect(try daemon.whenctl(["plugins", "--wait", "--timeout", "30"]).status == 0)
        // A reload that changes the pipeline: checked and started again.
        try "plugin_dirs = \(plugins)\npipeline.c = constructor, careless\npipeline.d = constructor, careless\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "whenctl reload: \(reload.output)\(reload.error)\n\(daemon.log)")
        // The check at start, the worker, the check at reload, the new worker at least (each
        // worker loads its plugins once it has started), two libraries each.
        var loads: [Substring] = []
        #expect(
            eventually {
                loads = ((try? String(contentsOfFile: marker, encoding: .utf8)) ?? "").split(separator: "\n")
                return loads.count >= 8
            }, "\(loads)")
        let loaders = loads.compactMap { $0.split(separator: " ").first.flatMap { Int32($0) } }
        #expect(!loaders.contains(whend), "whend (pid \(whend)) loaded the pipeline plugin's library")
        // The runtime's event poll among them: one put over it, and the process died the next
        // time the runtime polled.
        #expect(loads.allSatisfy { !$0.contains(" polls=0 ") && $0.hasSuffix(" 3=null 4=null") }, "\(loads)")
    }

    /// A plugin that writes to and closes descriptors 3 and 4 in its `create` and in every
    /// `handle` (its own idea of free ones) reaches nothing of the process that runs it, in a
    /// worker of its own and in the shared host alike. Freed, they took the process's next
    /// descriptors: a journal segment (records skipped, logged as deleted by retention), the
    /// journal's inotify watch (the pipeline stalled for good, spinning), a cursor being saved
    /// (written over), and in the shared host the pipes to whend of a pipeline started next (the
    /// host killed; a frame written there was stored as a derived record).
    @Test(arguments: ["process", "shared"]) func aPluginClosingThreeAndFourInItsCallsDisturbsNothing(
        isolation: String
    ) throws {
        // Small segments: the reader opens a new one every few records.
        let daemon = TestDaemon.live("careless-\(isolation)", arguments: ["--segment-max-bytes", "4096"])
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildTestPlugin("careless", into: plugins, name: "careless")
        _ = try buildTestPlugin(
            "constructor", into: plugins, name: "constructor", defines: ["-DMARKER=\"\(daemon.directory)/loaded\""])
        let config = daemon.directory + "/whend.conf"
        let common =
            "plugin_dirs = \(plugins)\nisolation.careless = \(isolation)\nisolation.constructor = \(isolation)\n"
        try (common + "pipeline.c = careless\n").write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        defer { daemon.stop() }
        func whens(_ range: ClosedRange<Int>) -> [String] {
            range.map { #"{"type":"when","name":"w","id":"c\#($0)","pad":"\#(String(repeating: "x", count: 80))"}"# }
        }
        // A few at a time, each batch read as it comes: the segment being written stays open
        // in the worker across the plugin's calls.
        for first in stride(from: 1, through: 291, by: 10) {
            #expect(try exchange(daemon.socketPath, [helloWithAcks] + whens(first...first + 9)).acks.last == 10)
            usleep(30_000)
        }
        // Another pipeline, started by a reload while the careless one runs.
        try (common + "pipeline.c = careless\npipeline.d = constructor\n").write(
            toFile: config, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "\(reload.output)\(reload.error)")
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + whens(301...400)).acks.last == 100)
        #expect(try daemon.waitForPipelinesToCatchUp(seconds: 60), "\(daemon.log.suffix(3000))")
        let derived = daemon.records().filter { $0["_origin"] as? String == "careless" }.compactMap { $0["of"] as? Int }
        #expect(Set(derived).count == 400, "\(Set(derived).count) of 400 records derived from")
        for name in ["c", "d"] {
            let pipeline = try daemon.pipeline(name)
            #expect(pipeline?["restarts"] as? Int == 0, "pipeline \(name): \(daemon.log.suffix(3000))")
            #expect(pipeline?["skipped"] as? Int ?? 0 == 0, "pipeline \(name)")
            let cursor =
                (try? String(contentsOfFile: daemon.stateDirectory + "/pipelines/\(name)/cursor", encoding: .utf8))
                ?? ""
            #expect(
                cursor.allSatisfy { $0.isNumber || $0 == "\n" } && !cursor.isEmpty,
                "pipeline \(name)'s cursor: \(cursor)")
        }
        for sign in [
            "gone from the journal", "ends inside a frame", "killing the shared pipeline host", "cannot have derived",
        ] {
            #expect(!daemon.log.contains(sign), "\(sign): \(daemon.log.suffix(3000))")
        }
    }

    /// Ctrl-C in the terminal of `make run` sends SIGINT to every process of the foreground
    /// group: whend and its pipeline workers alike. whend stops them itself; a worker that died
    /// of the SIGINT first was logged "killed by signal 2; restarting" once a pipeline before
    /// the clean stop. Workers ignore SIGINT, and die of SIGTERM and SIGKILL as before.
    @Test func aCtrlCStopsWhendWithoutItsWorkersDyingFirst() throws {
        let daemon = TestDaemon.live("ctrl-c", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        var workers: [Int32] = []
        #expect(
            eventually {
                let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]] ?? []
                workers = pipelines.compactMap { $0["pid"] as? Int }.filter { $0 > 0 }.map { Int32($0) }
                return workers.count == 4
            })
        // As the terminal does: the workers first, then whend, all at once.
        for pid in workers { kill(pid, SIGINT) }
        usleep(200_000)
        #expect(workers.allSatisfy { kill($0, 0) == 0 }, "a worker died of SIGINT")
        #expect(daemon.stop(signal: SIGINT) == 0)
        #expect(!daemon.log.contains("killed by signal 2"), "\(daemon.log)")
        #expect(workers.allSatisfy { kill($0, 0) != 0 }, "a worker outlived whend")
    }

    /// A pipeline whose worker keeps failing waits longer and longer between restarts (up to
    /// 10 s); a graceful stop does not wait that out.
    @Test func aStopDoesNotWaitOutAPipelinesRestartBackoff() throws {
        let directory = scratchDirectory("backoff-conf")
        // Nowhere to send: analytics will not start, so its worker exits at once, again and again.
        try """
        pipeline.failing = analytics
        plugin.analytics = {"file": null}
        """.write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live(
            "backoff", arguments: ["--config", directory + "/whend.conf", "--shutdown-timeout", "3"])
        try daemon.start()
        #expect(daemon.waitForLog("restarting in 3.2 s", seconds: 20), "\(daemon.log)")
        let started = Date()
        #expect(daemon.stop() == 0)
        let took = Date().timeIntervalSince(started)
        #expect(took < 2, "the stop took \(took) s")
    }

    /// `whenctl plugins --wait` waits for a pipeline whose worker is being restarted too: it
    /// has not handled the journal (a worker is stopped and started again after a store of its
    /// derived records failed, and a script or test waiting for it went on while it was down).
    @Test func waitingForThePipelinesCountsOneWhoseWorkerIsRestarting() throws {
        let directory = scratchDirectory("wait-conf")
        // Nowhere to send: analytics will not start, so its worker exits at once, again and again.
        try """
        pipeline.failing = analytics
        plugin.analytics = {"file": null}
        """.write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live("wait", arguments: ["--config", directory + "/whend.conf"])
        try daemon.start()
        defer { daemon.stop() }
        let hello = #"{"hello":{"protocol":1,"app":"com.example.wait","acks":true}}"#
        _ = try exchange(daemon.socketPath, [hello, #"{"type":"when","name":"n","id":"w1"}"#])
        #expect(daemon.waitForLog("restarting in", seconds: 20), "\(daemon.log)")
        let wait = try daemon.whenctl(["plugins", "--wait", "--timeout", "1"])
        #expect(wait.status != 0, "\(wait.output)")
        #expect(wait.error.contains("still behind _seq 1") && wait.error.contains("failing at 0"), "\(wait.error)")
    }

    /// Every directory whend and its workers create is the daemon user's alone to write and can
    /// be entered, and each socket has its own mode, however the start-up's threads interleave
    /// (binding a socket once changed the whole process's umask, and the pipelines' directories
    /// created meanwhile came out world-writable and impossible to enter). Three starts, each
    /// with the four built-in pipelines creating their directories while the sockets are bound.
    @Test func theStateDirectoryAndSocketsKeepTheirModes() throws {
        for round in 1...3 {
            let daemon = TestDaemon.live("modes", arguments: ["--builtin-pipelines", "true"])
            try daemon.start()
            #expect(
                eventually {
                    let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]] ?? []
                    return pipelines.count == 4 && pipelines.allSatisfy { $0["state"] as? String == "running" }
                })
            let state = daemon.stateDirectory
            var directories = [state]
            // A worker makes its pipeline's and its plugins' directories once it has started.
            #expect(
                eventually {
                    directories = [state]
                    if let walker = FileManager.default.enumerator(atPath: state) {
                        for case let relative as String in walker {
                            var isDirectory: ObjCBool = false
                            if FileManager.default.fileExists(
                                atPath: state + "/" + relative, isDirectory: &isDirectory), isDirectory.boolValue
                            {
                                directories.append(state + "/" + relative)
                            }
                        }
                    }
                    return directories.count >= 9
                }, "\(directories)")
            for directory in directories {
                var st = stat()
                #expect(stat(directory, &st) == 0)
                let mode = st.st_mode & 0o777
                #expect(
                    mode & 0o700 == 0o700 && mode & 0o022 == 0,
                    "round \(round): \(directory) has mode \(String(mode, radix: 8))")
            }
            var st = stat()
            #expect(stat(daemon.directory + "/control.sock", &st) == 0 && st.st_mode & 0o777 == 0o600)
            #expect(daemon.stop() == 0)
        }
    }
}
