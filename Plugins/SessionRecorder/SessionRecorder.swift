import BuiltinPluginSupport
import Foundation
import WhendPluginSDK

/// Indexes sessions — app, session, first and last `_seq`, time span, counts by type — so that
/// `whenctl sessions` lists them at once and a session's records are read from its first `_seq`
/// rather than by scanning the whole journal. Configuration: `{"max_sessions": 100000}`.
///
/// A deferred stage: the index's log lines are written in batches (every 64 KiB, and at least
/// every `flush_interval` seconds), and only then does the plugin complete the records, so that
/// the pipeline's cursor never passes a record the index on disk does not hold. It must be the
/// last stage of its pipeline.
final class SessionRecorder: WhendPlugin {
    static let name = "session-recorder"
    static let version = "1.1.0"
    static let roles: PluginRoles = [.pipeline, .deferred]

    private let index: BufferedIndex

    init(host: PluginHost, configuration: [String: Any]) throws {
        let writer = try SessionIndexWriter(
            directory: host.stateDirectory, maxSessions: configuration["max_sessions"] as? Int ?? 100_000)
        host.log(.info, "\(writer.index.entries.count) sessions indexed through _seq \(writer.index.indexedThrough)")
        index = BufferedIndex(
            writer: writer, host: host, flushInterval: max(0.001, configuration["flush_interval"] as? Double ?? 0.05))
    }

    deinit { index.stop() }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        try index.add(record)
        try next(record)
    }
}

/// The index and the records whose log lines are not written yet; a thread of its own writes
/// them at least every `flushInterval` seconds, so that an idle pipeline's cursor catches up.
final class BufferedIndex: @unchecked Sendable {
    // Unchecked: `writer`, `waiting` and `stopped` are guarded by `lock`; records are added on
    // the worker's thread and flushed on the flusher's.
    private let lock = NSLock()
    private let writer: SessionIndexWriter
    private let host: PluginHost
    /// The last record handled whose log line is not written yet.
    private var waitingThrough: UInt64?
    private var stopped = false
    private let flusherDone = DispatchSemaphore(value: 0)

    init(writer: SessionIndexWriter, host: PluginHost, flushInterval: Double) {
        self.writer = writer
        self.host = host
        let thread = Thread { [self] in
            while !lock.withLock({ stopped }) {
                usleep(UInt32(flushInterval * 1e6))
                flush()
            }
            flusherDone.signal()
        }
        thread.name = "session-recorder"
        thread.start()
    }

    func add(_ record: PluginRecord) throws {
        let full: Bool = try lock.withLock {
            if let app = record[.app], let session = record[.session], session.stringContents?.isEmpty == false {
                try writer.record(
                    seq: record.seq, session: SessionID(record), app: app, session: session,
                    type: record.string(.type) ?? "", time: record.time)
            }
            waitingThrough = record.seq
            return writer.buffered >= 64 << 10
        }
        if full { flush() }
    }

    /// Writes what is buffered, then lets the cursor pass those records. A write that fails
    /// completes nothing: the records stay before the cursor and are handled again after a
    /// restart, if the file system has not recovered by the next flush.
    func flush() {
        let done: UInt64? = lock.withLock {
            guard let through = waitingThrough else { return nil }
            do {
                try writer.flush()
            } catch {
                host.log(.error, "session-recorder: cannot write the session index: \(error); retrying")
                return nil
            }
            waitingThrough = nil
            return through
        }
        // In order: one call lets the cursor pass every record up to the last one written.
        if let done { host.complete(through: done) }
    }

    func stop() {
        lock.withLock { stopped = true }
        flusherDone.wait()
        flush()
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(SessionRecorder.self) }
