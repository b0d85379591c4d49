import SeededRandom
import Testing
import WhendDaemon
import WhendPipelines

/// The worker's exactly-once bookkeeping, in process and without a clock: a record is finished
/// once whend has stored every record derived from it and, where the pipeline ends in a
/// deferred stage, that stage has completed it; the cursor saved (the watermark) never passes
/// a record that is not finished, and reaches every record that is.
@Suite struct CompletionLedgerTests {
    /// What a record is waiting for, in the model.
    struct Pending {
        var derived: Int
        var acknowledged = 0
        var deferred: Bool
        var completed = false
    }

    /// For any schedule (acknowledgements of derived records and the deferred stage's
    /// completions arriving in any order, some before the worker marks the record accepted,
    /// completions one by one or "through" a record), the watermark after every step is the
    /// model's: the record before the oldest accepted record not finished, else the cursor.
    /// Seeds 12 and 17 found a stage that completes one record alone and then "through" an
    /// earlier one leaving the cursor stuck for good.
    @Test(arguments: 0..<400)
    func theWatermarkIsTheRecordBeforeTheOldestUnfinished(seed: UInt64) {
        var random = SplitMix64(state: seed &* 0x9E37_79B9 &+ 17)
        let ledger = CompletionTracker()
        let deferredStage = random.int(2) == 0
        let count = 1 + random.int(40)
        // Records' `_seq`s ascend, with gaps (retention, other pipelines' derived records).
        var seqs: [UInt64] = []
        var seq: UInt64 = UInt64(random.int(5))
        for _ in 0..<count {
            seq += 1 + UInt64(random.int(3))
            seqs.append(seq)
        }
        var records: [UInt64: Pending] = [:]
        var accepted: [UInt64] = []
        var completedThrough: UInt64 = 0
        /// Events that may happen now: an acknowledgement of one derived record of a record
        /// being or already handled, or the deferred stage's completion of one.
        enum Event { case acknowledge(UInt64), complete(UInt64) }
        var eligible: [Event] = []
        var next = 0
        var handling: UInt64?

        func begin() {
            let s = seqs[next]
            next += 1
            handling = s
            // A dropped record (no next) never reaches a deferred stage.
            let reachesDeferred = deferredStage && random.int(5) != 0
            let derived = random.int(4)
            records[s] = Pending(derived: derived, deferred: reachesDeferred)
            for _ in 0..<derived { eligible.append(.acknowledge(s)) }
            if reachesDeferred { eligible.append(.complete(s)) }
        }
        func finished(_ s: UInt64) -> Bool {
            let r = records[s]!
            return r.acknowledged >= r.derived && (!r.deferred || r.completed || s <= completedThrough)
        }
        func expected() -> UInt64 {
            let cursor = accepted.last ?? 0
            if let oldest = accepted.first(where: { !finished($0) }) { return oldest - 1 }
            return cursor
        }

        begin()
        var steps = 0
        while handling != nil || !eligible.isEmpty {
            steps += 1
            #expect(steps < 10_000)
            if steps >= 10_000 { return }
            let choice = random.int(4)
            if let s = handling, choice == 0 || eligible.isEmpty {
                let r = records[s]!
                ledger.accept(s, derivedCount: r.derived, deferredStage: r.deferred)
                accepted.append(s)
                handling = nil
                if next < seqs.count { begin() }
            } else if !eligible.isEmpty {
                let event = eligible.remove(at: random.int(eligible.count))
                switch event {
                case .acknowledge(let s):
                    records[s]!.acknowledged += 1
                    ledger.derivedStored(s)
                case .complete(let s):
                    // A stage that completes in order says so for everything through the newest
                    // record it was given and has completed, in one call.
                    // (Also from inside `handle`, before the worker accepts the record in hand.)
                    let given = Set(accepted).union(handling.map { [$0] } ?? [])
                    if random.int(4) == 0, given.contains(s) {
                        let through = s
                        let earlier = records.filter { $0.key <= through && $0.value.deferred && !$0.value.completed }
                        if earlier.keys.allSatisfy({ given.contains($0) }) {
                            completedThrough = max(completedThrough, through)
                            for k in earlier.keys { records[k]!.completed = true }
                            eligible.removeAll {
                                if case .complete(let c) = $0 { return c <= through }
                                return false
                            }
                            ledger.completeThrough(through)
                            #expect(ledger.watermark(acceptedThrough: accepted.last ?? 0) == expected(), "seed \(seed)")
                            continue
                        }
                    }
                    records[s]!.completed = true
                    ledger.complete(s)
                }
            }
            #expect(ledger.watermark(acceptedThrough: accepted.last ?? 0) == expected(), "seed \(seed) step \(steps)")
        }
        // Everything finished: the watermark is the last record.
        #expect(ledger.watermark(acceptedThrough: seqs.last!) == seqs.last!, "seed \(seed)")
    }
}
