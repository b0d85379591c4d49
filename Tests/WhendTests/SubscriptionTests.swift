import Foundation
import SeededRandom
import Testing
import WhendJournal
import WhendSystem
import WhendWire

@testable import WhendDaemon

/// A subscriber on the event socket (PROTOCOL.md §9), read line by line with a deadline.
final class Subscriber {
    let socket: BlockingSocket
    private var buffer: [UInt8] = []
    private(set) var closed = false

    init(_ daemon: TestDaemon, _ request: String) throws {
        socket = try BlockingSocket(path: daemon.socketPath)
        try socket.send(#"{"subscribe":"# + request + "}\n")
    }

    /// Reads a connection whose subscribe line the test sent itself.
    init(reading socket: BlockingSocket) {
        self.socket = socket
    }

    /// The next line, parsed; nil if none came within `timeout` or the connection ended.
    func next(timeout: TimeInterval = 10) throws -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if let nl = buffer.firstIndex(of: 0x0A) {
                let line = Array(buffer[..<nl])
                buffer.removeSubrange(...nl)
                return try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any]
            }
            guard !closed, socket.waitReadable(timeout: max(0, deadline.timeIntervalSinceNow)) else { return nil }
            let chunk = try socket.receive()
            if chunk.isEmpty { closed = true } else { buffer += chunk }
        }
    }

    /// Lines until one that `stop` accepts (included), within `timeout` in all.
    func lines(until stop: ([String: Any]) -> Bool, timeout: TimeInterval = 20) throws -> [[String: Any]] {
        let deadline = Date().addingTimeInterval(timeout)
        var out: [[String: Any]] = []
        while let line = try next(timeout: max(0, deadline.timeIntervalSinceNow)) {
            out.append(line)
            if stop(line) { return out }
        }
        throw TestFailure(description: "no end line within \(timeout) s; got \(out.count) lines: \(out.suffix(3))")
    }
}

/// About `megabytes` MiB of records (1000 `when` events of 900 padding bytes per session),
/// for a subscriber to fall behind on.
func sendBacklog(_ daemon: TestDaemon, megabytes: Int) throws {
    let pad = String(repeating: "x", count: 900)
    for part in 0..<megabytes {
        try sendSession(
            daemon, app: "app", session: "p\(part)",
            (0..<1000).map { #"{"type":"when","name":"n\#($0)","context":{"pad":"\#(pad)"}}"# })
    }
}

/// The last `_seq` a subscriber was told it has seen everything through: a record's own, or a
/// checkpoint's, or caught_up's.
func seenThrough(_ line: [String: Any]) -> Int? {
    if let seq = line["_seq"] as? Int { return seq }
    for key in ["checkpoint", "caught_up"] {
        if let o = line[key] as? [String: Any], let seq = o["seq"] as? Int { return seq }
    }
    return nil
}

@Suite(.serialized) struct SubscriptionTests {
    /// The catch-up from the journal, `caught_up`, then each record as it is committed.
    @Test func aSubscriberGetsTheJournalThenEachRecordLive() throws {
        let daemon = TestDaemon("subscribe-live")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "mail", session: "s1", (0..<20).map { #"{"type":"when","name":"n\#($0)"}"# })
        let subscriber = try Subscriber(daemon, #"{"from":"oldest","type":"when"}"#)
        let first = try subscriber.next()
        #expect((first?["subscribed"] as? [String: Any])?["protocol"] as? Int == 1)
        let catchUp = try subscriber.lines { $0["caught_up"] != nil }
        let names = catchUp.compactMap { $0["name"] as? String }
        #expect(names == (0..<20).map { "n\($0)" })
        let seqs = catchUp.compactMap { $0["_seq"] as? Int }
        #expect(seqs == seqs.sorted() && Set(seqs).count == 20)

        let sent = Date()
        try sendSession(daemon, app: "mail", session: "s1", [#"{"type":"when","name":"live"}"#])
        let live = try subscriber.lines { $0["name"] as? String == "live" }
        #expect(Date().timeIntervalSince(sent) < 1, "a committed record reached the subscriber in under a second")
        #expect(live.last?["_seq"] as? Int == (seqs.last ?? 0) + 1)
    }

    /// Filters pass what they say, and while they skip records the subscriber is told how far
    /// whend has looked, so that a reconnect resumes without reading them again.
    @Test func filtersAndCheckpoints() throws {
        let daemon = TestDaemon("subscribe-filters")
        try daemon.start()
        defer { daemon.stop() }
        let subscriber = try Subscriber(daemon, #"{"session":"wanted","name":["a","c"]}"#)
        _ = try subscriber.lines { $0["caught_up"] != nil }
        try sendSession(daemon, app: "mail", session: "other", [#"{"type":"when","name":"a"}"#])
        try sendSession(
            daemon, app: "mail", session: "wanted",
            [#"{"type":"when","name":"a"}"#, #"{"type":"when","name":"b"}"#, #"{"type":"when","name":"c"}"#])
        let got = try subscriber.lines { $0["name"] as? String == "c" }.filter { $0["_seq"] != nil }
        #expect(got.map { $0["name"] as? String } == ["a", "c"])
        #expect(got.allSatisfy { $0["session"] as? String == "wanted" })
        // Records it does not want move its checkpoint on.
        try sendSession(daemon, app: "mail", session: "other", (0..<5).map { #"{"type":"when","name":"x\#($0)"}"# })
        let checkpoint = try subscriber.lines(until: { $0["checkpoint"] != nil }, timeout: 5).last
        #expect(seenThrough(checkpoint ?? [:]) == (got.last?["_seq"] as? Int ?? 0) + 5)
    }

    /// What a subscriber sends after its first line is ignored, even when it came in the same
    /// write: an event there is not stored (it once was, as the rest of that read was taken
    /// as events), and the subscription is served as asked.
    @Test func linesAfterTheSubscribeLineAreNotStored() throws {
        let daemon = TestDaemon("subscribe-smuggle")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "mail", session: "s1", [#"{"type":"when","name":"before"}"#])
        let socket = try BlockingSocket(path: daemon.socketPath)
        try socket.send(
            #"{"subscribe":{"from":"oldest"}}"# + "\n" + #"{"type":"when","name":"smuggled","app":"x"}"# + "\n")
        let subscriber = Subscriber(reading: socket)
        let caughtUp = try subscriber.lines { $0["caught_up"] != nil }
        #expect(caughtUp.compactMap { $0["name"] as? String } == ["before"])
        try socket.send(#"{"type":"when","name":"later","app":"x"}"# + "\n")
        try sendSession(daemon, app: "mail", session: "s1", [#"{"type":"when","name":"after"}"#])
        let live = try subscriber.lines { $0["name"] as? String == "after" }
        #expect(live.compactMap { $0["name"] as? String } == ["after"])
        #expect(daemon.records().compactMap { $0["name"] as? String } == ["before", "after"])
    }

    /// For any schedule of disconnects (and a restart of whend among them), a subscriber that
    /// resumes with `after` set to the last `_seq` it was told of gets every record its filter
    /// passes, exactly once, in order.
    @Test(arguments: [UInt64(1), 2, 3]) func resumingFromTheLastSeqSeenMissesAndRepeatsNothing(seed: UInt64) throws {
        try resumeSchedule(seed: seed, killed: false)
    }

    /// The same across a SIGKILL of whend: a record sent to a subscriber was acknowledged,
    /// so the journal whend recovers still holds it, and the numbering goes on after it.
    @Test(arguments: [UInt64(4), 5]) func resumingAcrossASIGKILLMissesAndRepeatsNothing(seed: UInt64) throws {
        try resumeSchedule(seed: seed, killed: true)
    }

    func resumeSchedule(seed: UInt64, killed: Bool) throws {
        var rng = SplitMix64(state: seed &* 0x9E37_79B9_7F4A_7C15)
        let daemon = TestDaemon("subscribe-resume-\(seed)", killed ? .live : .inProcess)
        try daemon.start()
        defer { daemon.stop() }
        let sessions = ["s1", "s2", "s3"]
        let names = ["a", "b", "c", "d"]
        let wanted = (session: sessions[rng.int(3)], names: Set(names.filter { _ in rng.int(2) == 0 }))
        let filter =
            #"{"after":0,"session":"\#(wanted.session)""#
            + (wanted.names.isEmpty
                ? "" : #","name":[\#(wanted.names.sorted().map { "\"\($0)\"" }.joined(separator: ","))]"#)
        var received: [Int] = []
        var after = 0
        var restarted = false
        for round in 0..<12 {
            // Some events, from any session, before and while the subscriber reads.
            for _ in 0..<(1 + rng.int(3)) {
                let session = sessions[rng.int(3)]
                try sendSession(
                    daemon, app: "app", session: session,
                    (0..<(1 + rng.int(30))).map { _ in #"{"type":"when","name":"\#(names[rng.int(4)])"}"# })
            }
            let request = filter.replacingOccurrences(of: #""after":0"#, with: #""after":\#(after)"#) + "}"
            let subscriber = try Subscriber(daemon, request)
            // Read a random number of lines, then go away without a word.
            let reads = rng.int(40)
            for _ in 0..<reads {
                guard let line = try subscriber.next(timeout: 0.5) else { break }
                if let seq = line["_seq"] as? Int {
                    received.append(seq)
                    #expect(line["session"] as? String == wanted.session)
                    #expect(wanted.names.isEmpty || wanted.names.contains(line["name"] as? String ?? ""))
                }
                if let seen = seenThrough(line) { after = max(after, seen) }
            }
            if round == 6 && !restarted {
                if killed { daemon.crash() } else { daemon.stop() }
                try daemon.start()
                restarted = true
            }
        }
        // The rest, to the end.
        let last = try Subscriber(
            daemon, filter.replacingOccurrences(of: #""after":0"#, with: #""after":\#(after)"#) + "}")
        for line in try last.lines(until: { $0["caught_up"] != nil }) {
            if let seq = line["_seq"] as? Int { received.append(seq) }
        }
        // What the journal holds that the filter passes, read independently of whend's filter.
        let expected = daemon.records().filter {
            $0["session"] as? String == wanted.session && $0["_origin"] == nil
                && (wanted.names.isEmpty || wanted.names.contains($0["name"] as? String ?? ""))
        }.compactMap { $0["_seq"] as? Int }
        #expect(received == expected, "seed \(seed): \(received.count) received, \(expected.count) expected")
    }

    /// A subscriber that reads nothing never holds ingest: events are acknowledged as ever
    /// while it lags, and after the stall limit it is disconnected.
    /// Once retention has deleted every record, a subscriber that resumes inside them is told
    /// they are gone (`gap`), and its catch-up names the last `_seq` whend examined, not 0; it
    /// used to get `caught_up` where it asked, then later records, and no word of the loss.
    @Test func aResumeIntoRecordsRetentionDeletedEveryOneOfIsToldOfTheGap() throws {
        let daemon = TestDaemon("subscribe-gap-empty")
        // Fifteen records, then retention deletes them all, on a clock 15 years ahead: what is
        // left is the empty segment that keeps _seq 16.
        var configuration = JournalConfiguration(directory: daemon.journal)
        configuration.segmentMaxAge = 1
        configuration.retentionMaxAge = 60
        try DurableFile.createDirectory(daemon.journal.path)
        final class Clock: @unchecked Sendable {
            let lock = NSLock()
            var date = Date().addingTimeInterval(15 * 365 * 86400)
            var now: Date { lock.withLock { date } }
        }
        let clock = Clock()
        let writer = try JournalWriter(configuration: configuration, now: { clock.now })
        writer.start(heartbeatInterval: 0.01)
        var batch = JournalBatch()
        for n in 1...15 {
            batch.bodies += Array(#""type":"when","name":"n\#(n)","app":"a","_rt":"2026-11-26T10:00:00Z""#.utf8)
            batch.ends.append(batch.bodies.count)
        }
        let done = DispatchSemaphore(value: 0)
        writer.submit(batch) { _ in done.signal() }
        done.wait()
        clock.lock.withLock { clock.date += 2 }
        #expect(eventually(10) { daemon.journal.segments().map(\.firstSeq) == [16] }, "\(daemon.journal.segments())")
        writer.shutdown()
        try daemon.start()
        defer { daemon.stop() }

        let resumed = try Subscriber(daemon, #"{"after":12}"#)
        let oldest = try Subscriber(daemon, #"{"from":"oldest"}"#)
        let first = try resumed.lines { $0["caught_up"] != nil }
        #expect(first.count == 3, "\(first)")
        #expect((first[1]["gap"] as? [String: Any])?["from"] as? Int == 13, "\(first)")
        #expect((first[1]["gap"] as? [String: Any])?["through"] as? Int == 15, "\(first)")
        #expect(seenThrough(first[2]) == 15)
        let all = try oldest.lines { $0["caught_up"] != nil }
        #expect(all.count == 2 && seenThrough(all[1]) == 15, "\(all)")
        try sendSession(daemon, app: "a", session: "s", [#"{"type":"when","name":"after"}"#])
        #expect(try resumed.lines { $0["_seq"] != nil }.last?["_seq"] as? Int == 16)
    }

    /// A busy subscriber whose group a reload takes away gets the whole lines sent before,
    /// then `forbidden`: the close used to drop what was pending, mid-record, and the reason.
    @Test func aRevokedBusySubscriberIsToldWhyAfterWholeLines() throws {
        let file = scratchDirectory("subscribe-revoke-busy-conf") + "/whend.conf"
        try "subscribe_group = users\n".write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = TestDaemon("subscribe-revoke-busy", arguments: ["--config", file])
        try daemon.start()
        defer { daemon.stop() }
        chmod(daemon.directory, 0o755)
        let pad = String(repeating: "x", count: 1500)
        try sendSession(
            daemon, app: "a", session: "s",
            (0..<3000).map { #"{"type":"when","name":"n\#($0)","context":{"pad":"\#(pad)"}}"# })
        // A member that reads slowly: a busy connection with writes pending when the reload comes.
        let (p, out) = try memberSubscriber(daemon, pause: 0.01)
        usleep(500_000)
        try "subscribe_group = \n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try daemon.whenctl(["reload"]).status == 0)
        // Ended by whend's revocation; if that never comes, by this, not by the suite's limit.
        let pid = p.processIdentifier
        let overdue = DispatchWorkItem { kill(pid, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + 60, execute: overdue)
        let text = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        overdue.cancel()
        let lines = text.split(separator: 0x0A, omittingEmptySubsequences: false)
        #expect(text.last == 0x0A, "the last line is whole")
        let parsed = lines.dropLast().map { try? JSONSerialization.jsonObject(with: Data($0)) as? [String: Any] }
        #expect(parsed.allSatisfy { $0 != nil }, "every line whole")
        let last = parsed.last.flatMap { $0 }
        #expect((last?["error"] as? [String: Any])?["code"] as? String == "forbidden", "\(String(describing: last))")
        #expect(parsed.count < 3000, "ended before the end: \(parsed.count) lines")
    }

    /// A subscriber that leaves frees its `max_subscribers` place at once: the next one is
    /// served, not told `unavailable` (the place was held until the reader's next checkpoint,
    /// about a second).
    @Test func aSubscriberThatLeavesFreesItsPlaceAtOnce() throws {
        let daemon = TestDaemon("subscribe-place", arguments: ["--max-subscribers", "1"])
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "a", session: "s", [#"{"type":"when","name":"n"}"#])
        /// Subscribes as soon as a place is free; how long that took.
        func subscribeWhenFree() throws -> (Subscriber, TimeInterval) {
            let started = Date()
            while true {
                let subscriber = try Subscriber(daemon, #"{"from":"oldest"}"#)
                if try subscriber.next()?["subscribed"] != nil {
                    return (subscriber, Date().timeIntervalSince(started))
                }
                guard Date().timeIntervalSince(started) < 10 else { throw TestFailure(description: "no place in 10 s") }
                usleep(5000)
            }
        }
        var subscriber: Subscriber? = try subscribeWhenFree().0
        var waits: [TimeInterval] = []
        for _ in 0..<8 {
            // Caught up (the hub reads for it), then gone: its connection closed.
            _ = try subscriber?.lines { $0["caught_up"] != nil }
            subscriber = nil
            let (next, waited) = try subscribeWhenFree()
            waits.append(waited)
            subscriber = next
        }
        #expect(waits.allSatisfy { $0 < 0.5 }, "seconds until the place was free: \(waits)")
    }

    /// A subscriber that reads nothing does not hold a stop for `shutdown_timeout`: what it
    /// has not read is given up after a second (it resumes from its last `_seq`). It held the
    /// stop for the whole timeout, as its connection waited for a flush that never ended.
    @Test func aStalledSubscriberDoesNotHoldTheStop() throws {
        let daemon = TestDaemon("subscribe-stall-stop", arguments: ["--shutdown-timeout", "60"])
        try daemon.start()
        try sendBacklog(daemon, megabytes: 4)
        let subscriber = try Subscriber(daemon, #"{"from":"oldest"}"#)
        usleep(1_000_000)
        let started = Date()
        #expect(daemon.stop() == 0)
        let took = Date().timeIntervalSince(started)
        #expect(took < 20, "the stop took \(took) s of its 60 s timeout")
        _ = subscriber
    }

    @Test func aSubscriberThatReadsNothingHoldsNoIngestAndIsDisconnected() throws {
        let daemon = TestDaemon("subscribe-slow")
        try daemon.start()
        defer { daemon.stop() }
        try sendBacklog(daemon, megabytes: 8)
        let subscriber = try Subscriber(daemon, #"{"from":"oldest"}"#)
        usleep(500_000)
        // Meanwhile ingest goes on: every event is acknowledged.
        let started = Date()
        try sendSession(daemon, app: "app", session: "during", (0..<2000).map { #"{"type":"when","name":"d\#($0)"}"# })
        #expect(Date().timeIntervalSince(started) < 5)
        // The subscriber that took nothing is let go once the stall limit (10 s) passes: what
        // it reads now ends, and not at the journal's end (which it has not reached).
        sleep(12)
        var lines = 0
        var caughtUp = false
        var last: [String: Any]?
        while let line = try subscriber.next(timeout: 3) {
            lines += 1
            if line["caught_up"] != nil { caughtUp = true }
            last = line
        }
        #expect(subscriber.closed, "the stalled subscriber was disconnected")
        #expect(!caughtUp && lines < 8000, "it was let go before the end (\(lines) lines)")
        // After what it had not read, the line that says why: it was not dropped by the close.
        let error = last?["error"] as? [String: Any]
        #expect(error?["code"] as? String == "too_slow", "the last line: \(String(describing: last))")
    }

    /// Errors about the subscription itself, on its first line.
    @Test func aSubscriptionThatCannotBeHonouredIsRefused() throws {
        let daemon = TestDaemon("subscribe-refused")
        try daemon.start()
        defer { daemon.stop() }
        for (request, code) in [
            (#"{"subscribe":{"after":-1}}"#, "invalid_field"),
            (#"{"subscribe":{"sesion":"s1"}}"#, "invalid_field"),
            (#"{"subscribe":{"after":1,"from":"now"}}"#, "invalid_field"),
            (#"{"subscribe":{"protocol":2}}"#, "unsupported_protocol"),
            (#"{"subscribe":[]}"#, "invalid_field"),
            // A filter given twice, an empty list (which would pass nothing), a day the
            // calendar has not, a _seq this journal never acknowledged: each was taken.
            (#"{"subscribe":{"app":"a","app":"b"}}"#, "invalid_field"),
            (#"{"subscribe":{"type":[]}}"#, "invalid_field"),
            (#"{"subscribe":{"name":[]}}"#, "invalid_field"),
            (#"{"subscribe":{"since":"2024-02-30T00:00:00Z"}}"#, "invalid_field"),
            (#"{"subscribe":{"after":1000}}"#, "invalid_field"),
        ] {
            let answers = try exchange(daemon.socketPath, [request])
            #expect(answers.errors.map(\.code) == [code], "\(request)")
        }
        // Not the first line: an event line refused, the connection served on.
        let answers = try exchange(daemon.socketPath, [helloWithAcks, #"{"subscribe":{}}"#])
        #expect(answers.errors.map(\.code) == ["misplaced_hello"])
    }
}

/// Many subscribers at once, joining whend's shared reading at different moments and one
/// falling behind it: each gets exactly the records its filter passes, once, in order.
@Suite struct ConcurrentSubscriptionTests {
    @Test(arguments: [UInt64(11), 12]) func eachOfManySubscribersGetsExactlyItsRecords(seed: UInt64) throws {
        var rng = SplitMix64(state: seed &* 0x9E37_79B9_7F4A_7C15)
        let daemon = TestDaemon("subscribe-many-\(seed)")
        try daemon.start()
        defer { daemon.stop() }
        let sessions = ["s1", "s2", "s3"]
        let pad = String(repeating: "p", count: 1000)
        // Before anyone subscribes: some history to catch up on.
        try sendSession(daemon, app: "app", session: "s1", (0..<200).map { #"{"type":"when","name":"h\#($0)"}"# })
        let filters =
            [#"{"from":"oldest"}"#, #"{"from":"oldest","session":"s2"}"#, #"{"from":"oldest","name":"b"}"#]
            + (0..<3).map { _ in #"{"from":"oldest","session":"\#(sessions[rng.int(3)])"}"# }
        let total = 200 + 12 * 1000
        let caughtUp = DispatchSemaphore(value: 0)
        final class Result: @unchecked Sendable { var seqs: [Int] = []; var failure: String? }
        let results = filters.map { _ in Result() }
        let group = DispatchGroup()
        for (i, filter) in filters.enumerated() {
            let startAfter = UInt32(rng.int(400_000))
            // The first reads slowly for a while: whend's shared reading lets it go, and it
            // reads on its own after.
            let slow = i == 0
            group.enter()
            Thread {
                defer { group.leave() }
                usleep(startAfter)
                do {
                    let subscriber = try Subscriber(daemon, filter)
                    var pausedOnce = false
                    while let line = try subscriber.next(timeout: 20) {
                        if let seq = line["_seq"] as? Int { results[i].seqs.append(seq) }
                        if line["caught_up"] != nil { caughtUp.signal() }
                        if slow && !pausedOnce && line["caught_up"] != nil {
                            pausedOnce = true
                            sleep(4)
                        }
                        if let seen = seenThrough(line), seen >= total { break }
                    }
                } catch {
                    results[i].failure = "\(error)"
                }
            }.start()
        }
        // Some while they join, the rest once all have caught up (the slow one pausing then).
        for part in 0..<12 {
            if part == 4 {
                for _ in filters { _ = caughtUp.wait(timeout: .now() + 20) }
            }
            try sendSession(
                daemon, app: "app", session: sessions[part % 3],
                (0..<1000).map { #"{"type":"when","name":"\#(["a", "b", "c"][$0 % 3])","context":{"pad":"\#(pad)"}}"# })
        }
        #expect(group.wait(timeout: .now() + 60) == .success)
        let records = daemon.records()
        for (i, filter) in filters.enumerated() {
            let object = try JSONSerialization.jsonObject(with: Data(filter.utf8)) as? [String: Any] ?? [:]
            let expected = records.filter { r in
                (object["session"].map { $0 as? String == r["session"] as? String } ?? true)
                    && (object["name"].map { $0 as? String == r["name"] as? String } ?? true)
            }.compactMap { $0["_seq"] as? Int }
            #expect(results[i].failure == nil, "\(filter): \(results[i].failure ?? "")")
            #expect(
                results[i].seqs == expected, "seed \(seed), \(filter): \(results[i].seqs.count) of \(expected.count)")
        }
    }
}

/// whend's shared reading for subscribers that caught up, on a real journal: one that joins
/// while the reading is further on is handed what it missed from the newest records kept.
@Suite struct SubscriptionHubTests {
    @Test func aMemberJoiningBehindTheHubIsHandedWhatItMissed() throws {
        let daemon = TestDaemon("subscription-hub")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "app", session: "s", (1...50).map { #"{"type":"when","name":"n\#($0)"}"# })
        let hub = SubscriptionHub(journal: daemon.journal, committed: { 50 })
        let first = SubscriptionHub.Member(filter: RecordFilter(), after: 0)
        #expect(hub.join(first, after: 0))
        #expect(eventually(10) { hub.examined == 50 })
        // Joining at 40, with the hub at 50: records 41…50 come from what the hub kept.
        let late = SubscriptionHub.Member(filter: RecordFilter(names: ["n41", "n45", "n50", "n10"]), after: 40)
        #expect(hub.join(late, after: 40))
        let taken = late.take(position: hub.examined)
        let handed = (String(decoding: taken.lines, as: UTF8.self), taken.examined)
        let names = handed.0.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["name"] as? String
        }
        #expect(names == ["n41", "n45", "n50"])
        #expect(handed.1 == 50)
        hub.leave(first)
        hub.leave(late)
    }
}
