import CLinux
import CWhendPlugin
import Foundation
import Logging
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendSystem
import WhendWire

/// The worker's side of the pipes to the daemon: derived records gathered into batches, and
/// the batches sent and not yet acknowledged.
final class WorkerOutput: @unchecked Sendable {
    // Unchecked: `cause`, `emitted`, `oversized` and `pending` belong to the worker's thread
    // (plugins emit from inside handle); `unacknowledged` and `nextBatch` are guarded by `lock`,
    // since acknowledgements come on the reading thread.
    @exclusivity(unchecked) var cause: UInt64 = 0
    /// Derived records emitted for the current record.
    @exclusivity(unchecked) var emitted = 0
    /// Bytes the current record derived when they cannot go to whend in one frame: then none
    /// of them goes, and the record goes to the dead letters.
    @exclusivity(unchecked) private(set) var oversized: Int?
    @exclusivity(unchecked) private var pending = DerivedBatchFrame()
    var pendingBytes: Int { pending.isEmpty ? 0 : pending.byteCount }
    private let lock = NSLock()
    private var unacknowledged: [UInt64: [UInt64]] = [:]
    private var nextBatch: UInt64 = 1
    private let completions: CompletionTracker
    private let link: WorkerLink

    init(completions: CompletionTracker, link: WorkerLink) {
        self.completions = completions
        self.link = link
    }

    func progress(cursor: UInt64, failures: Int, deadLetters: Int, skipped: UInt64) {
        send(
            WorkerFrame.encode(
                WorkerMessage.progress(
                    cursor: cursor, failures: UInt64(failures), deadLetters: UInt64(deadLetters), skipped: skipped)))
    }

    func counters(plugin: String, _ values: [String: Int64]) {
        send(WorkerFrame.encode(WorkerMessage.counters(plugin: plugin, values: values)))
    }

    /// What plugins emit from now on is derived from record `seq`.
    func begin(_ seq: UInt64) {
        cause = seq
        emitted = 0
        oversized = nil
        pending.beginRecord()
    }

    /// A derived record, for the daemon to append with `_origin` and `_cause` as the plugin
    /// wrote it (the daemon checks it). Fails once what the current record derived cannot go to
    /// the daemon in one frame.
    func emit(_ json: UnsafeBufferPointer<UInt8>, origin: String) -> Bool {
        if let bytes = oversized {
            oversized = bytes + json.count
            return false
        }
        if !pending.fits(origin: origin, count: json.count) && pending.holdsEarlierRecords {
            // The records of earlier records go first, in a frame of their own.
            let current = pending.takeCurrentRecord()
            flush()
            pending.restoreCurrentRecord(current)
        }
        guard pending.fits(origin: origin, count: json.count) else {
            // All or nothing: a record's derived records are stored together, or not at all.
            oversized = pending.currentRecordBytes + json.count
            _ = pending.takeCurrentRecord()
            emitted = 0
            return false
        }
        pending.append(cause: cause, origin: origin, json: json)
        emitted += 1
        return true
    }

    /// Forgets what the current record derived so far (its attempt failed).
    func discardCurrentRecord() {
        if oversized == nil { _ = pending.takeCurrentRecord() }
        oversized = nil
        emitted = 0
    }

    /// Sends what was derived since the last flush as one batch.
    func flush() {
        guard !pending.isEmpty else { return }
        let batch: UInt64 = lock.withLock {
            defer { nextBatch += 1 }
            unacknowledged[nextBatch] = pending.causes
            return nextBatch
        }
        let frame = pending.finish(batch: batch)
        // The daemon is gone: nothing to report to.
        if frame.withUnsafeBytes({ writeFully(link.report, $0) }) != nil { link.daemonGone() }
        pending.reset()
    }

    /// The daemon stored `batch`: the records it came from may be passed.
    func stored(batch: UInt64) {
        let causes = lock.withLock { unacknowledged.removeValue(forKey: batch) } ?? []
        for cause in causes { completions.derivedStored(cause) }
    }

    func send(_ frame: [UInt8]) {
        // The daemon is gone: nothing to report to.
        if !writeAll(link.report, frame) { link.daemonGone() }
    }
}
