import CLinux
import CWhendPlugin
import DequeModule
import Foundation
import Logging
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

/// Records handled but not finished yet: a deferred stage has not completed them, or whend
/// has not yet stored the records derived from them. The cursor saved stays below the oldest.
package final class CompletionTracker: @unchecked Sendable {
    // Unchecked: guarded by `lock`; completions come from other threads.
    private let lock = NSCondition()
    /// Acknowledgements of derived records each record still waits for.
    private var derived: [UInt64: Int] = [:]
    /// The records in `derived`, in the order accepted (ascending); some
    /// may be done already (removed from `derived`): the watermark skips them.
    private var derivedOrder: Deque<UInt64> = []
    /// Acknowledgements that came before the worker marked the record accepted.
    private var earlyDerived: [UInt64: Int] = [:]
    /// Records the deferred stage has, in order, not completed yet.
    private var deferred: Deque<UInt64> = []
    /// Completed one by one out of order, not yet at the head.
    private var completedOutOfOrder: Set<UInt64> = []
    /// Everything up to here is completed (the deferred stage said so with `completeThrough`).
    private var completedThrough: UInt64 = 0

    package init() {}

    /// Record `seq` is done once `derivedCount` acknowledgements have come, and the deferred
    /// stage has completed it if `deferredStage`.
    package func accept(_ seq: UInt64, derivedCount: Int, deferredStage: Bool) {
        // Most records: done as they are handled, with nothing to wait for, and no lock to take.
        guard derivedCount > 0 || deferredStage else { return }
        lock.withLock {
            if derivedCount > 0 {
                let left = derivedCount - (earlyDerived.removeValue(forKey: seq) ?? 0)
                if left > 0 {
                    derived[seq] = left
                    derivedOrder.append(seq)
                }
            }
            if deferredStage && seq > completedThrough && completedOutOfOrder.remove(seq) == nil {
                deferred.append(seq)
            }
        }
    }

    /// One record derived from `seq` is stored.
    package func derivedStored(_ seq: UInt64) {
        lock.withLock {
            if let left = derived[seq] {
                derived[seq] = left > 1 ? left - 1 : nil
                if derived.isEmpty { lock.broadcast() }
            } else {
                // Bounded: acknowledgements of records never accepted must not grow this.
                if earlyDerived.count >= 1 << 16 { earlyDerived.removeAll() }
                earlyDerived[seq, default: 0] += 1
            }
        }
    }

    /// The deferred stage completed `seq` (in any order).
    package func complete(_ seq: UInt64) {
        lock.withLock {
            guard seq > completedThrough else { return }
            if deferred.first == seq {
                deferred.removeFirst()
                while let next = deferred.first, completedOutOfOrder.remove(next) != nil { deferred.removeFirst() }
                wakeDrainersIfIdle()
            } else {
                // Bounded: completions of records never accepted must not grow this.
                if completedOutOfOrder.count >= 1 << 20 { completedOutOfOrder.removeAll() }
                completedOutOfOrder.insert(seq)
            }
        }
    }

    /// The deferred stage completed every record it was given up to `seq`.
    package func completeThrough(_ seq: UInt64) {
        lock.withLock {
            completedThrough = max(completedThrough, seq)
            // Past those completed one by one too: a stage may use both calls, and a record it
            // completed alone just after `seq` left the head there for good (the cursor stuck,
            // retention held back; found by CompletionLedgerTests).
            while let next = deferred.first, next <= seq || completedOutOfOrder.remove(next) != nil {
                deferred.removeFirst()
            }
            wakeDrainersIfIdle()
        }
    }

    private func wakeDrainersIfIdle() {
        if deferred.isEmpty { lock.broadcast() }
    }

    /// The highest `_seq` up to which everything handled is finished.
    package func watermark(acceptedThrough cursor: UInt64) -> UInt64 {
        lock.withLock {
            var mark = cursor
            // The oldest still waiting: amortised O(1), where `derived.keys.min()` was a scan.
            while let oldest = derivedOrder.first, derived[oldest] == nil { derivedOrder.removeFirst() }
            if let oldest = derivedOrder.first { mark = min(mark, oldest - 1) }
            if let oldest = deferred.first { mark = min(mark, oldest - 1) }
            return mark
        }
    }

    /// Waits until nothing is pending, at most `seconds`.
    func drain(seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        lock.withLock {
            while !(derived.isEmpty && deferred.isEmpty) && lock.wait(until: deadline) {}
        }
    }
}
