import Foundation
import WhendConfiguration
import WhendPluginHost
import WhendSystem
import WhendWire

/// What a pipeline worker derived from one record: the plugin's bytes, stored as written.
package struct DerivedRecord: Equatable, Sendable {
    /// The `_seq` of the record it was derived from.
    package var cause: UInt64
    /// The plugin that derived it (`_origin`).
    package var origin: String
    /// Read from a frame, a view of the frame's bytes: a batch is decoded without a copy of
    /// each record.
    package var bytes: ArraySlice<UInt8>

    package init(cause: UInt64, origin: String, bytes: ArraySlice<UInt8>) {
        self.cause = cause
        self.origin = origin
        self.bytes = bytes
    }
}

/// A worker's messages to the daemon, on `WorkerFrame.reportDescriptor`.
package enum WorkerMessage: Equatable, Sendable {
    /// The worker's durable cursor and counters (`skipped`: records gone from the journal
    /// before it read them); also its heartbeat for the daemon's watchdog.
    case progress(cursor: UInt64, failures: UInt64, deadLetters: UInt64, skipped: UInt64)
    /// Records derived since the last batch, in order; the daemon appends them in one journal
    /// batch and answers `stored` with the same number.
    case derived(batch: UInt64, records: [DerivedRecord])
    /// A stage's counters (`host.count`) since its worker started, whole, sent when they change.
    case counters(plugin: String, values: [String: Int64])
    /// The worker's last word, in the shared pipeline host, where a pipeline ends without its
    /// process: how it ended, as a worker process's exit status would say.
    case ended(status: UInt64)
}

/// The daemon's messages to a worker, on `WorkerFrame.commandDescriptor`.
package enum SupervisorMessage: Equatable, Sendable {
    /// The first message: which pipeline to run (a `PipelineSpec` as JSON: it holds plugin
    /// configuration, secrets included, so it never goes on a command line) and the worker's
    /// generation, which every later message carries.
    case start(generation: UInt64, spec: [UInt8])
    /// Every record of `batch` is stored (or refused for good): the worker may let its cursor
    /// pass their causes. A worker ignores acknowledgements of another generation: they were
    /// meant for a worker that died.
    case stored(generation: UInt64, batch: UInt64)
    /// Finish the record in hand, save the cursor, close the plugins and end (a worker process
    /// exits 0). The shared pipeline host stops one pipeline so, without a signal.
    case stop
}

/// The framing both ways: a 4-byte little-endian length, then that many bytes: a tag byte and
/// the fields (integers 8 bytes little-endian; strings and byte runs as a 4-byte length and
/// the bytes).
///
/// Frames travel on descriptors of their own, never on the worker's standard output: plugins
/// run in the worker, and what one prints (a `printf` left in, a library's warning) must not
/// be taken for a frame. The worker's standard output and error are whend's standard error.
package enum WorkerFrame {
    /// A frame longer than this is a broken peer, not a message.
    package static let maxLength = 64 << 20
    /// In the worker, as it starts: where it writes its messages to the daemon. It moves both
    /// descriptors higher before it loads a plugin (`WorkerChannel`), leaving /dev/null here.
    package static let reportDescriptor: Int32 = 3
    /// In the worker, as it starts: where it reads the daemon's messages.
    package static let commandDescriptor: Int32 = 4
    /// The fewest bytes a derived record takes in a frame: its cause, its origin (a plugin's
    /// name, never empty) and its bytes, each run with its length.
    static let minimumRecordLength = 8 + 4 + 1 + 4

    enum Tag: UInt8 {
        case progress = 1, derived = 2, start = 3, stored = 4, counters = 5, ended = 6, stop = 7
    }

    package struct DecodeError: Error, CustomStringConvertible {
        package var description: String
    }

    package static func encode(_ message: WorkerMessage) -> [UInt8] {
        var w = Writer()
        switch message {
        case .progress(let cursor, let failures, let deadLetters, let skipped):
            w.tag(.progress)
            w.integer(cursor)
            w.integer(failures)
            w.integer(deadLetters)
            w.integer(skipped)
        case .derived(let batch, let records):
            var frame = DerivedBatchFrame()
            for r in records {
                r.bytes.withUnsafeBufferPointer { frame.append(cause: r.cause, origin: r.origin, json: $0) }
            }
            return Array(frame.finish(batch: batch))
        case .counters(let plugin, let values):
            w.tag(.counters)
            w.run(Array(plugin.utf8))
            w.integer(UInt64(values.count))
            for (name, value) in values.sorted(by: { $0.key < $1.key }) {
                w.run(Array(name.utf8))
                w.integer(UInt64(bitPattern: value))
            }
        case .ended(let status):
            w.tag(.ended)
            w.integer(status)
        }
        return w.frame()
    }

    package static func encode(_ message: SupervisorMessage) -> [UInt8] {
        var w = Writer()
        switch message {
        case .start(let generation, let spec):
            w.tag(.start)
            w.integer(generation)
            w.run(spec)
        case .stored(let generation, let batch):
            w.tag(.stored)
            w.integer(generation)
            w.integer(batch)
        case .stop:
            w.tag(.stop)
        }
        return w.frame()
    }

    package static func decodeWorkerMessage(_ payload: ArraySlice<UInt8>) throws(DecodeError) -> WorkerMessage {
        var r = Reader(bytes: payload)
        switch try r.tag() {
        case .progress:
            return .progress(
                cursor: try r.integer(), failures: try r.integer(), deadLetters: try r.integer(),
                skipped: try r.integer())
        case .derived:
            let batch = try r.integer()
            let count = try r.integer()
            // The count is the peer's word: what is reserved for it must be what the frame's
            // bytes can hold. (Bounded by the frame's length alone, a 64 MiB frame could ask for
            // 64 Mi records: 3.7 GB reserved before the first was read.)
            let possible = (payload.endIndex - r.position) / WorkerFrame.minimumRecordLength
            guard count <= UInt64(possible) else {
                throw DecodeError(
                    description:
                        "a batch of \(count) records in a frame of \(payload.count) bytes (at most \(possible))")
            }
            var records: [DerivedRecord] = []
            records.reserveCapacity(Int(count))
            for _ in 0..<count {
                let cause = try r.integer()
                let origin = try r.run()
                guard !origin.isEmpty else { throw DecodeError(description: "a derived record without an origin") }
                records.append(
                    DerivedRecord(cause: cause, origin: String(decoding: origin, as: UTF8.self), bytes: try r.run()))
            }
            return .derived(batch: batch, records: records)
        case .counters:
            let plugin = String(decoding: try r.run(), as: UTF8.self)
            // The worker's word, bounded as a plugin's counters are in the worker.
            let count = try r.integer()
            guard count <= UInt64(PluginServices.counterLimit) else {
                throw DecodeError(
                    description: "\(count) counters (a plugin has at most \(PluginServices.counterLimit))")
            }
            var values: [String: Int64] = [:]
            for _ in 0..<count {
                let name = try r.run()
                let value = Int64(bitPattern: try r.integer())
                // A name the worker should not have sent is not shown; the frame itself is whole,
                // and its worker not broken for it.
                guard name.count <= PluginServices.counterNameLimit else { continue }
                values[String(decoding: name, as: UTF8.self)] = value
            }
            return .counters(plugin: plugin, values: values)
        case .ended:
            return .ended(status: try r.integer())
        default:
            throw DecodeError(description: "not a worker's message")
        }
    }

    package static func decodeSupervisorMessage(_ payload: ArraySlice<UInt8>) throws(DecodeError) -> SupervisorMessage {
        var r = Reader(bytes: payload)
        switch try r.tag() {
        case .start: return .start(generation: try r.integer(), spec: Array(try r.run()))
        case .stored: return .stored(generation: try r.integer(), batch: try r.integer())
        case .stop: return .stop
        default: throw DecodeError(description: "not the daemon's message")
        }
    }

    struct Writer {
        var bytes: [UInt8] = [0, 0, 0, 0]

        mutating func tag(_ tag: Tag) { bytes.append(tag.rawValue) }

        mutating func integer(_ value: UInt64) {
            withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        }

        mutating func run(_ run: [UInt8]) { run.withUnsafeBufferPointer { self.run($0) } }

        mutating func run(_ run: UnsafeBufferPointer<UInt8>) {
            withUnsafeBytes(of: UInt32(run.count).littleEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: run)
        }

        /// The bytes with the length in front.
        mutating func frame() -> [UInt8] {
            let length = UInt32(bytes.count - 4).littleEndian
            withUnsafeBytes(of: length) { for i in 0..<4 { bytes[i] = $0[i] } }
            return bytes
        }
    }

    struct Reader {
        let bytes: ArraySlice<UInt8>
        var position: Int

        init(bytes: ArraySlice<UInt8>) {
            self.bytes = bytes
            position = bytes.startIndex
        }

        mutating func take(_ n: Int) throws(DecodeError) -> ArraySlice<UInt8> {
            guard n >= 0, bytes.endIndex - position >= n else { throw DecodeError(description: "a frame cut short") }
            defer { position += n }
            return bytes[position..<(position + n)]
        }

        mutating func tag() throws(DecodeError) -> Tag {
            let byte = try take(1).first!
            guard let tag = Tag(rawValue: byte) else { throw DecodeError(description: "unknown message tag \(byte)") }
            return tag
        }

        mutating func integer() throws(DecodeError) -> UInt64 {
            var value: UInt64 = 0
            for (i, b) in try take(8).enumerated() { value |= UInt64(b) << (8 * UInt64(i)) }
            return value
        }

        mutating func run() throws(DecodeError) -> ArraySlice<UInt8> {
            var length: UInt32 = 0
            for (i, b) in try take(4).enumerated() { length |= UInt32(b) << (8 * UInt32(i)) }
            return try take(Int(length))
        }
    }
}

/// A `derived` message built as the plugins emit: each record is copied once, into the frame
/// that goes to the daemon (no record of its own, no second copy to encode the batch). The
/// batch number and the count are filled in when it is finished.
package struct DerivedBatchFrame {
    private var writer = WorkerFrame.Writer()
    /// Each record's cause, in order: what an acknowledgement of the batch lets pass.
    private(set) var causes: [UInt64] = []
    /// The last origin and its bytes: a worker's records come from a few plugins.
    private var origin = ""
    private var originBytes: [UInt8] = []
    /// Where the batch number and the count go: after the length (4 bytes) and the tag (1).
    private static let batchOffset = 5
    private static let countOffset = 13
    private static let headerLength = 21
    /// Where the records of the record being handled begin (`beginRecord()`).
    private var recordStart = (bytes: headerLength, records: 0)

    package init() { start() }

    package var isEmpty: Bool { causes.isEmpty }
    package var byteCount: Int { writer.bytes.count }

    private mutating func start() {
        writer.bytes.removeAll(keepingCapacity: true)
        writer.bytes.append(contentsOf: repeatElement(0, count: 4))
        writer.tag(.derived)
        writer.integer(0)
        writer.integer(0)
        causes.removeAll(keepingCapacity: true)
        recordStart = (Self.headerLength, 0)
    }

    /// What is appended from now on is derived from one record (until the next call).
    package mutating func beginRecord() { recordStart = (writer.bytes.count, causes.count) }

    /// Bytes of the frame taken by the record being handled.
    package var currentRecordBytes: Int { writer.bytes.count - recordStart.bytes }

    /// Whether the frame also holds records derived from earlier records.
    package var holdsEarlierRecords: Bool { recordStart.records > 0 }

    /// Whether a record of `count` bytes from `origin` still fits in the frame.
    package func fits(origin: String, count: Int) -> Bool {
        writer.bytes.count - 4 + 8 + 4 + origin.utf8.count + 4 + count <= WorkerFrame.maxLength
    }

    /// Takes out what the record being handled derived so far, for `restoreCurrentRecord`.
    package mutating func takeCurrentRecord() -> (bytes: [UInt8], causes: [UInt64]) {
        let taken = (Array(writer.bytes[recordStart.bytes...]), Array(causes[recordStart.records...]))
        writer.bytes.removeSubrange(recordStart.bytes...)
        causes.removeSubrange(recordStart.records...)
        return taken
    }

    /// Puts back, into an empty frame, what `takeCurrentRecord` took.
    package mutating func restoreCurrentRecord(_ taken: (bytes: [UInt8], causes: [UInt64])) {
        precondition(isEmpty)
        writer.bytes.append(contentsOf: taken.bytes)
        causes.append(contentsOf: taken.causes)
    }

    package mutating func append(cause: UInt64, origin: String, json: UnsafeBufferPointer<UInt8>) {
        if origin != self.origin {
            self.origin = origin
            originBytes = Array(origin.utf8)
        }
        writer.integer(cause)
        originBytes.withUnsafeBufferPointer { writer.run($0) }
        writer.run(json)
        causes.append(cause)
    }

    /// The frame, numbered `batch`, valid until the next change; then `reset()` for the next.
    package mutating func finish(batch: UInt64) -> ArraySlice<UInt8> {
        writer.bytes.withUnsafeMutableBytes { b in
            b.storeBytes(of: UInt32(b.count - 4).littleEndian, toByteOffset: 0, as: UInt32.self)
            b.storeBytes(of: batch.littleEndian, toByteOffset: Self.batchOffset, as: UInt64.self)
            b.storeBytes(of: UInt64(causes.count).littleEndian, toByteOffset: Self.countOffset, as: UInt64.self)
        }
        return writer.bytes[...]
    }

    package mutating func reset() { start() }
}

/// Splits a byte stream into frames' payloads.
package struct WorkerFrameReader: Sendable {
    /// Why `pump` returned.
    package enum End: Equatable {
        /// The peer closed its end (or the descriptor cannot be read).
        case closed
        /// `handle` asked to stop.
        case stopped
    }

    /// Reads `fd` and hands each whole frame's payload to `handle`, in order, until the peer is
    /// gone or `handle` returns false; a frame that cannot be a frame throws. What was read past
    /// a stop stays in the reader, for whoever reads on. The one loop for every reader of frames
    /// (the worker's first message and its acknowledgements, the supervisor's reports).
    package mutating func pump(
        _ fd: Int32, _ handle: (ArraySlice<UInt8>) throws(WorkerFrame.DecodeError) -> Bool
    ) throws(WorkerFrame.DecodeError) -> End {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            while let payload = try next() {
                guard try handle(payload) else { return .stopped }
            }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return .closed }
            buffer.withUnsafeBytes { append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }

    private var pending: [UInt8] = []
    private var start = 0

    package init() {}

    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if start > 0 && start == pending.count {
            // Not the room of a frame of tens of megabytes, for the rest of the worker's life.
            pending.removeAll(keepingCapacity: pending.capacity <= 1 << 20)
            start = 0
        }
        pending.append(contentsOf: bytes)
    }

    /// The next whole frame's payload, if one has arrived.
    package mutating func next() throws(WorkerFrame.DecodeError) -> ArraySlice<UInt8>? {
        guard pending.count - start >= 4 else {
            compact()
            return nil
        }
        var length = 0
        for i in 0..<4 { length |= Int(pending[start + i]) << (8 * i) }
        guard length <= WorkerFrame.maxLength else {
            throw WorkerFrame.DecodeError(description: "a frame of \(length) bytes (at most \(WorkerFrame.maxLength))")
        }
        guard pending.count - start - 4 >= length else {
            compact()
            return nil
        }
        let payload = pending[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        return payload
    }

    private mutating func compact() {
        if start > 0 {
            pending.removeFirst(start)
            start = 0
        }
    }
}

/// Writes all of `bytes` to `fd`; false if the peer is gone.
@discardableResult
func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    bytes.withUnsafeBytes { writeFully(fd, $0) } == nil
}
