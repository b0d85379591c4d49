import Foundation
import SeededRandom
import Testing
import WhendWire

/// A tracking plan at ingest, through a daemon on its socket: enforced, an event that breaks it
/// is refused with `plan_violation` and its path, and the rest of the batch is stored;
/// reported, it is stored and counted. Both are visible in `whenctl plan violations`, the
/// rejections (when refused) and the metrics.
@Suite struct TrackingPlanDaemonTests {
    static let plan = """
        {
          "events": {
            "userTypesNewEmail": {
              "type": "object",
              "properties": {"userEmail": {"type": "string", "pattern": "^[^@]+@[^@]+$"}},
              "required": ["userEmail"],
              "additionalProperties": false
            },
            "userTapsChangeEmailButton": {"type": "object", "additionalProperties": false}
          },
          "screens": {"names": ["ChangeEmail"]}
        }
        """

    static let lines = [
        #"{"hello":{"protocol":1,"app":"com.example.mail","session":"s1","acks":true}}"#,
        #"{"type":"when","name":"userTapsChangeEmailButton","screen":"ChangeEmail"}"#,
        #"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"not-an-address"}}}"#,
        #"{"type":"when","name":"userTypesNewEmail","params":{"userEmail":"a@example.com"}}"#,
    ]

    func daemon(_ name: String, mode: String) throws -> TestDaemon {
        let directory = scratchDirectory(name)
        let planPath = directory + "/plan.json"
        try Self.plan.write(toFile: planPath, atomically: true, encoding: .utf8)
        let daemon = TestDaemon(name, arguments: ["--tracking-plan", planPath, "--tracking-plan-mode", mode])
        try daemon.start()
        return daemon
    }

    /// A plan whose one pattern, `(a|a|…900)*b`, costs whend's automaton long for a long string:
    /// a check that runs on the blocking pool.
    func writeSlowPatternPlan(in directory: String) throws -> String {
        let planPath = directory + "/plan.json"
        let ways = Array(repeating: "a", count: 900).joined(separator: "|")
        try
            #"{"events":{"long":{"type":"object","properties":{"s":{"type":"string","pattern":"(\#(ways))*b"}}}},"unplannedEvents":"allow"}"#
            .write(toFile: planPath, atomically: true, encoding: .utf8)
        return planPath
    }

    func violations(_ daemon: TestDaemon) throws -> [String: Any] {
        let r = try daemon.whenctl(["plan", "violations", "--json"])
        #expect(r.status == 0, "\(r.error)")
        return try JSONSerialization.jsonObject(with: Data(r.output.utf8)) as? [String: Any] ?? [:]
    }

    @Test func enforcedAViolationIsRefusedWithItsPathAndTheRestIsStored() throws {
        let daemon = try daemon("plan-enforce", mode: "enforce")
        defer { daemon.stop() }
        let answers = try exchange(daemon.socketPath, Self.lines)
        #expect(answers.acks.last == 3)
        let errors = answers.errors
        try #require(errors.count == 1, "\(errors)")
        #expect(errors[0].event == 2 && errors[0].code == "plan_violation")
        #expect(errors[0].message.contains("$.params.userEmail") && errors[0].message.contains("rule pattern"))
        let stored = daemon.records().compactMap { $0["name"] as? String }
        #expect(stored == ["userTapsChangeEmailButton", "userTypesNewEmail"])
        #expect(
            !daemon.records().contains { ($0["params"] as? [String: Any])?["userEmail"] as? String == "not-an-address" }
        )

        let report = try violations(daemon)
        #expect(report["mode"] as? String == "enforce")
        let counts = report["counts"] as? [[String: Any]] ?? []
        #expect(counts.count == 1 && counts[0]["event"] as? String == "userTypesNewEmail")
        #expect(counts.first?["rule"] as? String == "pattern" && counts.first?["count"] as? Int == 1)
        let latest = report["latest"] as? [[String: Any]] ?? []
        #expect(latest.count == 1 && latest[0]["stored"] as? Bool == false)
        #expect(latest.first?["path"] as? String == "$.params.userEmail")
        #expect(latest.first?["app"] as? String == "com.example.mail")
        // Refused, it is among the rejections too.
        let rejections = try daemon.whenctl(["rejections", "--json"]).output
        #expect(rejections.contains("plan_violation"))
        let metrics = try daemon.whenctl(["metrics"]).output
        #expect(metrics.contains(#"whend_plan_violations_total{event="userTypesNewEmail",rule="pattern"} 1"#))
        #expect(metrics.contains(#"whend_events_rejected_total{code="plan_violation"} 1"#))
    }

    @Test func reportedAViolationIsStoredAndCounted() throws {
        let daemon = try daemon("plan-report", mode: "report")
        defer { daemon.stop() }
        let answers = try exchange(
            daemon.socketPath,
            Self.lines + [
                #"{"type":"when","name":"somethingUnplanned","params":{"a":1}}"#,
                #"{"type":"screen","name":"Elsewhere"}"#,
            ])
        #expect(answers.errors.isEmpty, "\(answers.errors)")
        #expect(answers.acks.last == 5)
        #expect(daemon.records().count == 5)
        let report = try violations(daemon)
        let counts = (report["counts"] as? [[String: Any]] ?? []).map {
            "\($0["event"] as? String ?? "?") \($0["rule"] as? String ?? "?") \($0["count"] as? Int ?? 0)"
        }
        #expect(counts == [" event 1", "screen screen 1", "userTypesNewEmail pattern 1"])
        let latest = report["latest"] as? [[String: Any]] ?? []
        #expect(latest.count == 3 && latest.allSatisfy { $0["stored"] as? Bool == true })
        #expect(latest.map { $0["event"] as? String } == ["userTypesNewEmail", "somethingUnplanned", "screen"])
        let text = try daemon.whenctl(["plan", "violations"]).output
        #expect(text.contains("1 userTypesNewEmail pattern") && text.contains("stored app=com.example.mail"), "\(text)")
        let metrics = try daemon.whenctl(["metrics"]).output
        #expect(metrics.contains(#"whend_plan_violations_total{event="",rule="event"} 1"#), "\(metrics)")
        // As Prometheus reads it.
        let file = daemon.directory + "/metrics.txt"
        try metrics.write(toFile: file, atomically: true, encoding: .utf8)
        let check = try runCommand("/bin/sh", ["-c", "exec promtool check metrics < '\(file)'"])
        #expect(check.status == 0 && check.error.isEmpty, "promtool: \(check.output)\(check.error)")
    }

    /// A reload reads the plan again: one that does not parse is refused with its line, and the
    /// one in force stays; a good one is taken up at once, by connections already open too.
    @Test func aReloadTakesUpANewPlanOrKeepsTheOldOne() throws {
        let directory = scratchDirectory("plan-reload")
        let planPath = directory + "/plan.json"
        let config = directory + "/whend.conf"
        try Self.plan.write(toFile: planPath, atomically: true, encoding: .utf8)
        try "tracking_plan = \(planPath)\ntracking_plan_mode = enforce\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon("plan-reload", arguments: ["--config", config])
        try daemon.start()
        defer { daemon.stop() }
        let bad = Self.lines[2]
        #expect(try exchange(daemon.socketPath, [Self.lines[0], bad]).errors.first?.code == "plan_violation")

        try "{\n  \"events\": {\n    \"x\": {\"type\": \"strng\"}\n  }\n}\n".write(
            toFile: planPath, atomically: true, encoding: .utf8)
        let refused = try daemon.whenctl(["reload"])
        #expect(refused.status == 1 && refused.error.contains("line 3") && refused.error.contains("not a type"))
        #expect(try exchange(daemon.socketPath, [Self.lines[0], bad]).errors.first?.code == "plan_violation")

        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(Self.lines[0] + "\n")
        try Self.plan.replacingOccurrences(of: "\"pattern\": \"^[^@]+@[^@]+$\"", with: "\"minLength\": 1")
            .write(toFile: planPath, atomically: true, encoding: .utf8)
        let applied = try daemon.whenctl(["reload"])
        #expect(applied.status == 0, "\(applied.error)")
        // The reload says the plan changed, though no setting did; and says nothing the next time.
        #expect(applied.output.contains("tracking plan \(planPath) read anew: it changed"), "\(applied.output)")
        let again = try daemon.whenctl(["reload"])
        #expect(again.status == 0 && again.output.contains("nothing changed"), "\(again.output)")
        try connection.send(bad + "\n")
        connection.finishSending()
        var lines: [[String: Any]] = []
        try connection.receiveLines { line in
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { lines.append(o) }
        }
        #expect(lines.errors.isEmpty && lines.acks.last == 1, "\(lines)")
    }

    /// A check that may take long (a long string against a pattern of many ways) holds only its
    /// own connection: the other connections are served meanwhile, and new ones accepted,
    /// while its lines wait their turn in order, each judged as it would be on the loop. (The
    /// check held the thread serving it, so every connection on that thread, and the accepting
    /// of new ones, waited for all its lines: light events answered after 3–6 s.)
    @Test func aLongCheckHoldsOnlyItsOwnConnection() throws {
        let directory = scratchDirectory("plan-long-check")
        let planPath = try writeSlowPatternPlan(in: directory)
        let daemon = TestDaemon(
            "plan-long-check", arguments: ["--tracking-plan", planPath, "--tracking-plan-mode", "report"])
        try daemon.start()
        defer { daemon.stop() }
        let text = String(repeating: "a", count: 24_000)
        // Three long events (the second keeps to the plan), then a short one, in one write.
        let long = [text, text + "b", text].map { #"{"type":"when","name":"long","params":{"s":"\#($0)"}}"# }
        let heavy = try BlockingSocket(path: daemon.socketPath)
        try heavy.send(([helloWithAcks] + long + [#"{"type":"when","name":"after"}"#]).joined(separator: "\n") + "\n")
        heavy.finishSending()
        // Meanwhile, connections one after another, each with a short event, each answered.
        for i in 0..<3 {
            let answers = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"light\#(i)"}"#])
            #expect(answers.acks.last == 1 && answers.errors.isEmpty, "\(answers)")
        }
        var answers: [[String: Any]] = []
        try heavy.receiveLines { line in
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { answers.append(o) }
        }
        #expect(answers.acks.last == 4 && answers.errors.isEmpty, "\(answers.acks) \(answers.errors)")
        let stored = daemon.records().compactMap { r in (r["name"] as? String).map { ($0, r["_seq"] as? Int ?? 0) } }
        let lastLong = stored.filter { $0.0 == "long" }.map(\.1).max() ?? 0
        // The short events were stored while the long ones were being checked; the long
        // connection's own lines kept their order.
        #expect(stored.filter { $0.0.hasPrefix("light") }.allSatisfy { $0.1 < lastLong }, "\(stored)")
        #expect(stored.filter { !$0.0.hasPrefix("light") }.map(\.0) == ["long", "long", "long", "after"])
        let counts = (try violations(daemon)["counts"] as? [[String: Any]] ?? []).map {
            "\($0["event"] as? String ?? "?") \($0["rule"] as? String ?? "?") \($0["count"] as? Int ?? 0)"
        }
        #expect(counts == ["long pattern 2"])
    }

    /// SIGKILLed while lines wait for a check on another thread, whend loses nothing it
    /// acknowledged and stores nothing twice, in the order sent: the ack never covers a line
    /// still waiting, and the lines after it wait with it. Seeded: where the long lines fall,
    /// and when the kill comes.
    @Test(arguments: [1, 2, 3])
    func aKillWhileLinesWaitForTheirCheckLosesNothingAcked(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let directory = scratchDirectory("plan-kill-\(seed)")
        let planPath = try writeSlowPatternPlan(in: directory)
        let arguments = ["--tracking-plan", planPath, "--tracking-plan-mode", "report"]
        let daemon = TestDaemon.live("plan-kill-\(seed)", arguments: arguments)
        try daemon.start()
        let text = String(repeating: "a", count: 16_000)
        let count = 40
        let lines = (0..<count).map { i in
            random.int(4) == 0
                ? #"{"type":"when","name":"long","id":"k-\#(i)","params":{"s":"\#(text)"}}"#
                : #"{"type":"when","name":"short","id":"k-\#(i)"}"#
        }
        let connection = try AckedConnection(daemon.socketPath)
        try connection.connection.send(lines.joined(separator: "\n") + "\n")
        try connection.read(until: 1 + random.int(count / 2))
        daemon.crash()
        try daemon.start()
        defer { daemon.stop() }
        let stored = storedIDs(daemon.journal)
        #expect(connection.errors.isEmpty, "\(connection.errors)")
        #expect(
            lostEvents("k", connection.lastAck, from: Set(stored)).isEmpty,
            "acked \(connection.lastAck), stored \(stored)")
        #expect(Set(stored).count == stored.count, "stored twice: \(stored)")
        #expect(stored == (0..<stored.count).map { "k-\($0)" }, "out of order: \(stored)")
    }

    /// A plan path that names a FIFO, a directory or a device is refused at once, saying what
    /// it is (it was "No such file or directory", which sent people looking for a typo).
    @Test func aPlanPathThatIsNoFileIsRefusedAtOnce() throws {
        let directory = scratchDirectory("plan-no-file")
        let fifo = directory + "/plan.fifo"
        #expect(mkfifo(fifo, 0o644) == 0)
        let config = directory + "/whend.conf"
        try "tracking_plan = \(fifo)\n".write(toFile: config, atomically: true, encoding: .utf8)
        let refused = TestDaemon("plan-fifo", arguments: ["--config", config])
        do {
            try refused.start()
            Issue.record("whend started with a FIFO for its plan")
        } catch {
            #expect("\(error)".contains("a FIFO, not a regular file"), "\(error)")
        }
        refused.stop()

        try "tracking_plan =\n".write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon("plan-no-file", arguments: ["--config", config])
        try daemon.start()
        defer { daemon.stop() }
        for (path, kind) in [(fifo, "a FIFO"), (directory, "a directory"), ("/dev/zero", "a character device")] {
            try "tracking_plan = \(path)\n".write(toFile: config, atomically: true, encoding: .utf8)
            let reload = try daemon.whenctl(["reload"])
            #expect(reload.status == 1 && reload.error.contains("\(kind), not a regular file"), "\(reload.error)")
            let check = try whenctl(["plan", "check", path, "--state-dir", daemon.stateDirectory])
            #expect(check.status == 1 && check.error.contains("\(kind), not a regular file"), "\(check.error)")
        }
    }
}
