import Foundation
import Testing
import WhendJournal
import WhendWire

/// PROTOCOL.md §1–§7 against a real whend on a real socket.
@Suite(.serialized) struct ProtocolTests {
    @Test func helloGetsWelcomeAndAcksCoverEveryLine() throws {
        let daemon = TestDaemon("hello")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath,
            [
                helloWithAcks,
                #"{"type":"navigation","action":"root","screen":"Characters"}"#,
                "",  // empty lines are not counted
                #"{"type":"when","name":"userTapsCharacter","params":{"id":7}}"#,
            ])
        let welcome = try #require(answers.first?["welcome"] as? [String: Any])
        #expect(welcome["protocol"] as? Int == 1)
        #expect((welcome["server"] as? String)?.hasPrefix("whend/") == true)
        #expect(welcome["max_event_bytes"] as? Int == 65536)
        #expect(answers.acks.last == 2)
        #expect(answers.errors.isEmpty)
        daemon.stop()
        let records = daemon.records()
        #expect(records.map { $0["_seq"] as? Int } == [1, 2])
        #expect(records.allSatisfy { $0["app"] as? String == "com.example.mail" && $0["session"] as? String == "s1" })
    }

    @Test func withoutHelloThereAreNoAcksAndAppIsTheSendersProcessName() throws {
        let daemon = TestDaemon("nohello")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath,
            [#"{"type":"screen","name":"Home"}"#, #"{"type":"screen","name":"Detail","session":"x"}"#])
        #expect(answers.isEmpty)
        daemon.stop()
        let records = daemon.records()
        #expect(records.count == 2)
        let comm = try String(contentsOfFile: "/proc/self/comm", encoding: .utf8).trimmingCharacters(in: .newlines)
        #expect(records.allSatisfy { $0["app"] as? String == comm && $0["_comm"] as? String == comm })
        #expect(records[0]["session"] == nil)
        #expect(records[1]["session"] as? String == "x")
    }

    @Test func halfCloseGetsTheFinalAckEvenForALastLineWithoutNewline() throws {
        let daemon = TestDaemon("halfclose")
        try daemon.start()
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(helloWithAcks + "\n")
        for i in 1...500 { try connection.send(#"{"type":"when","name":"step","params":{"i":\#(i)}}"# + "\n") }
        try connection.send(#"{"type":"when","name":"last"}"#)  // no newline
        connection.finishSending()
        let acks = try connection.receivedAcks()
        #expect(acks.last == 501)
        #expect(acks == acks.sorted())  // never backwards
        daemon.stop()
        #expect(daemon.records().count == 501)
    }

    @Test func trustedFieldsComeFromTheKernelAndCannotBeForged() throws {
        let daemon = TestDaemon("trusted")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath,
            [
                helloWithAcks,
                #"{"type":"screen","name":"A","_pid":1}"#,
                #"{"type":"screen","name":"A","_seq":99}"#,
                #"{"type":"screen","name":"A","\u005fcomm":"init"}"#,
                #"{"type":"screen","name":"A","_origin":"screen-tracking"}"#,
                #"{"type":"screen","name":"B"}"#,
            ])
        #expect(answers.errors.map(\.code) == Array(repeating: "reserved_field", count: 4))
        #expect(answers.errors.map(\.event) == [1, 2, 3, 4])
        #expect(answers.acks.last == 5)
        daemon.stop()
        let records = daemon.records()
        #expect(records.count == 1)
        let r = try #require(records.first)
        #expect(r["_pid"] as? Int == Int(getpid()))
        #expect(r["_uid"] as? Int == Int(getuid()))
        #expect(r["_gid"] as? Int == Int(getgid()))
        #expect(r["_seq"] as? Int == 1)
        #expect(r["_origin"] == nil)
    }

    @Test func codableWhenIsStoredAsNameAndParams() throws {
        let daemon = TestDaemon("codable")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath,
            [
                helloWithAcks,
                #"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"a@example.com"}}}"#,
                #"{"type":"when","when":{"userTapsChangeEmailButton":{}}}"#,
                #"{"type":"when","when":{"showCharacter":{"_0":7}}}"#,
            ])
        #expect(answers.errors.isEmpty)
        daemon.stop()
        let records = daemon.records()
        #expect(
            records.map { $0["name"] as? String } == [
                "userTypesNewEmail", "userTapsChangeEmailButton", "showCharacter",
            ])
        #expect((records[0]["params"] as? [String: String]) == ["userEmail": "a@example.com"])
        #expect((records[1]["params"] as? [String: Any])?.isEmpty == true)
        #expect((records[2]["params"] as? [String: Int]) == ["_0": 7])
        #expect(records.allSatisfy { $0["when"] == nil })
    }

    /// Each §5 code a line can earn, with the line numbers the errors name, and every line
    /// around it stored.
    @Test func everyLineErrorCodeNamesItsLineAndSparesTheOthers() throws {
        let daemon = TestDaemon("codes", arguments: ["--max-event-bytes", "1024"])
        try daemon.start()
        let good = #"{"type":"screen","name":"Good"}"#
        let cases: [(String, [UInt8]?)] = [
            ("invalid_json", Array("{not json".utf8)),
            ("invalid_utf8", Array(#"{"type":"screen","name":""#.utf8) + [0xFF, 0xFE] + Array(#""}"#.utf8)),
            ("not_an_object", Array("[1,2,3]".utf8)),
            (
                "too_large",
                Array(#"{"type":"screen","name":""#.utf8) + Array(repeating: UInt8(ascii: "x"), count: 5000)
                    + Array(#""}"#.utf8)
            ),
            ("missing_field", Array(#"{"type":"lifecycle","status":"didAppear"}"#.utf8)),
            (
                "invalid_field",
                Array(
                    #"{"type":"lifecycle","screen":"A","status":"didDisappear","isBeingPresentedInitially":true}"#.utf8)
            ),
            ("unknown_type", Array(#"{"type":"tap"}"#.utf8)),
            ("reserved_field", Array(#"{"type":"screen","name":"A","_uid":0}"#.utf8)),
            ("misplaced_hello", Array(#"{"hello":{"protocol":1}}"#.utf8)),
        ]
        var raw = Array((helloWithAcks + "\n" + good + "\n").utf8)
        for (_, line) in cases { raw += line! + [0x0A] + Array((good + "\n").utf8) }
        let answers = try exchange(daemon.socketPath, [], raw: raw)
        let errors = answers.errors
        #expect(errors.map(\.code) == cases.map(\.0))
        // Lines: 1 good, then (bad, good) pairs: bad lines are 2, 4, 6, …
        #expect(errors.map(\.event) == cases.indices.map { 2 + 2 * $0 })
        #expect(errors.allSatisfy { $0.message.count > 10 })
        #expect(answers.acks.last == 1 + 2 * cases.count)
        daemon.stop()
        #expect(daemon.records().count == 1 + cases.count)
    }

    @Test func aLineOverTheLimitIsRejectedAndTheConnectionCarriesOn() throws {
        let daemon = TestDaemon("limit")
        try daemon.start()
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(helloWithAcks + "\n")
        // 10 MB without a newline, in pieces, then the newline and a good event.
        let piece = [UInt8](repeating: UInt8(ascii: "a"), count: 1 << 20)
        for _ in 0..<10 { try connection.send(piece) }
        try connection.send("\n" + #"{"type":"screen","name":"After"}"# + "\n")
        connection.finishSending()
        var lines: [[String: Any]] = []
        try connection.receiveLines {
            if let o = try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] { lines.append(o) }
        }
        #expect(lines.errors.map(\.code) == ["too_large"])
        #expect(lines.errors.first?.event == 1)
        #expect(lines.acks.last == 2)
        daemon.stop()
        #expect(daemon.records().map { $0["name"] as? String } == ["After"])
    }

    @Test func unsupportedProtocolIsAnErrorAboutTheConnectionWhichIsClosed() throws {
        let daemon = TestDaemon("protocol")
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath, [#"{"hello":{"protocol":2,"acks":true}}"#, #"{"type":"screen","name":"A"}"#])
        #expect(answers.errors.count == 1)
        #expect(answers.errors.first?.code == "unsupported_protocol")
        #expect(answers.errors.first?.event == nil)
        #expect(answers.acks.isEmpty)
        daemon.stop()
        #expect(daemon.records().isEmpty)
    }

    @Test func rateLimitedEventsAreNotStored() throws {
        let daemon = TestDaemon("rate", arguments: ["--rate-limit", "1", "--rate-burst", "3"])
        try daemon.start()
        var lines = [helloWithAcks]
        for i in 1...10 { lines.append(#"{"type":"when","name":"tap","id":"t\#(i)"}"#) }
        let answers = try exchange(daemon.socketPath, lines)
        let limited = answers.errors.filter { $0.code == "rate_limited" }
        #expect(limited.count >= 6)
        #expect(answers.acks.last == 10)
        daemon.stop()
        #expect(daemon.records().count == 10 - limited.count)
    }

    @Test func resentEventsAreStoredOnceEvenAcrossARestart() throws {
        let daemon = TestDaemon("dedup")
        try daemon.start()
        let events = (1...5).map { #"{"type":"when","name":"tap","id":"e\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 5)
        // The same ids again on a new connection: acknowledged, not stored again.
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 5)
        daemon.stop()
        try daemon.start()
        let again = try exchange(
            daemon.socketPath, [helloWithAcks] + events + [#"{"type":"when","name":"tap","id":"e6"}"#])
        #expect(again.acks.last == 6)
        #expect(again.errors.isEmpty)
        // Same id under another session is another event.
        let other = #"{"hello":{"protocol":1,"app":"com.example.mail","session":"s2","acks":true}}"#
        #expect(try exchange(daemon.socketPath, [other, events[0]]).acks.last == 1)
        daemon.stop()
        let records = daemon.records()
        #expect(records.count == 7)
        #expect(records.map { $0["_seq"] as? Int } == Array(1...7))
    }

    @Test func underATightMemoryBoundManyConnectionsAllGetStoredWithoutStalling() throws {
        let daemon = TestDaemon("bound", arguments: ["--max-pending-bytes", "4096"])
        try daemon.start()
        let group = DispatchGroup()
        let acks = LockedAcks()
        for c in 0..<8 {
            group.enter()
            Thread {
                defer { group.leave() }
                let hello = #"{"hello":{"protocol":1,"app":"bound","session":"c\#(c)","acks":true}}"#
                let lines = (1...2000).map { #"{"type":"when","name":"n","params":{"i":\#($0)}}"# }
                if let answers = try? exchange(daemon.socketPath, [hello] + lines) { acks.add(answers.acks.last ?? 0) }
            }.start()
        }
        #expect(group.wait(timeout: .now() + 60) == .success)
        #expect(acks.values == Array(repeating: 2000, count: 8))
        daemon.stop()
        #expect(daemon.records().count == 16000)
    }

    @Test func theDaemonRefusesASecondInstanceOnTheSameSocket() throws {
        let daemon = TestDaemon("twice")
        try daemon.start()
        let second = try runCommand(
            executable("whend"), ["--socket", daemon.socketPath, "--state-dir", daemon.directory + "/other"])
        #expect(second.status != 0)
        #expect(second.error.contains("already listening"))
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#]).acks.last == 1)
    }

    /// A second whend on the same state directory (another socket, as the refusal above suggests)
    /// must not touch the journal the first is writing: every event the first acknowledges, before
    /// and after the attempt, is on disk afterwards.
    @Test func aSecondDaemonOnTheSameStateDirectoryIsRefusedAndTheFirstLosesNothing() throws {
        let daemon = TestDaemon("one-writer")
        try daemon.start()
        let before = (1...500).map { #"{"type":"when","name":"before","id":"b\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + before).acks.last == 500)
        let second = try runCommand(
            executable("whend"),
            [
                "--socket", daemon.directory + "/other.sock", "--state-dir", daemon.stateDirectory,
                "--builtin-pipelines", "false",
            ])
        #expect(second.status != 0)
        let pid = daemon.pid
        #expect(
            second.error.contains("another whend (pid \(pid)) is already using the state directory"), "\(second.error)")
        #expect(second.error.contains("--state-dir"))
        let after = (1...500).map { #"{"type":"when","name":"after","id":"a\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + after).acks.last == 500)
        #expect(daemon.stop() == 0)
        let names = daemon.records().compactMap { $0["name"] as? String }
        #expect(names.filter { $0 == "before" }.count == 500)
        #expect(names.filter { $0 == "after" }.count == 500)
        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output)\(verify.error)")
        // The lock goes with its holder: the same directory opens again once the first has stopped.
        try daemon.start()
        #expect(daemon.stop() == 0)
    }

    @Test(.enabled(if: canMountTmpfs(), "needs to mount a small tmpfs (root in a sandbox that allows it)"))
    func aFullDiskAnswersUnavailableAcksNothingUnstoredAndRecovers() throws {
        let stateDirectory = scratchDirectory("full-mnt")
        #expect(mount(stateDirectory, size: "1m"))
        defer { unmount(stateDirectory) }
        let daemon = TestDaemon("full", stateDirectory: stateDirectory)
        try daemon.start()
        #expect(
            try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"Before","id":"b"}"#]).acks.last
                == 1)
        // Fill the filesystem completely.
        let filler = fillFileSystem(under: stateDirectory)
        // Incompressible events, so that the journal must grow.
        func noisy(_ i: Int) -> String {
            let noise = incompressible(600)
            return #"{"type":"when","name":"n","id":"n\#(i)","params":{"noise":"\#(noise)"}}"#
        }
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + (1...50).map(noisy))
        let unavailable = answers.errors.filter { $0.code == "unavailable" }
        #expect(!unavailable.isEmpty)
        #expect(unavailable.allSatisfy { $0.message.contains("retry") })
        #expect(answers.acks.last == 50)
        // Space returns: the journal stores again, without a restart.
        unlink(filler)
        let after = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"After","id":"a"}"#])
        #expect(after.errors.isEmpty, "\(after.errors)")
        #expect(after.acks.last == 1)
        daemon.stop()
        let stored = Set(daemon.records().compactMap { $0["id"] as? String })
        #expect(stored.contains("b") && stored.contains("a"))
        // Every event acked without an error is stored.
        let refused = Set(unavailable.compactMap(\.event))
        for line in 1...50 where !refused.contains(line) {
            #expect(stored.contains("n\(line)"), "n\(line) was acked but is not stored")
        }
        let report = JournalVerifier(directory: daemon.journal).verify()
        #expect(report.isClean, "\(report.problems)")
    }
}

func canMountTmpfs() -> Bool {
    guard getuid() == 0 else { return false }
    let probe = scratchDirectory("probe")
    defer { try? FileManager.default.removeItem(atPath: probe) }
    guard mount(probe, size: "64k") else { return false }
    unmount(probe)
    return true
}

@discardableResult
func mount(_ path: String, size: String) -> Bool {
    (try? runCommand("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size),mode=0750", "tmpfs", path]).status) == 0
}

func unmount(_ path: String) {
    _ = try? runCommand("/bin/umount", [path])
}

final class LockedAcks: @unchecked Sendable {
    // Unchecked: every access holds `lock`.
    private let lock = NSLock()
    private var all: [Int] = []
    func add(_ v: Int) { lock.withLock { all.append(v) } }
    var values: [Int] { lock.withLock { all } }
}
