import BuiltinPluginSupport
import Foundation
import PluginHTTP
import WhendPluginSDK
import WhendRecord
import WhendSystem
import WhendWire

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
        // Within Segment's bounds already (`Analytics.init`).
        self.batchEvents = batchEvents
        self.batchBytes = batchBytes
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
