import BuiltinPluginSupport
import DequeModule
import Foundation
import PluginHTTP
import WhendPluginSDK
import WhendSystem
import WhendWire

/// Encoded events not yet delivered: in memory for the sender, and in a file so that a restart
/// sends them still. The file is the durable half of the promise the pipeline's cursor relies
/// on: `flush()` syncs it before the cursor passes its events, and delivered events leave it
/// only when it is compacted, after the destination holding them was synced (`compact`).
final class AnalyticsSpool: @unchecked Sendable {
    // Unchecked: all state is guarded by `condition`.
    private let condition = NSCondition()
    /// The events not yet delivered, oldest first: delivered ones leave from the front
    /// in O(1), where removing them from an array moved the whole backlog each time.
    private var events: Deque<[UInt8]> = []
    private var bytes = 0
    private var file: Int32
    /// The spool file's length: this plugin is its only writer, so no `lseek` per write.
    private var fileLength: off_t
    /// Lines spooled in memory, not yet written to the file.
    private var unwritten: [UInt8] = []
    /// Written to the file since its last sync.
    private var unsynced = false
    /// The spool file's name is not durable yet (it was just created).
    private var directoryUnsynced = false
    /// Bytes of the spool file (newlines included) that hold delivered events: what a restart
    /// would send again. Compaction drops them.
    private var deliveredBytes = 0
    let maxBytes: Int
    /// Delivered bytes that make a compaction due, at least: the spool file holds at most
    /// `maxBytes` undelivered bytes and fewer than `max(compactBytes, undelivered)` delivered
    /// ones (plus a batch, and a newline per event).
    let compactBytes: Int
    private let path: String
    /// The events the sender waits for to make a batch, while it waits.
    private var batchWaiter: Int?
    private var stopping = false
    /// Lines of the spool file found at start that were not whole events, and left out.
    private(set) var damagedLines = 0

    init(path: String, maxBytes: Int, compactBytes: Int = 1 << 20) throws {
        self.path = path
        self.maxBytes = maxBytes
        self.compactBytes = max(1, compactBytes)
        // Opened before it is read, and not through a symbolic link: one put in its place would
        // have whend send whatever it points at to the endpoint, and append to it. 0600 from the
        // start, as every compaction leaves it.
        var status = stat()
        let existed = lstat(path, &status) == 0
        file = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard file >= 0 else {
            throw PluginError.fail("analytics: cannot open the spool \(path): \(String(cString: strerror(errno)))")
        }
        let existing = existed ? FileManager.default.contents(atPath: path) : nil
        for line in (existing ?? Data()).split(separator: 0x0A) {
            // Only whole events: a line a write or a power cut cut short, or anything else put
            // there, would make the batch it joined unreadable, and the good events with it.
            let event = Array(line)
            guard Self.isObject(event) else {
                damagedLines += 1
                continue
            }
            events.append(event)
            bytes += line.count
        }
        directoryUnsynced = !existed
        fileLength = lseek(file, 0, SEEK_END)
    }

    deinit {
        try? writeUnwritten()
        close(file)
    }

    /// Whether `line` is one JSON object, as whend's own scanner reads one.
    private static func isObject(_ line: [UInt8]) -> Bool {
        line.withUnsafeBufferPointer { bytes in
            var scanner = JSONScanner(bytes)
            scanner.skipWhitespace()
            guard let (kind, _) = try? scanner.scanValue(), kind == .object else { return false }
            scanner.skipWhitespace()
            return scanner.atEnd
        }
    }

    /// Spools one event, in memory and in the spool file's write buffer. False when the spool
    /// is full; throws when the buffer, full, cannot be written (the pipeline then retries the
    /// record). The worker calls `flush()` before its cursor passes the record: an event is
    /// never passed without being in the spool file, synced.
    func append(_ line: [UInt8]) throws -> Bool {
        condition.lock()
        defer { condition.unlock() }
        // The buffer is written before the event joins it: a write that fails (a full disk)
        // then throws with the event not taken, and the record retried adds it once, where each
        // retry added it again.
        if unwritten.count >= 64 << 10 { try writeUnwritten() }
        // Full: the sender may only be behind (a replay reads faster than any destination
        // takes); wait a little for it to make room before refusing the record.
        if bytes + line.count > maxBytes {
            let deadline = Date().addingTimeInterval(1)
            while bytes + line.count > maxBytes && !stopping {
                guard condition.wait(until: deadline) else { return bytes + line.count <= maxBytes }
            }
        }
        // Whole lines only: the spool is read back line by line after a restart.
        unwritten += line
        unwritten.append(0x0A)
        events.append(line)
        bytes += line.count
        // The sender waits for a first event, or for a batch (or half the spool's bytes).
        if events.count == 1 {
            condition.broadcast()
        } else if let need = batchWaiter, events.count >= need || bytes * 2 >= maxBytes {
            batchWaiter = nil
            condition.broadcast()
        }
        return true
    }

    /// Writes the spool file's buffer (one write where there was one per event) and makes the
    /// file durable: one `fdatasync` per flush, none when nothing was written since the last.
    func flush() throws {
        condition.lock()
        defer { condition.unlock() }
        try writeUnwritten()
        do {
            if unsynced {
                try DurableFile.syncData(file, path: path)
                unsynced = false
            }
            if directoryUnsynced {
                try DurableFile.syncDirectory(of: path)
                directoryUnsynced = false
            }
        } catch {
            throw PluginError.fail("analytics: \(error)")
        }
    }

    private func writeUnwritten() throws {
        guard !unwritten.isEmpty else { return }
        do {
            try DurableFile.append(unwritten, to: file, path: path, length: fileLength)
        } catch {
            throw PluginError.fail("analytics: \(error)")
        }
        fileLength += off_t(unwritten.count)
        unwritten.removeAll(keepingCapacity: true)
        unsynced = true
    }

    /// Waits until `events` events wait (or half the spool's bytes), or `seconds` passed, or
    /// `stop()`: a batch leaves when full, else at the flush interval. (The sender slept the
    /// interval out: meanwhile a fast pipeline filled the spool, and records failed.)
    func waitForBatch(of events: Int, seconds: TimeInterval) {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(seconds)
        while self.events.count < events && bytes * 2 < maxBytes && !stopping {
            batchWaiter = events
            guard condition.wait(until: deadline) else { break }
        }
        batchWaiter = nil
    }

    /// Up to `maxEvents` events of at most `maxBytes` bytes in all, waiting at most `wait`
    /// seconds for the first one.
    func peek(maxEvents: Int, maxBytes: Int, wait: TimeInterval) -> [[UInt8]] {
        condition.lock()
        defer { condition.unlock() }
        if events.isEmpty && !stopping { _ = condition.wait(until: Date().addingTimeInterval(wait)) }
        var batch: [[UInt8]] = []
        var size = 0
        for e in events {
            guard batch.count < maxEvents, size + e.count + 1 <= maxBytes - 64 || batch.isEmpty else { break }
            batch.append(e)
            size += e.count + 1
        }
        return batch
    }

    var count: Int { condition.withLock { events.count } }

    /// The spool file's length, what is buffered for it included.
    var fileBytes: Int { condition.withLock { Int(fileLength) + unwritten.count } }

    /// The first `n` events are delivered: they leave memory (making room for appends), and
    /// stay in the file until the next compaction.
    func remove(_ n: Int) {
        condition.lock()
        defer { condition.unlock() }
        for _ in 0..<min(n, events.count) {
            let event = events.removeFirst()
            bytes -= event.count
            deliveredBytes += event.count + 1
        }
        condition.broadcast()  // room for an append waiting on a full spool
    }

    /// Whether the file holds delivered events.
    var holdsDelivered: Bool { condition.withLock { deliveredBytes > 0 } }

    /// Whether the delivered part of the file is worth rewriting it for: at least
    /// `compactBytes`, and at least what the rewrite copies (the undelivered events), so that
    /// the copying costs at most once more what was delivered.
    var compactionDue: Bool {
        condition.withLock { deliveredBytes >= max(compactBytes, bytes + events.count) }
    }

    /// Drops the delivered events from the file: `syncDestination` first makes them durable
    /// where they were delivered (the file destination's `fdatasync`), then the undelivered ones
    /// replace the spool file (written beside, synced, renamed, the directory synced). Called by
    /// the sender, the only one to deliver, so nothing is delivered meanwhile. A failure leaves
    /// the file as it was: the delivered events are sent again after a restart, never lost.
    func compact(syncDestination: () throws -> Void) throws {
        try syncDestination()
        condition.lock()
        defer { condition.unlock() }
        var kept: [UInt8] = []
        kept.reserveCapacity(bytes + events.count)
        for e in events {
            kept += e
            kept.append(0x0A)
        }
        do {
            // The spool's own mode, as it was created.
            try DurableFile.replace(path, with: kept, mode: 0o600)
        } catch {
            throw PluginError.fail("analytics: cannot compact the spool: \(error)")
        }
        let reopened = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW)
        guard reopened >= 0 else {
            throw PluginError.fail("analytics: cannot open the spool \(path): \(String(cString: strerror(errno)))")
        }
        close(file)
        file = reopened
        fileLength = off_t(kept.count)
        // Every event in memory is in the new file, synced.
        unwritten.removeAll(keepingCapacity: true)
        unsynced = false
        directoryUnsynced = false
        deliveredBytes = 0
    }

    /// Ends every wait, for good: the plugin stops.
    func stop() {
        condition.withLock {
            stopping = true
            condition.broadcast()
        }
    }
}
