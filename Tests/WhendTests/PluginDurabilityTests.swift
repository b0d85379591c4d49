import Foundation
import Testing
import WhendJournal
import WhendWire

/// The `_seq`s of the analytics events a file holds: each event's `messageId` is
/// `whend-<_seq>-<id>`, in the destination's batches and in the spool's lines alike.
func analyticsSeqs(in path: String) -> Set<UInt64> {
    let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    var seqs = Set<UInt64>()
    for piece in text.components(separatedBy: #""messageId":"whend-"#).dropFirst() {
        if let seq = UInt64(piece.prefix { $0 != "-" }) { seqs.insert(seq) }
    }
    return seqs
}

/// The pipeline's saved cursor, as a restarted worker reads it.
func savedCursor(_ daemon: TestDaemon, pipeline: String) -> UInt64? {
    let bytes = FileManager.default.contents(atPath: daemon.stateDirectory + "/pipelines/\(pipeline)/cursor")
    return bytes.flatMap { UInt64(String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) }
}

/// The `_seq`s of the clients' `when` events in the journal, each one an analytics event.
func clientWhenSeqs(_ daemon: TestDaemon, through: UInt64 = .max) -> [UInt64] {
    var seqs: [UInt64] = []
    JournalReader(directory: daemon.journal).read { record, _ in
        guard let seq = record.seq else { return true }
        guard seq <= through else { return false }
        if let o = try? JSONSerialization.jsonObject(with: Data(buffer: record.line)) as? [String: Any],
            o["type"] as? String == "when", o["_origin"] == nil
        {
            seqs.append(seq)
        }
        return true
    } onProblem: {
        Issue.record("journal problem: \($0)")
    }
    return seqs
}

extension PowerCutTests {
    /// A plugin's writes are durable before its pipeline's cursor passes them: after each power
    /// cut, every event of analytics' (built-in, to its default file) that the synced cursor
    /// had passed is in its file or in its spool, synced; and once it has caught up, every event
    /// is in the file. Before the fix, the spool and the file were appended without a sync
    /// while the synced cursor went past them, and the cut took them both.
    @Test func aPowerCutLosesNoAnalyticsEventItsCursorPassed() throws {
        var passedAndLost = 0
        var passed = 0
        let analytics = "/plugins/analytics"
        let (outcome, daemon, _, fs) = try powerCutRounds(
            "pc-analytics", rounds: 4, durability: "fsync", pipelines: true
        ) { daemon, round, _ in
            guard let cursor = savedCursor(daemon, pipeline: "analytics") else { return }
            let held = analyticsSeqs(in: daemon.stateDirectory + analytics + "/events.ndjson")
                .union(analyticsSeqs(in: daemon.stateDirectory + analytics + "/spool.ndjson"))
            let seqs = clientWhenSeqs(daemon, through: cursor)
            let lost = seqs.filter { !held.contains($0) }
            passed = seqs.count
            passedAndLost += lost.count
            print(
                "analytics power cut \(round): cursor \(cursor), \(seqs.count) events passed, \(lost.count) neither in the file nor in the spool"
            )
        }
        #expect(outcome.ackedLost == 0)
        #expect(passed > 0, "the analytics cursor passed no event")
        #expect(passedAndLost == 0, "\(passedAndLost) events the analytics cursor had passed were lost by a cut")
        // Caught up: every event reached the file, whatever the cuts.
        #expect(eventually(60) { (try? daemon.pipeline("analytics"))?["lag"] as? Int == 0 })
        let all = clientWhenSeqs(daemon)
        let file = daemon.stateDirectory + analytics + "/events.ndjson"
        _ = eventually(30) { analyticsSeqs(in: file).isSuperset(of: all) }
        let inFile = analyticsSeqs(in: file)
        let missing = all.filter { !inFile.contains($0) }
        print(
            "analytics power cuts: 4 cuts, \(outcome.acked) acked, \(all.count) events, \(missing.count) never in the file"
        )
        #expect(missing.isEmpty, "\(missing.count) of \(all.count) events never reached the analytics file")
        #expect(daemon.stop() == 0)
        fs.cut()
    }
}

@Suite(.serialized) struct AnalyticsSpoolTests {
    /// Under steady load the spool never empties, so compacting it only when empty never
    /// compacted it: it grew with every event delivered, and a killed worker's successor sent
    /// all of them again. Delivered events now leave it once they are worth a rewrite (at least
    /// `spool_compact_bytes`, and at least the undelivered part), so the spool stays near what
    /// is undelivered and a restart sends again only what was delivered since the last
    /// compaction. Events stream in faster than one answer of the endpoint (100 ms) comes back,
    /// so the spool is never empty while they do; the worker is killed mid-stream. Before the
    /// fix: the spool grew to 868,173 bytes and all 1,460 delivered events were sent again.
    @Test func theSpoolIsCompactedUnderSteadyLoadAndARestartResendsLittle() throws {
        let endpoint = try HTTPTestServer(answers: [.init(status: 200, delay: 0.1)])
        let directory = scratchDirectory("spool-conf")
        let configuration = directory + "/whend.conf"
        try """
        plugin.analytics = {"endpoint": "http://127.0.0.1:\(endpoint.port)/v1/batch", "file": null, "flush_interval": 0.05, "batch_events": 2500, "spool_compact_bytes": 8192}

        """.write(toFile: configuration, atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live(
            "spool-steady", arguments: ["--builtin-pipelines", "true", "--config", configuration])
        try daemon.start()
        defer {
            daemon.stop()
            endpoint.stop()
        }
        let spool = daemon.stateDirectory + "/plugins/analytics/spool.ndjson"
        var sent = 0
        var largest = 0
        /// Streams `chunks` chunks of 20 events, one every 40 ms (500 events/s), noting the
        /// spool's largest size.
        func stream(_ chunks: Int) throws {
            for _ in 0..<chunks {
                try sendSession(
                    daemon, app: "com.example.steady", session: "s",
                    (sent..<(sent + 20)).map {
                        #"{"type":"when","name":"tick","id":"s-\#($0)","params":{"n":\#($0),"pad":"\#(String(repeating: "x", count: 200))"}}"#
                    })
                sent += 20
                usleep(40_000)
                let size = (try? FileManager.default.attributesOfItem(atPath: spool)[.size] as? Int) ?? 0
                largest = max(largest, size)
            }
        }
        try stream(75)
        let deliveredBeforeKill = Set(endpoint.exchanges.flatMap { analyticsIDs(in: $0.body) })
        let sizeAtKill = (try? FileManager.default.attributesOfItem(atPath: spool)[.size] as? Int) ?? 0
        guard let pid = try daemon.pipeline("analytics")?["pid"] as? Int, pid > 0 else {
            Issue.record("no analytics worker")
            return
        }
        let exchangesBeforeKill = endpoint.exchanges.count
        kill(pid_t(pid), SIGKILL)
        #expect(eventually { (try? daemon.pipeline("analytics")?["pid"] as? Int).map { $0 != pid && $0 > 0 } ?? false })
        try stream(10)
        #expect(eventually(30) { Set(endpoint.exchanges.flatMap { analyticsIDs(in: $0.body) }).count == sent })
        let resent = Set(endpoint.exchanges.dropFirst(exchangesBeforeKill).flatMap { analyticsIDs(in: $0.body) })
            .intersection(deliveredBeforeKill)
        print(
            "analytics spool under steady load: \(sent) events, largest spool \(largest) bytes, \(sizeAtKill) at the kill, \(deliveredBeforeKill.count) delivered before it, \(resent.count) sent again after it"
        )
        // Each event is ~500 bytes in the spool: 1,500 of them before the kill, ~800 KB.
        #expect(largest < 150_000, "the spool grew to \(largest) bytes")
        #expect(resent.count < 300, "\(resent.count) of \(deliveredBeforeKill.count) delivered events sent again")
    }
}

/// The messageIds of the events in a batch's body.
func analyticsIDs(in body: Data) -> [String] {
    let batch = (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["batch"] as? [[String: Any]]
    return (batch ?? []).compactMap { $0["messageId"] as? String }
}
