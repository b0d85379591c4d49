import Foundation
import Testing
import WhendJournal
import WhendWire

/// whenctl against a real daemon and its real journal.
@Suite(.serialized) struct WhenctlTests {
    let whenctl = executable("whenctl")

    @Test func emitReportsErrorsAndExitStatus() throws {
        let daemon = TestDaemon("emit")
        try daemon.start()
        let env = ["WHEND_SOCKET": daemon.socketPath]
        let ok = try runCommand(
            whenctl, ["emit", "--app", "com.x", #"{"type":"screen","name":"A"}"#], environment: env)
        #expect(ok.status == 0)
        #expect(ok.error.contains("1 sent, 1 stored, 0 rejected"))
        let bad = try runCommand(
            whenctl, ["emit", #"{"type":"screen","name":"B"}"#, #"{"type":"lifecycle","screen":"A"}"#], environment: env
        )
        #expect(bad.status == 1)
        #expect(bad.error.contains("event 2: missing_field"))
        daemon.stop()
        let gone = try runCommand(whenctl, ["emit", #"{"type":"screen","name":"C"}"#], environment: env)
        #expect(gone.status == 1)
        #expect(gone.error.contains("cannot reach whend at \(daemon.socketPath)"))
        // Said once, naming the control socket tried and how to name another.
        let status = try runCommand(whenctl, ["status", "--socket", daemon.socketPath])
        #expect(status.status == 1)
        #expect(status.error.components(separatedBy: "cannot reach whend").count == 2, "\(status.error)")
        #expect(status.error.contains("control.sock") && status.error.contains("--control"))
        #expect(daemon.records().map { $0["name"] as? String } == ["A", "B"])
    }

    /// Every subcommand's exit status tells the kind of outcome: 0 done; 1 the work failed, said
    /// in one line that names the input; 64 a usage error, with the subcommand's usage.
    @Test func everySubcommandExitsByTheKindOfOutcome() throws {
        let daemon = TestDaemon("exits", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        let session = [
            #"{"hello":{"protocol":1,"app":"com.x","session":"x1","acks":true}}"#,
            #"{"type":"navigation","action":"root","screen":"Home"}"#,
            #"{"type":"lifecycle","screen":"Home","status":"willAppear","isBeingPresentedInitially":true}"#,
            #"{"type":"lifecycle","screen":"Home","status":"didAppear","isBeingPresentedInitially":true}"#,
            #"{"type":"error","message":"boom","fatal":true}"#,
            #"{"type":"lifecycle","screen":"Other","status":"didAppear"}"#,
        ]
        #expect(try exchange(daemon.socketPath, session).acks.last == 5)
        let state = ["--state-dir", daemon.stateDirectory]
        let socket = ["--socket", daemon.socketPath]
        #expect(eventually { (try? runCommand(whenctl, ["crashes", "4"] + state).status) == 0 })
        #expect(eventually { (try? runCommand(whenctl, ["sessions", "x1"] + state).status) == 0 })
        let config = daemon.stateDirectory + "/empty.conf"
        #expect(FileManager.default.createFile(atPath: config, contents: Data()))

        let missing = ["--state-dir", "/nonexistent/whend-state"]
        let gone = ["--socket", "/nonexistent/events.sock"]
        let cases: [(name: String, succeeds: [String], fails: [String], failureNames: String)] = [
            (
                "emit", socket + [#"{"type":"screen","name":"A"}"#], gone + [#"{"type":"screen","name":"A"}"#],
                "/nonexistent/events.sock"
            ),
            ("cat", state, missing, "/nonexistent/whend-state/journal"),
            ("tail", state + ["-n", "2"], missing, "/nonexistent/whend-state/journal"),
            ("verify", state, missing, "/nonexistent/whend-state/journal"),
            ("status", socket, gone, "/nonexistent/control.sock"),
            ("reload", socket, gone, "/nonexistent/control.sock"),
            ("metrics", socket, gone, "/nonexistent/control.sock"),
            ("plugins", socket, gone, "/nonexistent/control.sock"),
            ("sessions", state + ["x1"], state + ["nope"], "nope"),
            ("crashes", state + ["#4"], state + ["#999"], "#999"),
            (
                "replay", state + ["--pipeline", "screens", "--config", config],
                state + ["--pipeline", "nope", "--config", config], "nope"
            ),
            ("export", state + ["--session", "x1"], state + ["--session", "nope"], "nope"),
            ("flow", state, missing, "/nonexistent/whend-state/journal"),
        ]
        for c in cases {
            let ok = try runCommand(whenctl, [c.name] + c.succeeds)
            #expect(ok.status == 0, "whenctl \(c.name): \(ok.error)")
            let failed = try runCommand(whenctl, [c.name] + c.fails)
            #expect(failed.status == 1, "whenctl \(c.name) failing: \(failed.status) \(failed.error)")
            let lines = failed.error.split(separator: "\n")
            #expect(
                lines.count == 1 && lines[0].hasPrefix("whenctl \(c.name): ") && lines[0].contains(c.failureNames)
                    && !failed.error.contains("Usage"), "whenctl \(c.name) failing said: \(failed.error)")
            let usage = try runCommand(whenctl, [c.name, "--no-such-option"])
            #expect(usage.status == 64, "whenctl \(c.name) --no-such-option: \(usage.status)")
            #expect(usage.error.contains("Usage: whenctl \(c.name)"), "\(usage.error)")
        }
        // Every record has a readable short form, the derived ones too.
        let short = try runCommand(whenctl, ["cat", "-o", "short"] + state).output
        #expect(short.contains("screen: Home") && short.contains("diagnostic: Other: didAppear without willAppear"))
        #expect(!short.split(separator: "\n").contains { $0.hasSuffix(": ") }, "\(short)")
        let rejected = try runCommand(whenctl, ["emit"] + socket + [#"{"type":"lifecycle","screen":"A"}"#])
        #expect(rejected.status == 1 && rejected.error.contains("event 1: missing_field"))
        daemon.stop()
    }

    /// What a newcomer tried and met: a mistyped command is answered with the one meant; a
    /// plugin author lists their plugin's derived type with `cat --type` (refused before: only
    /// the five event types were); `replay -o short` prints the short form (it was ignored);
    /// `emit` exits as its help says when whend is not there (the help said 2, it exits 1).
    @Test func aNewcomersMistakesGetUsefulAnswers() throws {
        let typo = try runCommand(whenctl, ["stauts"])
        #expect(typo.status == 64 && typo.error.contains("did you mean 'status'?"), "\(typo)")
        let far = try runCommand(whenctl, ["frobnicate"])
        #expect(far.status == 64 && !far.error.contains("did you mean"), "\(far)")
        let daemon = TestDaemon("cat-derived", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        defer { daemon.stop() }
        let lines = [
            #"{"hello":{"protocol":1,"acks":true,"app":"a","session":"s"}}"#,
            #"{"type":"lifecycle","screen":"Home","status":"willAppear","isBeingPresentedInitially":true}"#,
            #"{"type":"lifecycle","screen":"Home","status":"didAppear","isBeingPresentedInitially":true}"#,
            #"{"type":"lifecycle","screen":"Home","status":"willDisappear","isBeingRemovedIndefinitely":true}"#,
            #"{"type":"lifecycle","screen":"Home","status":"didDisappear","isBeingRemovedIndefinitely":true}"#,
        ]
        #expect(try exchange(daemon.socketPath, lines).acks.last == 4)
        var derived: [String] = []
        #expect(
            eventually(20) {
                let r = try? runCommand(
                    whenctl, ["cat", "--state-dir", daemon.stateDirectory, "--type", "screen_time"])
                derived = r?.output.split(separator: "\n").map(String.init) ?? []
                return r?.status == 0 && !derived.isEmpty
            }, "\(derived)")
        #expect(derived.allSatisfy { $0.contains(#""type":"screen_time""#) }, "\(derived)")
        // replay -o short prints what it derives as cat -o short does (it printed JSON).
        let library = (whenctl as NSString).deletingLastPathComponent + "/libscreen-tracking.so"
        let short = try runCommand(
            whenctl, ["replay", "--state-dir", daemon.stateDirectory, "--plugin", library, "-o", "short"])
        let shortLines = short.output.split(separator: "\n")
        #expect(short.status == 0 && !shortLines.isEmpty, "\(short)")
        #expect(shortLines.allSatisfy { !$0.hasPrefix("{") && $0.contains("a/s screen") }, "\(short.output)")
        let empty = try runCommand(whenctl, ["cat", "--state-dir", daemon.stateDirectory, "--type", ""])
        #expect(empty.status == 64 && empty.error.contains("--type takes a record type"), "\(empty)")
        let gone = try runCommand(
            whenctl, ["emit", "--socket", daemon.directory + "/nothing.sock", #"{"type":"when","name":"x"}"#])
        let help = try runCommand(whenctl, ["emit", "--help"]).output.split(whereSeparator: \.isWhitespace)
            .joined(separator: " ")
        #expect(gone.status == 1 && gone.error.contains("cannot reach whend"), "\(gone)")
        #expect(help.contains("exit status is 1 if any") && !help.contains("2 if whend"), "\(help)")
    }

    /// The client guide's Python client (docs/client.md), run as printed with the standard
    /// library's python3: whend welcomes it, acks its event and stores it.
    @Test func theGuidesPythonClientIsAckedAndStored() throws {
        let guide = try String(contentsOfFile: DocumentationTests.root + "/docs/client.md", encoding: .utf8)
        let section = try #require(guide.range(of: "\n## From another language\n"))
        let open = try #require(guide.range(of: "\n```python\n", range: section.upperBound..<guide.endIndex))
        let close = try #require(guide.range(of: "\n```\n", range: open.upperBound..<guide.endIndex))
        let daemon = TestDaemon("python-client")
        try daemon.start()
        defer { daemon.stop() }
        let script = daemon.directory + "/client.py"
        try String(guide[open.upperBound..<close.lowerBound]).write(toFile: script, atomically: true, encoding: .utf8)
        let run = try runCommand("/usr/bin/python3", [script], environment: ["WHEND_SOCKET": daemon.socketPath])
        #expect(run.status == 0, "\(run)")
        #expect(
            run.output.hasPrefix(#"{"welcome":{"protocol":1,"#) && run.output.hasSuffix(#"{"ack":1}"# + "\n"), "\(run)")
        let stored = daemon.records()
        #expect(stored.count == 1 && stored.first?["name"] as? String == "userTapsSave", "\(stored)")
        #expect(stored.first?["app"] as? String == "com.example.py" && stored.first?["session"] as? String == "py-1")
    }

    @Test func catFiltersByAppSessionTypeSeqAndTime() throws {
        let daemon = TestDaemon("cat", arguments: ["--segment-max-bytes", "4096"])
        try daemon.start()
        var lines = [#"{"hello":{"protocol":1,"acks":true}}"#]
        for i in 1...300 {
            let app = i % 2 == 0 ? "even" : "odd"
            let type = i % 3 == 0 ? #""type":"screen","name":"S\#(i)""# : #""type":"when","name":"w\#(i)""#
            lines.append(#"{\#(type),"app":"\#(app)","session":"s\#(i % 5)","id":"\#(i)","noise":"\#(noise())"}"#)
        }
        // In several connections, hence several commits: segments rotate between commits.
        for part in 0..<10 {
            #expect(
                try exchange(daemon.socketPath, [lines[0]] + lines[(1 + part * 30)...(30 + part * 30)]).acks.last == 30)
        }
        let state = ["--state-dir", daemon.stateDirectory]
        func ids(_ args: [String]) throws -> [Int] {
            let r = try runCommand(whenctl, ["cat"] + state + args)
            #expect(r.status == 0, "\(r.error)")
            return r.output.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["id"] as? String
            }.compactMap { Int($0) }
        }
        // Read while the daemon writes, across several segments.
        #expect(daemon.journal.segments().count > 2)
        #expect(try ids([]) == Array(1...300))
        #expect(try ids(["--app", "even", "--type", "screen"]) == (1...300).filter { $0 % 6 == 0 })
        #expect(try ids(["--session", "s3", "--from", "100", "--to", "150"]) == (100...150).filter { $0 % 5 == 3 })
        #expect(try ids(["--since", "1h", "--to", "3"]) == [1, 2, 3])
        #expect(try ids(["--until", "2000-01-01T00:00:00Z"]) == [])
        let short = try runCommand(whenctl, ["cat"] + state + ["-o", "short", "--from", "3", "--to", "3"])
        #expect(short.output.contains("#3 odd/s3 screen: S3"))
        let badTime = try runCommand(whenctl, ["cat"] + state + ["--since", "last tuesday"])
        #expect(badTime.status != 0 && badTime.error.contains("RFC 3339"))
    }

    @Test func tailFollowsRecordsAsTheyAreCommitted() throws {
        let daemon = TestDaemon("tail", arguments: ["--segment-max-bytes", "4096"])
        try daemon.start()
        #expect(
            try exchange(daemon.socketPath, [helloWithAcks] + (1...20).map { #"{"type":"when","name":"early\#($0)"}"# })
                .acks.last == 20)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: whenctl)
        p.arguments = ["tail", "-f", "-n", "3", "--state-dir", daemon.stateDirectory]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        defer { if p.isRunning { p.terminate() } }
        usleep(300_000)
        // Enough to rotate segments while tail follows.
        for batch in 0..<5 {
            // Random padding: compressible records would all fit in one segment.
            let events = (1...40).map {
                #"{"type":"when","name":"late\#(batch * 40 + $0)","params":{"pad":"\#(UInt64.random(in: 0...UInt64.max))\#(UInt64.random(in: 0...UInt64.max))"}}"#
            }
            #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 40)
        }
        var names: [String] = []
        readLines(from: out.fileHandleForReading.fileDescriptor, until: Date().addingTimeInterval(15)) { line in
            if let name = (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["name"]
                as? String
            {
                names.append(name)
            }
            return names.count < 203
        }
        // Started from a test's thread, whose signal mask blocks SIGTERM: it must stop anyway.
        p.terminate()
        #expect(eventually(5) { !p.isRunning }, "whenctl tail -f did not stop on SIGTERM")
        #expect(names == ["early18", "early19", "early20"] + (1...200).map { "late\($0)" })
        #expect(daemon.journal.segments().count >= 2)  // it followed across a rotation
        // The last N, wherever they are: the newest segment holds fewer than 150.
        let last = try runCommand(whenctl, ["tail", "-n", "150", "--state-dir", daemon.stateDirectory])
        #expect(last.output.split(separator: "\n").count == 150)
        #expect(last.output.hasSuffix("\"late200\"}\n") || last.output.contains("late200"))
    }

    @Test func verifyNamesTheFileAndOffsetOfDamage() throws {
        let daemon = TestDaemon("verify", arguments: ["--segment-max-bytes", "4096"])
        try daemon.start()
        try sendNoisyParts(daemon, 0..<10)
        daemon.stop()
        let clean = try runCommand(whenctl, ["verify", "--state-dir", daemon.stateDirectory])
        #expect(clean.status == 0)
        #expect(clean.output.contains("OK:") && clean.output.contains("300 record(s)"))

        let segments = daemon.journal.segments()
        try #require(segments.count >= 3)
        let victim = segments[1]
        let victimRecords = Int(try #require(SegmentIndex.read(fromFileAt: victim.path)).recordCount)
        var bytes = try FileIO_read(victim.path)
        let middle = bytes.count / 2
        for i in middle..<(middle + 16) { bytes[i] ^= 0x5A }
        try Data(bytes).write(to: URL(fileURLWithPath: victim.path))
        let damaged = try runCommand(whenctl, ["verify", "--json", "--state-dir", daemon.stateDirectory])
        #expect(damaged.status == 1)
        let report = try #require(try JSONSerialization.jsonObject(with: Data(damaged.output.utf8)) as? [String: Any])
        #expect(report["ok"] as? Bool == false)
        let problems = try #require(report["problems"] as? [[String: Any]])
        #expect(!problems.isEmpty)
        #expect(problems.allSatisfy { $0["file"] as? String == victim.path })
        #expect(problems.allSatisfy { ($0["offset"] as? Int).map { $0 >= 0 && $0 <= middle } == true })
        // cat warns, names the place, and still prints the other segments.
        let cat = try runCommand(whenctl, ["cat", "--state-dir", daemon.stateDirectory])
        #expect(cat.status == 1)
        #expect(cat.error.contains(victim.path))
        #expect(cat.output.split(separator: "\n").count >= 300 - victimRecords)
    }

    @Test func rotationAndRetentionKeepTheJournalWithinItsSizeAndVerifiable() throws {
        let daemon = TestDaemon(
            "retain", arguments: ["--segment-max-bytes", "4096", "--retention-max-bytes", "16384"])
        try daemon.start()
        for round in 0..<10 {
            let events = (1...100).map { i in
                let noise = (0..<20).map { _ in String(UInt32.random(in: 0...UInt32.max), radix: 36) }.joined()
                return #"{"type":"when","name":"r\#(round)","params":{"i":\#(i),"noise":"\#(noise)"}}"#
            }
            #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 100)
        }
        daemon.stop()
        let segments = daemon.journal.segments()
        let total = segments.compactMap { try? FileManager.default.attributesOfItem(atPath: $0.path)[.size] as? Int }
            .reduce(0, +)
        #expect(total <= 16384 + 8192)  // the limit, plus the segment being written when it was checked
        #expect(segments.first!.firstSeq > 1)  // the oldest were deleted
        let verify = try runCommand(whenctl, ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output)")
        #expect(daemon.records().last?["_seq"] as? Int == 1000)
    }

    @Test(arguments: ["write", "none"])
    func everyDurabilityStoresEverythingItAcked(durability: String) throws {
        let daemon = TestDaemon("dur-\(durability)", arguments: ["--durability", durability])
        try daemon.start()
        let events = (1...2000).map { #"{"type":"when","name":"d","id":"\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 2000)
        // Readable while whend runs (for `none`, once the writer went idle and flushed).
        #expect(eventually { daemon.records().count == 2000 })
        #expect(daemon.stop() == 0)
        #expect(daemon.records().count == 2000)
        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output)")
    }

    /// `--segment-max-age` reaches the writer (whose clock is tested in `JournalWriterTests`).
    @Test func segmentsRotateByAge() throws {
        let daemon = TestDaemon("age", arguments: ["--segment-max-age", "1"])
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#]).acks.last == 1)
        // The writer looks once a second: sealed within two.
        let first = daemon.journal.segmentPath(firstSeq: 1)
        #expect(eventually(10) { SegmentIndex.read(fromFileAt: first) != nil })
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"B"}"#]).acks.last == 1)
        #expect(daemon.journal.segments().map(\.firstSeq) == [1, 2])
        daemon.stop()
    }

    @Test func aGracefulStopAnswersEveryLineItReceived() throws {
        let daemon = TestDaemon("graceful")
        try daemon.start()
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(helloWithAcks + "\n")
        for i in 1...200 { try connection.send(#"{"type":"when","name":"s","id":"\#(i)"}"# + "\n") }
        #expect(eventually { ((try? daemon.status())?["events_received"] as? Int) == 200 })  // read by whend
        #expect(daemon.stop() == 0)
        let acks = try connection.receivedAcks()
        #expect(acks.last == 200)
        #expect(daemon.records().count == 200)
        // The active segment was sealed.
        let last = try #require(daemon.journal.segments().last)
        #expect(SegmentIndex.read(fromFileAt: last.path) != nil)
        #expect(daemon.log.contains("sealed"))
    }
}

func FileIO_read(_ path: String) throws -> [UInt8] {
    Array(try Data(contentsOf: URL(fileURLWithPath: path)))
}

/// Reads lines from a pipe as they come, until `body` returns false, the writer closes, or the
/// deadline passes.
func readLines(from fd: Int32, until deadline: Date, _ body: (String) -> Bool) {
    var pending: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while Date() < deadline {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&pfd, 1, 100)
        if ready <= 0 { continue }
        let n = read(fd, &buffer, buffer.count)
        if n <= 0 { return }
        pending += buffer[0..<n]
        while let nl = pending.firstIndex(of: 0x0A) {
            let line = String(decoding: pending[..<nl], as: UTF8.self)
            pending.removeSubrange(...nl)
            if !body(line) { return }
        }
    }
}

/// Random hex, so that records do not compress to nothing and segments rotate in small tests.
func noise(_ bytes: Int = 24) -> String {
    (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
}

@Suite(.serialized) struct SustainedLoadTests {
    /// Rotation by age must not wait for an idle moment: under a steady stream it still happens.
    @Test func segmentsRotateByAgeUnderSteadyLoad() throws {
        let daemon = TestDaemon("busy-age", arguments: ["--segment-max-age", "1"])
        try daemon.start()
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(#"{"hello":{"protocol":1}}"# + "\n")
        let end = Date().addingTimeInterval(3.5)
        var i = 0
        while Date() < end {
            try connection.send(#"{"type":"when","name":"busy","params":{"i":\#(i)}}"# + "\n")
            i += 1
            usleep(1000)
        }
        connection.finishSending()
        try connection.receiveLines { _ in }
        #expect(daemon.journal.segments().count >= 3, "\(daemon.journal.segments().map(\.firstSeq))")
        daemon.stop()
        #expect(daemon.records().count == i)
    }
}
