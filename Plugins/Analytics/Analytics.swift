import BuiltinPluginSupport
import Foundation
import PluginHTTP
import WhendPluginSDK
import WhendWire

/// Turns `when` records into track events and screen views into screen events, in the Segment
/// HTTP Tracking API's batch shape, and delivers the batches to an NDJSON file and/or an HTTP
/// endpoint. Events wait in a spool file under the plugin's state directory until delivered,
/// so a restart loses none; `messageId` is stable per record, so that what is sent twice after a
/// failure de-duplicates downstream. The configuration keys are in docs/plugins.md.
final class Analytics: WhendPlugin {
    static let name = "analytics"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    private let filter: AnalyticsFilter
    private let eventMaxBytes: Int
    private let spool: AnalyticsSpool
    private let sender: AnalyticsSender

    init(host: PluginHost, configuration c: [String: Any]) throws {
        self.host = host
        filter = AnalyticsFilter(c)
        eventMaxBytes = c["event_max_bytes"] as? Int ?? 32_000
        let file: String? =
            c["file"] is NSNull ? nil : (c["file"] as? String ?? host.stateDirectory + "/events.ndjson")
        let writeKey = c["write_key"] as? String
        let timeout = c["timeout"] as? Double ?? 10
        let delivery = try (c["endpoint"] as? String).map {
            // Segment's libraries send the key as HTTP Basic auth too.
            try HTTPDelivery(
                plugin: "analytics", host: host, endpoint: $0, contentType: "application/json",
                headers: writeKey.map { ["Authorization": "Basic " + Data(($0 + ":").utf8).base64EncodedString()] }
                    ?? [:],
                gzip: c["gzip"] as? Bool ?? false, timeout: timeout, maxBackoff: c["max_backoff"] as? Double ?? 60,
                retryable: { $0 == 408 || $0 == 429 || $0 >= 500 })
        }
        guard file != nil || delivery != nil else {
            throw PluginError.fail(#"analytics: nowhere to send: set "file" or "endpoint""#)
        }
        spool = try AnalyticsSpool(
            path: host.stateDirectory + "/spool.ndjson", maxBytes: c["spool_max_bytes"] as? Int ?? 64 << 20,
            compactBytes: c["spool_compact_bytes"] as? Int ?? 1 << 20)
        sender = AnalyticsSender(
            spool: spool, host: host, file: file, delivery: delivery, writeKey: writeKey,
            batchEvents: c["batch_events"] as? Int ?? 100, batchBytes: c["batch_max_bytes"] as? Int ?? 500_000,
            flushInterval: c["flush_interval"] as? Double ?? 1, timeout: timeout)
        sender.start()
        host.log(
            .info,
            "analytics to \([file, delivery?.endpoint.absoluteString].compactMap { $0 }.joined(separator: " and "))")
    }

    deinit { sender.stop() }

    func flush() throws { try spool.flush() }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        if record.has(.type, "when") || record.has(.type, "screen") {
            if let event = filter.event(for: record) {
                let line = event.bytes
                if line.count > eventMaxBytes {
                    host.log(
                        .warning,
                        "analytics: the event of _seq \(record.seq) is \(line.count) bytes, over event_max_bytes \(eventMaxBytes); not sent"
                    )
                    host.count("oversized")
                } else if try !spool.append(line) {
                    // The destination has been down for long: hold the pipeline at this record.
                    throw PluginError.fail(
                        "analytics: the spool is full (\(spool.maxBytes) bytes); is the destination down?")
                }
            }
        }
        try next(record)
    }
}

/// Which records become which events.
struct AnalyticsFilter {
    /// `{"name":"whend-analytics","version":…}`, as Segment's libraries name themselves.
    static let library: [UInt8] = {
        var library = JSONObjectWriter()
        library.string("name", "whend-analytics")
        library.string("version", Analytics.version)
        return library.bytes
    }()

    /// Stable per record, so that an event sent twice is one event downstream: `whend-<_seq>-<id>`,
    /// under the 100 characters Segment allows (a longer id is replaced by its digest).
    static func messageID(seq: UInt64, id: String) -> String {
        let plain = "whend-\(seq)-" + id
        guard plain.utf8.count >= 100 else { return plain }
        var hash = SipHash128()
        hash.write(Array(id.utf8))
        let (a, b) = hash.finalize()
        return "whend-\(seq)-" + String(a, radix: 16) + String(b, radix: 16)
    }

    var includeApps: Set<String>?
    var excludeApps: Set<String>
    var includeWhens: Set<String>?
    var excludeWhens: Set<String>
    /// Screen views from screen-tracking (default), or the `screen` events apps send.
    var screensFrom: String

    init(_ c: [String: Any]) {
        includeApps = (c["include_apps"] as? [String]).map(Set.init)
        excludeApps = Set(c["exclude_apps"] as? [String] ?? [])
        includeWhens = (c["include_whens"] as? [String]).map(Set.init)
        excludeWhens = Set(c["exclude_whens"] as? [String] ?? [])
        screensFrom = c["screens_from"] as? String ?? "screen-tracking"
    }

    /// The Segment event for `r`, keys in alphabetical order; nil when the filters leave it out.
    func event(for r: PluginRecord) -> JSONObjectWriter? {
        let app = r.string(.app) ?? ""
        guard includeApps?.contains(app) ?? true, excludeApps.isEmpty || !excludeApps.contains(app) else { return nil }
        let session = r.string(.session) ?? ""
        let isWhen = r.has(.type, "when")
        var out = JSONObjectWriter(capacity: 512)
        let name: JSONValue
        if isWhen {
            guard !r.isDerived, let n = r[.name], n.kind == .string else { return nil }
            if includeWhens != nil || !excludeWhens.isEmpty {
                let text = n.string ?? ""
                guard includeWhens?.contains(text) ?? true, !excludeWhens.contains(text) else { return nil }
            }
            name = n
        } else {
            let origin = r.string(.origin) ?? "app"
            guard origin == screensFrom, let n = r[.name], n.kind == .string else { return nil }
            name = n
        }
        // Both ids, the one not given null, and a screen's `category` null: as Segment's own
        // libraries send them.
        if r[.user] == nil {
            out.string("anonymousId", session.isEmpty ? app : app + ":" + session)
        } else {
            out.null("anonymousId")
        }
        if !isWhen { out.null("category") }
        var context = JSONObjectWriter()
        var appObject = JSONObjectWriter()
        appObject.string("name", app)
        context.object("app", appObject)
        // Who sent it, where Segment's own libraries say it (`context.library`).
        context.raw("library", Self.library)
        if isWhen { context.value("screen", r[.screen]) }
        if !session.isEmpty { context.string("session", session) }
        out.object("context", context)
        if isWhen { out.value("event", name) }
        out.raw("integrations", Array("{}".utf8))
        out.string("messageId", Self.messageID(seq: r.seq, id: r.string(.id) ?? app + ":" + session))
        if !isWhen { out.value("name", name) }
        if isWhen {
            if let params = r[.params] {
                out.value("properties", params)
            } else {
                out.raw("properties", Array("{}".utf8))
            }
        } else {
            var properties = JSONObjectWriter()
            properties.value("previous", r[.previous].flatMap { $0.kind == .string ? $0 : nil })
            out.object("properties", properties)
        }
        if let time = r.time { out.value("timestamp", time) } else { out.string("timestamp", "") }
        out.string("type", isWhen ? "track" : "screen")
        out.valueOrNull("userId", r[.user])
        return out
    }
}

/// Encoded events not yet delivered: in memory for the sender, and in a file so that a restart
/// sends them still. The file is the durable half of the promise the pipeline's cursor relies
/// on: `flush()` syncs it before the cursor passes its events, and delivered events leave it
/// only when it is compacted, after the destination holding them was synced (`compact`).
final class AnalyticsSpool: @unchecked Sendable {
    // Unchecked: all state is guarded by `condition`.
    private let condition = NSCondition()
    /// The events not yet delivered are `events[head...]`: delivered ones leave from the front
    /// in O(1), where removing them from an array moved the whole backlog each time.
    private var events: [[UInt8]] = []
    private var head = 0
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
            events.append(Array(line))
            bytes += line.count
        }
        directoryUnsynced = !existed
        fileLength = lseek(file, 0, SEEK_END)
    }

    deinit {
        try? writeUnwritten()
        close(file)
    }

    /// Spools one event, in memory and in the spool file's write buffer. False when the spool
    /// is full; throws when the buffer, full, cannot be written (the pipeline then retries the
    /// record). The worker calls `flush()` before its cursor passes the record: an event is
    /// never passed without being in the spool file, synced.
    func append(_ line: [UInt8]) throws -> Bool {
        condition.lock()
        defer { condition.unlock() }
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
        if events.count - head == 1 {
            condition.broadcast()
        } else if let need = batchWaiter, events.count - head >= need || bytes * 2 >= maxBytes {
            batchWaiter = nil
            condition.broadcast()
        }
        if unwritten.count >= 64 << 10 { try writeUnwritten() }
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
        while self.events.count - head < events && bytes * 2 < maxBytes && !stopping {
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
        if head == events.count && !stopping { _ = condition.wait(until: Date().addingTimeInterval(wait)) }
        var batch: [[UInt8]] = []
        var size = 0
        for e in events[head...] {
            guard batch.count < maxEvents, size + e.count + 1 <= maxBytes - 64 || batch.isEmpty else { break }
            batch.append(e)
            size += e.count + 1
        }
        return batch
    }

    var count: Int { condition.withLock { events.count - head } }

    /// The spool file's length, what is buffered for it included.
    var fileBytes: Int { condition.withLock { Int(fileLength) + unwritten.count } }

    /// The first `n` events are delivered: they leave memory (making room for appends), and
    /// stay in the file until the next compaction.
    func remove(_ n: Int) {
        condition.lock()
        defer { condition.unlock() }
        let end = min(head + n, events.count)
        for i in head..<end {
            bytes -= events[i].count
            deliveredBytes += events[i].count + 1
            events[i] = []
        }
        head = end
        if head == events.count {
            events.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 4096 && head * 2 > events.count {
            events.removeFirst(head)
            head = 0
        }
        condition.broadcast()  // room for an append waiting on a full spool
    }

    /// Whether the file holds delivered events.
    var holdsDelivered: Bool { condition.withLock { deliveredBytes > 0 } }

    /// Whether the delivered part of the file is worth rewriting it for: at least
    /// `compactBytes`, and at least what the rewrite copies (the undelivered events), so that
    /// the copying costs at most once more what was delivered.
    var compactionDue: Bool {
        condition.withLock { deliveredBytes >= max(compactBytes, bytes + events.count - head) }
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
        kept.reserveCapacity(bytes + events.count - head)
        for e in events[head...] {
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

/// The NDJSON destination as the sender appends to it: one descriptor kept open while the path
/// names the same file (a destination rotated away is followed at the next batch, the old file
/// synced first), and `sync()` makes what was appended durable, once per spool compaction.
final class AnalyticsFileDestination {
    let path: String
    private var fd: Int32 = -1
    private var identity: (dev: UInt, ino: UInt) = (0, 0)
    private var unsynced = false
    /// The file was created and its name is not durable yet.
    private var directoryUnsynced = false

    init(path: String) { self.path = path }

    deinit { if fd >= 0 { close(fd) } }

    /// Appends to the destination; throws (and the batch is written again later) when it
    /// cannot, so that no batch is counted sent that is not in the file.
    func append(_ bytes: [UInt8]) throws {
        try reopenIfRotated()
        try DurableFile.append(bytes, to: fd, path: path)
        unsynced = true
    }

    /// Makes every append so far durable.
    func sync() throws {
        if unsynced, fd >= 0 {
            try DurableFile.syncData(fd, path: path)
            unsynced = false
        }
        if directoryUnsynced {
            try DurableFile.syncDirectory(of: path)
            directoryUnsynced = false
        }
    }

    private func reopenIfRotated() throws {
        var status = stat()
        if fd >= 0, stat(path, &status) == 0, UInt(status.st_dev) == identity.dev,
            UInt(status.st_ino) == identity.ino
        {
            return
        }
        // Readable by whend's group (DurableFile.fileMode): the local tools meant to read an
        // NDJSON destination join it.
        var created = false
        var next = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW)
        if next < 0, errno == ENOENT {
            try DurableFile.createDirectory((path as NSString).deletingLastPathComponent)
            next = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, DurableFile.fileMode)
            created = true
        }
        guard next >= 0 else { throw DurableFileError(operation: "open", path: path, code: errno) }
        // What went to the file rotated away must be as durable as the rest before its
        // descriptor goes.
        if fd >= 0 {
            do {
                try sync()
            } catch {
                close(next)
                throw error
            }
            close(fd)
        }
        fd = next
        fstat(fd, &status)
        identity = (UInt(status.st_dev), UInt(status.st_ino))
        directoryUnsynced = directoryUnsynced || created
    }
}

/// The thread that forms batches and delivers them: the file first, then the endpoint, with
/// exponential backoff and jitter on 5xx, 429 and timeouts, `Retry-After` honoured; other 4xx
/// answers drop the batch and report it.
final class AnalyticsSender: @unchecked Sendable {
    // Unchecked: configuration is immutable; `stopping` guards itself.
    let spool: AnalyticsSpool
    let host: PluginHost
    let file: AnalyticsFileDestination?
    let delivery: HTTPDelivery?
    let writeKey: String?
    let batchEvents: Int
    let batchBytes: Int
    let flushInterval: Double
    let timeout: Double
    private let stopping = StopSignal()
    private var thread: SenderThread?

    init(
        spool: AnalyticsSpool, host: PluginHost, file: String?, delivery: HTTPDelivery?, writeKey: String?,
        batchEvents: Int, batchBytes: Int, flushInterval: Double, timeout: Double
    ) {
        self.spool = spool
        self.host = host
        self.file = file.map(AnalyticsFileDestination.init)
        self.delivery = delivery
        self.writeKey = writeKey
        // Segment takes at most 2,500 events and 500 KB in a batch.
        self.batchEvents = max(1, min(batchEvents, 2_500))
        self.batchBytes = max(1024, min(batchBytes, 500_000))
        self.flushInterval = flushInterval
        self.timeout = timeout
    }

    func start() { thread = SenderThread(name: "analytics") { [self] in run() } }

    func stop() {
        stopping.stop()
        delivery?.stop()
        spool.stop()
        thread?.join(waitingUpTo: timeout + 1)
    }

    private func run() {
        var fileDone = 0  // events of the current batch already written to the file
        while !stopping.isStopped {
            // Wait for a full batch, or for the flush interval with anything at all.
            var batch = spool.peek(maxEvents: batchEvents, maxBytes: batchBytes, wait: flushInterval)
            if batch.isEmpty { continue }
            if batch.count < batchEvents {
                spool.waitForBatch(of: batchEvents, seconds: flushInterval)
                batch = spool.peek(maxEvents: batchEvents, maxBytes: batchBytes, wait: 0)
            }
            if let file, fileDone < batch.count {
                do {
                    try file.append(Self.batchBody(Array(batch[fileDone...]), writeKey: nil) + [0x0A])
                    fileDone = batch.count
                } catch {
                    host.log(.error, "analytics: cannot write \(file.path): \(error); retrying")
                    stopping.sleep(1)
                    continue
                }
            }
            if let delivery {
                switch delivery.deliver(
                    "a batch of \(batch.count) events", body: { Self.batchBody(batch, writeKey: writeKey) })
                {
                case .accepted: host.count("events_sent", by: Int64(batch.count))
                case .refused: host.count("events_dropped", by: Int64(batch.count))
                case .stopped: continue
                }
            } else {
                host.count("events_sent", by: Int64(batch.count))
            }
            spool.remove(batch.count)
            fileDone = 0
            if spool.compactionDue {
                do {
                    try spool.compact { try file?.sync() }
                    host.count("spool_compactions")
                } catch {
                    // Nothing is lost: the delivered events stay in the spool, sent again
                    // after a restart; the next batch tries again.
                    host.log(.error, "\(error)")
                }
            }
        }
        // Stopping: what was delivered leaves the spool, so that a restart sends none of it again.
        if spool.holdsDelivered { try? spool.compact { try file?.sync() } }
    }

    /// A batch as Segment's libraries post it: `{"batch":[…],"sentAt":…,"writeKey":…}`, `sentAt`
    /// the moment of this attempt (Segment corrects the events' clocks by it). The key goes in
    /// the body and as HTTP Basic auth, as they send it; never into the file.
    static func batchBody(_ events: [[UInt8]], writeKey: String?) -> [UInt8] {
        var body = Array(#"{"batch":["#.utf8)
        for (i, e) in events.enumerated() {
            if i > 0 { body.append(UInt8(ascii: ",")) }
            body += e
        }
        body += Array(#"],"sentAt":"#.utf8)
        var clock = RFC3339Clock()
        var now: [UInt8] = []
        clock.appendNow(to: &now)
        appendJSONString(now, to: &body)
        if let writeKey {
            body += Array(#","writeKey":"#.utf8)
            appendJSONString(writeKey.utf8, to: &body)
        }
        body.append(UInt8(ascii: "}"))
        return body
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(Analytics.self) }
