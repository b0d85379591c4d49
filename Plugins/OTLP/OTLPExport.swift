import Foundation
import PluginHTTP
import SwiftProtobuf
import WhendPluginSDK
import WhendWire

/// Exports records as OpenTelemetry log records: OTLP/HTTP with protobuf bodies, POSTed in
/// batches to a collector's `/v1/logs`. A deferred stage: the pipeline's cursor passes a record
/// only once the collector has accepted the batch that carries it (or refused it for good), so
/// neither a restart nor a collector that is down loses a record. The mapping is in docs/plugins.md
/// ("otlp"); the configuration keys too.
final class OTLPExport: WhendPlugin {
    static let name = "otlp"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline, .deferred]

    private let types: Set<String>?
    private let queue: ExportQueue
    private let sender: OTLPSender
    private let endpoint: String

    init(host: PluginHost, configuration c: [String: Any]) throws {
        endpoint = c["endpoint"] as? String ?? "http://127.0.0.1:4318/v1/logs"
        var headers: [String: String] = [:]
        if let given = c["headers"] {
            guard let strings = given as? [String: String] else {
                throw PluginError.fail(
                    #"otlp: "headers" must be an object of strings, such as {"Authorization": "Bearer …"}"#)
            }
            headers = strings
        }
        types = (c["types"] as? [String]).map(Set.init)
        let timeout = c["timeout"] as? Double ?? 10
        // What the OTLP specification retries: throttling and a gateway or collector that is
        // unavailable for now. Any other 4xx or 5xx says the batch will never be taken.
        let delivery = try HTTPDelivery(
            plugin: "otlp", host: host, endpoint: endpoint, contentType: "application/x-protobuf", headers: headers,
            gzip: c["gzip"] as? Bool ?? false, timeout: timeout, maxBackoff: c["max_backoff"] as? Double ?? 60,
            retryable: { [408, 429, 502, 503, 504].contains($0) })
        queue = ExportQueue(
            capacity: max(1, c["max_queue"] as? Int ?? 4096), batchLogs: max(1, c["batch_records"] as? Int ?? 512),
            flushInterval: c["flush_interval"] as? Double ?? 1)
        sender = OTLPSender(queue: queue, delivery: delivery, host: host, timeout: timeout)
        sender.start()
        host.log(.info, "otlp: log records to \(endpoint)")
    }

    deinit { sender.stop() }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        var log: LogRecord?
        if types.map({ $0.contains(record.string(.type) ?? "") }) ?? true {
            log = LogRecordMapping.logRecord(for: record)
        }
        // A record not exported is queued too: it is complete when those before it are.
        let entry = ExportQueue.Entry(seq: record.seq, service: log == nil ? nil : record.string(.app), log: log)
        guard queue.append(entry, waitingUpTo: 1) else {
            // The collector has been away for long: hold the pipeline at this record.
            throw PluginError.fail(
                "otlp: \(queue.capacity) records wait for \(endpoint) (max_queue); is the collector down?")
        }
        try next(record)
    }
}

typealias LogRecord = Opentelemetry_Proto_Logs_V1_LogRecord

/// Records accepted and not yet delivered, in order, at most `capacity` of them (the memory a
/// collector that is down can hold).
final class ExportQueue: @unchecked Sendable {
    // Unchecked: every member is guarded by `condition`.
    struct Entry {
        var seq: UInt64
        /// The `service.name` of its resource: the app.
        var service: String?
        /// Nil for a record that is not exported (its type is not in `types`).
        var log: LogRecord?
    }

    let capacity: Int
    /// Log records in a batch, at most.
    let batchLogs: Int
    let flushInterval: Double
    private let condition = NSCondition()
    private var entries: [Entry] = []
    private var head = 0
    private var logs = 0
    /// Since when entries wait (the first's arrival, or the last batch's departure for those
    /// behind it): a batch that is not full leaves `flushInterval` after it.
    private var waitingSince: Date?
    private var stopped = false

    init(capacity: Int, batchLogs: Int, flushInterval: Double) {
        self.capacity = capacity
        self.batchLogs = batchLogs
        self.flushInterval = flushInterval
    }

    private var count: Int { entries.count - head }

    /// A batch should leave now: a full one waits, or half the queue.
    private var batchReady: Bool { logs >= batchLogs || count * 2 >= capacity }

    /// False if the queue stayed full for `seconds`.
    func append(_ entry: Entry, waitingUpTo seconds: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        if count >= capacity {
            let deadline = Date().addingTimeInterval(seconds)
            while count >= capacity && !stopped {
                guard condition.wait(until: deadline) else { return count < capacity }
            }
        }
        if entry.log != nil { logs += 1 }
        entries.append(entry)
        // The sender is woken only when its wait changes: its deadline starts, or a batch is
        // ready (woken for every record, it switched threads once a record).
        if count == 1 {
            waitingSince = Date()
            condition.broadcast()
        } else if batchReady {
            condition.broadcast()
        }
        return true
    }

    /// The next batch, left in the queue until `remove`: once it is ready or the first entry has
    /// waited `flushInterval`; empty when stopped. Up to `batchLogs` log records, with the
    /// records not exported among and after them.
    func next() -> ArraySlice<Entry> {
        condition.lock()
        defer { condition.unlock() }
        while !stopped && !batchReady {
            if let waitingSince, Date().timeIntervalSince(waitingSince) >= flushInterval { break }
            // (Not `.distantFuture`: that overflows the wait's timespec.)
            _ = condition.wait(
                until: waitingSince?.addingTimeInterval(flushInterval) ?? Date().addingTimeInterval(60))
        }
        guard !stopped else { return [] }
        var end = head
        var taken = 0
        while end < entries.count, taken < batchLogs || entries[end].log == nil {
            if entries[end].log != nil { taken += 1 }
            end += 1
        }
        return entries[head..<end]
    }

    /// The first `n` entries are delivered (or refused for good).
    func remove(_ n: Int) {
        condition.withLock {
            for i in head..<(head + n) where entries[i].log != nil { logs -= 1 }
            head += n
            if head == entries.count {
                entries.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 1024 && head * 2 >= entries.count {
                entries.removeFirst(head)
                head = 0
            }
            waitingSince = count > 0 ? Date() : nil
            condition.broadcast()  // room for an append waiting on a full queue
        }
    }

    func stop() {
        condition.withLock {
            stopped = true
            condition.broadcast()
        }
    }
}

/// The thread that posts batches, in order, and completes their records.
final class OTLPSender: @unchecked Sendable {
    // Unchecked: configuration is immutable; the queue and the delivery guard their own state.
    private let queue: ExportQueue
    private let delivery: HTTPDelivery
    private let host: PluginHost
    private let timeout: Double
    private var thread: SenderThread?

    init(queue: ExportQueue, delivery: HTTPDelivery, host: PluginHost, timeout: Double) {
        self.queue = queue
        self.delivery = delivery
        self.host = host
        self.timeout = timeout
    }

    func start() { thread = SenderThread(name: "otlp") { [self] in run() } }

    /// What is not delivered yet stays in the journal, past the cursor: the next worker sends it.
    func stop() {
        delivery.stop()
        queue.stop()
        thread?.join(waitingUpTo: timeout + 1)
    }

    private func run() {
        while true {
            let batch = queue.next()
            guard let last = batch.last else { return }
            let logs = batch.reduce(0) { $0 + ($1.log == nil ? 0 : 1) }
            if logs > 0 {
                let request: [UInt8]
                do {
                    request = try Array(LogRecordMapping.request(batch).serializedBytes() as [UInt8])
                } catch {
                    // Not expected of well-formed messages; a batch that cannot be encoded is skipped, not retried.
                    host.log(.error, "otlp: a batch of \(logs) log records could not be encoded: \(error); dropped")
                    host.count("records_dropped", by: Int64(logs))
                    queue.remove(batch.count)
                    host.complete(through: last.seq)
                    continue
                }
                switch delivery.deliver("a batch of \(logs) log records", body: { request }) {
                case .accepted(let answer):
                    host.count("records_sent", by: Int64(logs))
                    reportPartialSuccess(answer)
                case .refused:
                    host.count("records_dropped", by: Int64(logs))
                case .stopped:
                    return
                }
            }
            queue.remove(batch.count)
            host.complete(through: last.seq)
        }
    }

    /// A collector that took the request but not every record says so in the answer.
    private func reportPartialSuccess(_ answer: Data) {
        guard !answer.isEmpty,
            let response = try? Opentelemetry_Proto_Collector_Logs_V1_ExportLogsServiceResponse(
                serializedBytes: answer),
            response.hasPartialSuccess, response.partialSuccess.rejectedLogRecords > 0
        else { return }
        let rejected = response.partialSuccess.rejectedLogRecords
        host.count("records_rejected", by: rejected)
        host.log(
            .warning,
            "otlp: the collector rejected \(rejected) log records: \(response.partialSuccess.errorMessage)")
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(OTLPExport.self) }
