import CLinux
import CWhendPlugin
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
    /// The records in `derived`, in the order accepted (ascending), from `derivedHead` on; some
    /// may be done already (removed from `derived`): the watermark skips them.
    private var derivedOrder: [UInt64] = []
    private var derivedHead = 0
    /// Acknowledgements that came before the worker marked the record accepted.
    private var earlyDerived: [UInt64: Int] = [:]
    /// Records the deferred stage has, in order (from `deferredHead` on), not completed yet.
    private var deferred: [UInt64] = []
    private var deferredHead = 0
    /// Completed one by one out of order, not yet at the head.
    private var completedOutOfOrder: Set<UInt64> = []
    /// Everything up to here is completed (the deferred stage said so with `completeThrough`).
    private var completedThrough: UInt64 = 0

    package init() {}

    /// Record `seq` is done once `derivedCount` acknowledgements have come, and the deferred
    /// stage has completed it if `deferredStage`.
    package func accept(_ seq: UInt64, derivedCount: Int, deferredStage: Bool) {
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
            if deferredHead < deferred.count && deferred[deferredHead] == seq {
                deferredHead += 1
                while deferredHead < deferred.count, completedOutOfOrder.remove(deferred[deferredHead]) != nil {
                    deferredHead += 1
                }
                compact()
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
            while deferredHead < deferred.count,
                deferred[deferredHead] <= seq || completedOutOfOrder.remove(deferred[deferredHead]) != nil
            {
                deferredHead += 1
            }
            compact()
        }
    }

    private func compact() {
        if deferredHead == deferred.count {
            deferred.removeAll(keepingCapacity: true)
            deferredHead = 0
            lock.broadcast()
        } else if deferredHead > 4096 && deferredHead * 2 > deferred.count {
            deferred.removeFirst(deferredHead)
            deferredHead = 0
        }
    }

    /// The highest `_seq` up to which everything handled is finished.
    package func watermark(acceptedThrough cursor: UInt64) -> UInt64 {
        lock.withLock {
            var mark = cursor
            // The oldest still waiting: amortised O(1), where `derived.keys.min()` was a scan.
            while derivedHead < derivedOrder.count, derived[derivedOrder[derivedHead]] == nil { derivedHead += 1 }
            if derivedHead == derivedOrder.count {
                derivedOrder.removeAll(keepingCapacity: true)
                derivedHead = 0
            } else if derivedHead > 4096 && derivedHead * 2 > derivedOrder.count {
                derivedOrder.removeFirst(derivedHead)
                derivedHead = 0
            }
            if derivedHead < derivedOrder.count { mark = min(mark, derivedOrder[derivedHead] - 1) }
            if deferredHead < deferred.count { mark = min(mark, deferred[deferredHead] - 1) }
            return mark
        }
    }

    /// Waits until nothing is pending, at most `seconds`.
    func drain(seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        lock.withLock {
            while !(derived.isEmpty && deferredHead == deferred.count) && lock.wait(until: deadline) {}
        }
    }
}
