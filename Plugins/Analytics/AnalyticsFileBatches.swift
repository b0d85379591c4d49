import BuiltinPluginSupport
import Foundation
import WhendPluginSDK
import WhendRecord
import WhendSystem
import WhendWire

/// With a file as the only destination, the pipeline's own thread writes the batches to it:
/// the file is then where events wait, and `flush()` makes them durable before the pipeline's
/// cursor passes them, the promise the spool keeps for an endpoint. Each event was written to
/// the spool, then read back into a batch by a sender thread and written again, with a lock
/// taken per event between the two threads: a third of analytics' time, for a destination that
/// is never down for long.
///
/// A batch holds at most `batchEvents` events and `batchBytes` bytes, as the sender's do, and
/// ends at each `flush()` (the pipeline's checkpoint), so a quiet pipeline's events are in the
/// file within its checkpoint's period rather than a flush interval.
final class AnalyticsFileBatches {
    private let file: AnalyticsFileDestination
    private let host: PluginHost
    private let batchEvents: Int
    private let batchBytes: Int
    /// The open batch, `{"batch":[` and its events so far.
    private var batch: [UInt8] = []
    private var batchCount = 0
    /// The events' bytes in the open batch, each with one separator, as the sender counts them.
    private var batchSize = 0
    /// Whole batches (lines) not yet written.
    private var pending: [UInt8] = []
    private var pendingEvents = 0
    private var clock = RFC3339Clock()

    init(file: AnalyticsFileDestination, host: PluginHost, batchEvents: Int, batchBytes: Int) {
        self.file = file
        self.host = host
        self.batchEvents = batchEvents
        self.batchBytes = batchBytes
    }

    deinit {
        // What the last records gave, written (a replay's file holds every event): records past
        // the saved cursor are handled again after a restart, and the same message ids come twice.
        try? flush()
    }

    /// Adds one event. A failure to write earlier batches is thrown before the event is taken,
    /// so the record retried adds it once.
    func append(_ event: [UInt8]) throws {
        if pending.count >= 64 << 10 { try writePending() }
        if batchCount > 0 && (batchCount >= batchEvents || batchSize + event.count + 1 > batchBytes - 64) {
            closeBatch()
        }
        if batchCount == 0 {
            batch.append(contentsOf: #"{"batch":["#.utf8)
        } else {
            batch.append(UInt8(ascii: ","))
        }
        batch += event
        batchCount += 1
        batchSize += event.count + 1
    }

    /// Ends the open batch, writes what waits and syncs the file.
    func flush() throws {
        closeBatch()
        try writePending()
        do {
            try file.sync()
        } catch {
            throw PluginError.fail("analytics: cannot sync \(file.path): \(error)")
        }
    }

    /// The open batch becomes a line: `],"sentAt":…}` as `AnalyticsSender.batchBody` ends one.
    private func closeBatch() {
        guard batchCount > 0 else { return }
        batch.append(contentsOf: #"],"sentAt":"#.utf8)
        var now: [UInt8] = []
        clock.appendNow(to: &now)
        appendJSONString(now, to: &batch)
        batch.append(UInt8(ascii: "}"))
        batch.append(0x0A)
        pending += batch
        pendingEvents += batchCount
        batch.removeAll(keepingCapacity: true)
        batchCount = 0
        batchSize = 0
    }

    private func writePending() throws {
        guard !pending.isEmpty else { return }
        do {
            try file.append(pending)
        } catch {
            // Kept, whole: the next write or flush tries again (a failed write leaves the file
            // as it was).
            throw PluginError.fail("analytics: cannot write \(file.path): \(error)")
        }
        host.count("events_sent", by: Int64(pendingEvents))
        pending.removeAll(keepingCapacity: true)
        pendingEvents = 0
    }
}
