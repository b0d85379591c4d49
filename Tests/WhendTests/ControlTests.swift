import Foundation
import Testing
import WhendWire

@Suite(.serialized) struct ControlTests {
    @Test func statusAndMetricsDescribeTheRunningDaemon() throws {
        let daemon = TestDaemon("status")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#, #"{"type":"bogus"}"#])
        #expect(answers.acks.last == 2)
        let status = try daemon.status()
        #expect(status["pid"] as? Int == Int(daemon.pid))
        #expect(status["events_received"] as? Int == 1)
        #expect((status["events_rejected"] as? [String: Int])?["unknown_type"] == 1)
        #expect((status["journal"] as? [String: Any])?["last_seq"] as? Int == 1)
        let human = try daemon.whenctl(["status"])
        #expect(human.status == 0 && human.output.contains("last _seq 1") && human.output.contains("unknown_type 1"))

        let metrics = try daemon.whenctl(["metrics"])
        #expect(metrics.status == 0)
        for line in [
            "whend_events_received_total 1", "whend_events_stored_total 1",
            #"whend_events_rejected_total{code="unknown_type"} 1"#, "whend_journal_last_seq 1",
            "whend_commit_duration_seconds_count 1", "# TYPE whend_commit_duration_seconds histogram",
            "whend_connections 0",
        ] {
            #expect(metrics.output.contains(line), "no \(line) in\n\(metrics.output)")
        }
        #expect(metrics.output.contains("whend_journal_bytes "))
        daemon.stop()
    }

    /// What `whenctl metrics` prints is what Prometheus reads: Debian's `promtool check metrics`
    /// finds nothing to say, with traffic, a rejection and the built-in pipelines present, and
    /// every family whend exposes is there with its help and type.
    @Test func metricsAreWhatPromtoolChecksClean() throws {
        let daemon = TestDaemon("promtool", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        defer { daemon.stop() }
        let answers = try exchange(
            daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#, #"{"type":"bogus"}"#])
        #expect(answers.acks.last == 2)
        #expect(eventually { (try? daemon.pipeline("sessions")?["pid"] as? Int).map { $0 > 0 } ?? false })
        let metrics = try daemon.whenctl(["metrics"])
        #expect(metrics.status == 0)
        let file = daemon.directory + "/metrics.txt"
        try metrics.output.write(toFile: file, atomically: true, encoding: .utf8)
        let check = try runCommand("/bin/sh", ["-c", "exec promtool check metrics < '\(file)'"])
        #expect(
            check.status == 0 && check.output.isEmpty && check.error.isEmpty, "promtool: \(check.output)\(check.error)")
        for family in [
            "whend_bytes_received_total", "whend_events_received_total", "whend_events_stored_total",
            "whend_events_rejected_total", "whend_journal_bytes_written_total", "whend_replies_dropped_total",
            "whend_commit_duration_seconds", "whend_connections", "whend_pending_bytes", "whend_journal_last_seq",
            "whend_journal_bytes", "whend_journal_segments", "whend_pipeline_lag_records", "whend_pipeline_failures",
            "whend_pipeline_dead_letters", "whend_pipeline_restarts", "whend_pipeline_records_lost_to_retention_total",
        ] {
            #expect(metrics.output.contains("# HELP \(family) "), "no help for \(family)")
            #expect(metrics.output.contains("# TYPE \(family) "), "no type for \(family)")
        }
    }

    /// A reload applies what changed to connections that stay open, refuses an invalid file
    /// and keeps the configuration in force, and names what needs a restart.
    @Test func reloadAppliesChangesWithoutDroppingConnectionsAndRefusesBadOnes() throws {
        let daemon = TestDaemon.live("reload")  // SIGHUP
        let config = daemon.directory + "/whend.conf"
        try "durability = fsync\nsocket_mode = 0666\n".write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(helloWithAcks + "\n")
        for i in 1...5 { try connection.send(#"{"type":"when","name":"before","id":"b\#(i)"}"# + "\n") }

        try """
        durability = write
        socket_mode = 0660
        rate_limit = 1
        rate_burst = 2
        dedup_window = 10
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "\(reload.error)")
        #expect(reload.output.contains("durability: fsync → write") && reload.output.contains("rate_limit: 0 → 1"))
        #expect(reload.output.contains("dedup_window changed; it takes effect when whend restarts"))
        var st = stat()
        #expect(stat(daemon.socketPath, &st) == 0 && st.st_mode & 0o777 == 0o660)
        let status = try daemon.status()
        #expect((status["journal"] as? [String: Any])?["durability"] as? String == "write")

        // The connection opened before the reload is still served, under the new rate limit.
        for i in 1...10 { try connection.send(#"{"type":"when","name":"after","id":"a\#(i)"}"# + "\n") }
        connection.finishSending()
        var lines: [[String: Any]] = []
        try connection.receiveLines { line in
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { lines.append(o) }
        }
        #expect(lines.acks.last == 15)
        #expect(lines.errors.filter { $0.code == "rate_limited" }.count >= 7)

        // An invalid file is refused; what is in force stays.
        try "durability = sometimes\n".write(toFile: config, atomically: true, encoding: .utf8)
        let refused = try daemon.whenctl(["reload"])
        #expect(
            refused.status == 1 && refused.error.contains("durability")
                && refused.error.contains("fsync, write or none"))
        #expect(((try daemon.status())["journal"] as? [String: Any])?["durability"] as? String == "write")
        #expect(daemon.log.contains("the configuration in force stays"))
        // SIGHUP does the same as whenctl reload.
        try "durability = none\n".write(toFile: config, atomically: true, encoding: .utf8)
        kill(daemon.process!.processIdentifier, SIGHUP)
        #expect(daemon.waitForLog("reload (SIGHUP) applied"))
        #expect(((try daemon.status())["journal"] as? [String: Any])?["durability"] as? String == "none")
        #expect(daemon.stop() == 0)
    }

    /// The control socket checks who is asking (SO_PEERCRED), not only its file mode: even
    /// with the socket opened to everyone, another user is refused.
    @Test(.enabled(if: getuid() == 0, "needs root to act as another user"))
    func theControlSocketRefusesOtherUsersWhateverItsMode() throws {
        let daemon = TestDaemon("ctl-cred")
        try daemon.start()
        var st = stat()
        #expect(stat(daemon.controlPath, &st) == 0 && st.st_mode & 0o777 == 0o600)
        chmod(daemon.controlPath, 0o666)
        let r = try runCommand(
            "/usr/bin/setpriv",
            [
                "--reuid=65534", "--regid=65534", "--clear-groups", executable("whenctl"), "status", "--control",
                daemon.controlPath,
            ])
        #expect(r.status == 1)
        #expect(r.error.contains("uid 65534 may not control whend"))
        #expect(daemon.log.contains("refused a control connection from uid 65534"))
        // The daemon's own user is served.
        #expect(try daemon.whenctl(["status"]).status == 0)
        daemon.stop()
    }

    /// Control clients that connect and say nothing hold no more than a bounded number of
    /// descriptors, for a bounded time: events are accepted meanwhile, each idle client is told
    /// why it is closed, and control answers again once they are gone.
    @Test func idleControlClientsAreBoundedAndTimedOut() throws {
        let daemon = TestDaemon("ctl-idle")
        try daemon.start()
        defer { daemon.stop() }
        // A line longer than the limit, in one write, is refused whatever the timing.
        let long = try BlockingSocket(path: daemon.controlPath)
        try long.send(#"{"command":"status","x":""# + String(repeating: "a", count: 100_000) + "\"}\n")
        var longAnswer = ""
        try long.receiveLines { longAnswer = $0 }
        #expect(longAnswer.contains("the request is over 65536 bytes"), "\(longAnswer.prefix(200))")
        var idle: [BlockingSocket] = []
        for _ in 0..<100 { if let s = try? BlockingSocket(path: daemon.controlPath) { idle.append(s) } }
        // Events go on.
        let answers = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#])
        #expect(answers.acks.last == 1)
        // The first 64 idle clients are told, within the request timeout, and closed; the rest
        // were closed at once.
        var told = 0
        for connection in idle {
            guard connection.waitReadable(timeout: 15) else { continue }
            try connection.receiveLines { if $0.contains("no request within 10 s") { told += 1 } }
        }
        #expect(told == 64)
        #expect(try daemon.whenctl(["status"]).status == 0)
    }

    /// A control client connected when whend stops is told whend is stopping and that nothing
    /// was done, rather than finding its connection broken off.
    @Test func aControlClientMetByAStopIsToldNothingWasDone() throws {
        let daemon = TestDaemon("ctl-stopping")
        try daemon.start()
        let waiting = try BlockingSocket(path: daemon.controlPath).bounded()
        // Answered after the waiting client was accepted (connections are accepted in order).
        #expect(try daemon.whenctl(["status"]).status == 0)
        let stopped = DispatchSemaphore(value: 0)
        Thread {
            daemon.stop()
            stopped.signal()
        }.start()
        #expect(waiting.waitReadable(timeout: 20))
        var answer = ""
        try waiting.receiveLines { answer = $0 }
        #expect(answer.contains(#""ok":false"#) && answer.contains("whend is stopping; nothing was done"), "\(answer)")
        stopped.wait()
    }

    /// whenctl whose request whend took and then ended without an answer (as a stopping whend
    /// may) says so and that the request may not have been carried out; it does not say whend
    /// cannot be reached, nor send the user to another socket.
    @Test func whenctlSaysWhendEndedTheConnectionUnanswered() throws {
        let path = scratchDirectory("ctl-unanswered") + "/control.sock"
        let listener = try UnixTestListener(path: path)
        let served = DispatchSemaphore(value: 0)
        Thread {
            listener.resetOneConnectionOnceItAsks()
            served.signal()
        }.start()
        let r = try whenctl(["reload", "--control", path])
        served.wait()
        #expect(r.status == 1)
        #expect(
            r.error.contains("whend closed \(path) without answering (recv: Connection reset by peer)"), "\(r.error)")
        #expect(r.error.contains("what was asked was not done") && !r.error.contains("cannot reach"), "\(r.error)")
    }

    /// whenctl against a control socket that misbehaves, as a whend stopping, overloaded or
    /// not whend at all may: it answers and never closes, sends without end, answers and closes
    /// before the request is sent. whenctl reads one answer line, within its time, at most
    /// 16 MiB, and says what happened in one line.
    @Test func whenctlReadsOneAnswerLineWhateverThePeerDoes() throws {
        func against(_ serve: @escaping @Sendable (Int32) -> Void, _ arguments: [String]) throws -> (
            status: Int32, output: String, error: String
        ) {
            let path = scratchDirectory("ctl-peer") + "/control.sock"
            let listener = try UnixTestListener(path: path)
            let served = listener.serveOne(serve)
            let r = try whenctl(arguments + ["--control", path])
            served.wait()
            return r
        }
        @Sendable func write(_ fd: Int32, _ text: String) {
            _ = Array(text.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        }
        // An answer, then the connection held open (for up to 30 s) until whenctl has gone.
        let clientLeftFirst = Flag()
        let held = try against(
            { fd in
                write(fd, #"{"ok":true,"changed":[]}"# + "\n")
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                var byte: UInt8 = 0
                let deadline = Date().addingTimeInterval(30)
                while Date() < deadline, poll(&pfd, 1, 1000) >= 0 {
                    if pfd.revents & Int16(POLLHUP) != 0 {
                        clientLeftFirst.set()
                        break
                    }
                    _ = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
                }
                close(fd)
            }, ["reload"])
        #expect(held.status == 0 && held.output == "reloaded: nothing changed\n", "\(held)")
        #expect(clientLeftFirst.isSet)
        // More than 16 MiB without a line end.
        let endless = try against(
            { fd in
                let chunk = [UInt8](repeating: 0x61, count: 1 << 20)
                for _ in 0..<20
                where chunk.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) > 0 {}
                close(fd)
            }, ["status"])
        #expect(endless.status == 1 && endless.error.contains("longer than 16 MiB"), "\(endless.error.prefix(300))")
        // Told at once that whend is stopping, and closed, whether or not the request was sent.
        let stopping = try against(
            { fd in
                write(
                    fd, #"{"ok":false,"error":"whend is stopping; nothing was done (a reload was not applied)"}"# + "\n"
                )
                close(fd)
            }, ["reload"])
        #expect(stopping.status == 1 && stopping.error.contains("whend is stopping; nothing was done"), "\(stopping)")
    }

    /// What whend answers may quote a client's input: whenctl prints it as one line, control
    /// characters escaped, so no answer writes a second line or a terminal escape.
    @Test func whenctlPrintsWhendsAnswersAsOneLine() throws {
        let daemon = TestDaemon("ctl-esc")
        try daemon.start()
        defer { daemon.stop() }
        let r = try daemon.whenctl(["plugins", "unload", "x\nwhenctl plugins unload: OK\u{1B}[2J"])
        #expect(r.status == 1)
        #expect(r.error.split(separator: "\n").count == 1, "\(r.error)")
        #expect(!r.error.contains("\u{1B}") && r.error.contains("\\x0a"), "\(r.error)")
    }

    @Test func unknownCommandsAndGarbageGetAClearAnswer() throws {
        let daemon = TestDaemon("ctl-bad")
        try daemon.start()
        // The commands named for what is not a request; a version this whend does not speak,
        // and a command without what it needs, said so.
        let commands = "status, reload, metrics"
        for (request, says) in [
            (#"{"command":"explode"}"#, commands), ("not json", commands), (#"{"cmd":1}"#, commands),
            (#"{"command":"status","version":2}"#, "this whend speaks version 1"),
            (#"{"command":"load"}"#, #"{"command":"load","plugin":"NAME"}"#),
        ] {
            let connection = try BlockingSocket(path: daemon.controlPath)
            try connection.send(request + "\n")
            var reply: [String: Any]?
            try connection.receiveLines { line in
                reply = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            }
            #expect(reply?["ok"] as? Bool == false)
            #expect((reply?["error"] as? String)?.contains(says) == true, "\(request): \(String(describing: reply))")
        }
        #expect(try daemon.whenctl(["status"]).status == 0)
        daemon.stop()
    }
}

@Suite(.serialized) struct RateLimitTests {
    /// A process names itself (`prctl`), and the rate limit's summary quotes that name: it is
    /// escaped there, so a client cannot write a line of whend's log of its own.
    @Test func aSendersOwnNameCannotForgeALogLine() throws {
        let daemon = TestDaemon(
            "rate-comm",
            arguments: ["--rate-limit", "0.001", "--rate-burst", "1", "--rate-limit-report-interval", "0.5"])
        try daemon.start()
        defer { daemon.stop() }
        let script = """
            import ctypes, socket, sys
            ctypes.CDLL(None).prctl(15, b"a\\nFORGED critical", 0, 0, 0)
            s = socket.socket(socket.AF_UNIX)
            s.connect(sys.argv[1])
            s.sendall(b'{"hello":{"protocol":1,"app":"a","session":"s","acks":true}}\\n'
                + b''.join(b'{"type":"when","name":"x","id":"%d"}\\n' % i for i in range(5)))
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096): pass
            """
        let r = try runCommand("/usr/bin/python3", ["-c", script, daemon.socketPath])
        #expect(r.status == 0, "\(r.error)")
        #expect(daemon.waitForLog("rate limit: suppressed"))
        #expect(daemon.log.contains("(a\\x0aFORGED critic, uid"), "\(daemon.log)")
        #expect(!daemon.log.split(separator: "\n").contains { $0.hasPrefix("FORGED") }, "\(daemon.log)")
    }

    /// By default the limit is per process: two connections of one process share it.
    @Test func connectionsOfOneProcessShareItsAllowance() throws {
        let daemon = TestDaemon("rate-pid", arguments: ["--rate-limit", "0.001", "--rate-burst", "6"])
        try daemon.start()
        var stored = 0
        var limited = 0
        for connection in 0..<2 {
            var lines = [helloWithAcks]
            for i in 1...5 { lines.append(#"{"type":"when","name":"tap","id":"c\#(connection)-\#(i)"}"#) }
            let answers = try exchange(daemon.socketPath, lines)
            let refused = answers.errors.filter { $0.code == "rate_limited" }.count
            limited += refused
            stored += 5 - refused
        }
        #expect(stored == 6 && limited == 4)
        #expect(daemon.records().count == 6)
        daemon.stop()
    }

    /// What was suppressed is summed up on a timer, without the sender speaking again.
    @Test func suppressedEventsAreReportedOnATimer() throws {
        let daemon = TestDaemon(
            "rate-report",
            arguments: ["--rate-limit", "0.001", "--rate-burst", "1", "--rate-limit-report-interval", "0.5"])
        try daemon.start()
        var lines = [helloWithAcks]
        for i in 1...20 { lines.append(#"{"type":"when","name":"tap","id":"t\#(i)"}"#) }
        let answers = try exchange(daemon.socketPath, lines)
        #expect(answers.errors.filter { $0.code == "rate_limited" }.count == 19)
        #expect(daemon.waitForLog("rate limit: suppressed 19 event(s) from pid \(getpid())"))
        let metrics = try daemon.whenctl(["metrics"])
        #expect(metrics.output.contains(#"whend_events_rejected_total{code="rate_limited"} 19"#))
        daemon.stop()
    }

    @Test func perUserLimitsCountEveryProcessOfTheUser() throws {
        let daemon = TestDaemon(
            "rate-uid", arguments: ["--rate-limit", "0.001", "--rate-burst", "3", "--rate-limit-by", "uid"])
        try daemon.start()
        // This test process and a whenctl process: one user, one allowance of 3.
        var lines = [helloWithAcks]
        for i in 1...2 { lines.append(#"{"type":"when","name":"mine","id":"m\#(i)"}"#) }
        #expect(try exchange(daemon.socketPath, lines).errors.isEmpty)
        let emit = try runCommand(
            executable("whenctl"),
            ["emit", "--socket", daemon.socketPath, #"{"type":"when","name":"a"}"#, #"{"type":"when","name":"b"}"#])
        #expect(emit.status == 1 && emit.error.contains("rate_limited"))
        #expect(daemon.records().count == 3)
        daemon.stop()
    }
}

@Suite(.serialized) struct GracefulStopTests {
    /// SIGTERM in the middle of a stream with acks: every acked event is stored, nothing that
    /// was not acked is, every line whend read was acked or refused, and whend exits 0.
    @Test func sigtermDuringAStreamLosesNoAckedEvent() throws {
        for round in 0..<3 {
            let daemon = TestDaemon.live("stop-stream")  // SIGTERM mid-stream
            try daemon.start()
            let connection = try BlockingSocket(path: daemon.socketPath)
            try connection.send(helloWithAcks + "\n")
            let sender = Thread {
                for i in 1...200_000 {
                    let line = #"{"type":"when","name":"stream","id":"\#(i)","params":{"i":\#(i)}}"# + "\n"
                    if (try? connection.send(line)) == nil { return }
                }
            }
            sender.start()
            usleep(UInt32(100_000 + round * 150_000))
            kill(daemon.process!.processIdentifier, SIGTERM)
            var lastAck = 0
            var refused: Set<Int> = []
            try? connection.receiveLines { line in
                guard let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return }
                if let a = o["ack"] as? Int { lastAck = a }
                if let e = (o["error"] as? [String: Any])?["event"] as? Int { refused.insert(e) }
            }
            #expect(daemon.stop() == 0)
            #expect(lastAck > 0)
            let ids = daemon.records().compactMap { ($0["id"] as? String).flatMap(Int.init) }
            // Exactly the acked lines, each once, in order, less those refused.
            #expect(ids == (1...lastAck).filter { !refused.contains($0) }, "round \(round): last ack \(lastAck)")
            #expect(daemon.log.contains("sealed"))
        }
    }
}
