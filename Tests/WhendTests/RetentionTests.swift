import Foundation
import SeededRandom
import Testing

@Suite(.serialized) struct RetentionTests {
    /// Retention waits for a pipeline held at its cursor (its destination down): past
    /// retention_max_bytes nothing it needs is deleted; past retention_hard_max_bytes the oldest
    /// segments go, and the loss is logged, counted and reported as a gap with its exact range.
    @Test func retentionWaitsForAPipelineUntilTheHardLimit() throws {
        let (daemon, seen) = try pipelineDaemon(
            "retention",
            settings: """
                segment_max_bytes = 4096
                retention_max_bytes = 12000
                retention_hard_max_bytes = 40000
                """, .live)
        let down = (seen as NSString).deletingLastPathComponent + "/down"
        #expect(FileManager.default.createFile(atPath: down, contents: nil))
        try daemon.start()
        func journalBytes() -> Int {
            let segments = daemon.journal.segments()
            return segments.map { (try? FileManager.default.attributesOfItem(atPath: $0.path)[.size] as? Int) ?? 0 }
                .reduce(0, +)
        }
        func firstSeq() -> UInt64? { daemon.journal.segments().first?.firstSeq }

        // Over the soft limit: every segment kept for the pipeline, which is still at _seq 0.
        var part = 0
        while journalBytes() < 24000 {
            try sendNoisyParts(daemon, part..<(part + 1))
            part += 1
            guard part < 400 else { throw TestFailure(description: "the journal does not grow: \(daemon.log)") }
        }
        #expect(firstSeq() == 1, "a segment the pipeline needs was deleted")
        #expect(daemon.waitForLog("retention: keeping"), "\(daemon.log)")
        #expect(try daemon.pipeline("rec")?["cursor"] as? Int == 0)

        // Over the hard limit: the oldest go, and the pipeline is told exactly what it lost.
        while firstSeq() == 1 {
            try sendNoisyParts(daemon, part..<(part + 1))
            part += 1
            guard part < 400 else {
                throw TestFailure(description: "nothing deleted past the hard limit: \(daemon.log)")
            }
        }
        // Once retention is done: what it says was lost is exactly what is gone.
        var lostThrough: UInt64 = 0
        #expect(
            eventually {
                lostThrough = (firstSeq() ?? 1) - 1
                return (try? daemon.pipeline("rec")?["lost_to_retention"] as? Int) == Int(lostThrough)
            })
        #expect(daemon.waitForLog("retention: pipeline rec loses _seq 1…"), "\(daemon.log)")
        #expect(daemon.log.contains("retention: pipeline rec loses _seq 1…"))
        let entry = try #require(try daemon.pipeline("rec"))
        #expect(entry["lost_to_retention"] as? Int == Int(lostThrough), "\(entry)")
        let metrics = try daemon.whenctl(["metrics"]).output
        #expect(
            metrics.contains(#"whend_pipeline_records_lost_to_retention_total{pipeline="rec"} \#(lostThrough)"#),
            "\(metrics)")
        let listed = try daemon.whenctl(["plugins"]).output
        #expect(listed.contains("LOST TO RETENTION \(lostThrough) records"), "\(listed)")

        // The worker starts again from its cursor: it finds the gap, says so with its exact
        // range and counts it; once the destination is back it carries on with the first record
        // kept. (Restarted while the destination is still down: else the old worker, whose
        // deleted segment stays readable through its open descriptor, could pass records first.)
        #expect(try daemon.whenctl(["plugins", "restart", "rec"]).status == 0)
        #expect(
            daemon.waitForLog(
                "_seq 1…\(lostThrough) are gone from the journal (retention deleted them before this pipeline read them); skipped \(lostThrough) records"
            ), "\(daemon.log)")
        #expect(eventually { (try? daemon.pipeline("rec")?["skipped"] as? Int) == Int(lostThrough) })
        try FileManager.default.removeItem(atPath: down)
        let total = part * 30
        #expect(try daemon.waitForPipeline("rec", cursor: total))
        #expect(daemon.stop() == 0)
    }

    /// `_seq` never goes back, whatever moment whend is SIGKILLed at, while retention deletes
    /// every record it has as fast as segments fill (a segment of 4 KiB; a journal kept under
    /// 1 byte). Each rotation leaves an empty segment that keeps the place and the next one
    /// renames over it: a kill at any point of that leaves a journal whose next `_seq` is past
    /// every acknowledged one. (Before, `_seq` began again at 1 and subscribers resuming
    /// `after` their last one waited past records they never got.)
    @Test func seqNeverGoesBackWhenRetentionEmptiesTheJournalAndWhendIsKilled() throws {
        let daemon = TestDaemon.live(
            "seq-kills", arguments: ["--segment-max-bytes", "4096", "--retention-max-bytes", "1"])
        try daemon.start()
        var random = SplitMix64(state: 34)
        var acknowledged = 0
        for round in 0..<12 {
            let acks = Counter()
            let done = DispatchSemaphore(value: 0)
            let socket = daemon.socketPath
            Thread.detachNewThread {
                let lines =
                    [helloWithAcks]
                    + (0..<20_000).map { #"{"type":"when","name":"tick","params":{"round":\#(round),"i":\#($0)}}"# }
                acks.set((try? exchange(socket, lines))?.acks.max() ?? 0)
                done.signal()
            }
            usleep(UInt32(20_000 + random.next() % 300_000))
            daemon.crash()
            done.wait()
            acknowledged += acks.value
            try daemon.start()
            let journal = try #require(daemon.status()["journal"] as? [String: Any])
            let lastSeq = journal["last_seq"] as? Int ?? 0
            #expect(lastSeq >= acknowledged, "round \(round): last _seq \(lastSeq), \(acknowledged) acknowledged")
            // The next record takes the next _seq.
            #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"after"}"#]).acks == [1])
            acknowledged += 1
            let next = (try daemon.status()["journal"] as? [String: Any])?["last_seq"] as? Int
            #expect(next == lastSeq + 1, "round \(round)")
        }
        #expect(acknowledged > 12 * 2, "the kills came before anything was stored")
        #expect(daemon.stop() == 0)
    }
}

/// A count one thread sets and another reads after it is done.
private final class Counter: @unchecked Sendable {
    // Unchecked: `stored` is guarded by `lock`.
    private let lock = NSLock()
    private var stored = 0
    func set(_ value: Int) { lock.withLock { stored = value } }
    var value: Int { lock.withLock { stored } }
}
