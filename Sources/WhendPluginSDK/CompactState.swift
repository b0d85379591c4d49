import WhendWire

/// A state that saves itself as compact bytes: what a pipeline's snapshot holds for a
/// `PersistentStatePlugin` whose `State` conforms (else the state is saved as JSON). JSON through
/// `Codable` cost the built-in plugins more than handling their records did: a snapshot of
/// 10,000 sessions' breadcrumbs took half a second every five.
///
/// Write fields in a fixed order and read them back in the same order; `CompactReader` throws
/// on bytes that end early or do not fit, and the worker then rebuilds the state from the
/// journal.
public protocol CompactCodable {
    func encode(to writer: inout CompactWriter)
    init(from reader: inout CompactReader) throws(StateDamaged)
}

/// Saved state that cannot be read back.
public struct StateDamaged: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Appends values: unsigned integers as LEB128 varints, byte strings with their length first.
@frozen public struct CompactWriter {
    public var bytes: [UInt8]

    @inlinable public init(capacity: Int = 4096) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    @inlinable public mutating func write(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    /// Zigzag, so that small negative numbers stay short.
    @inlinable public mutating func write(_ value: Int) {
        write(UInt64(bitPattern: Int64((value << 1) ^ (value >> (Int.bitWidth - 1)))))
    }

    @inlinable public mutating func write(_ value: Bool) { bytes.append(value ? 1 : 0) }

    @inlinable public mutating func write(_ value: Double) { write(fixed: value.bitPattern) }

    /// Eight bytes, little-endian: for values that are rarely small (digests, bit patterns).
    @inlinable public mutating func write(fixed value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    @inlinable public mutating func write<C: Collection>(bytes value: C) where C.Element == UInt8 {
        write(UInt64(value.count))
        bytes.append(contentsOf: value)
    }

    @inlinable public mutating func write(_ value: String) {
        var copy = value
        copy.withUTF8 { write(bytes: $0) }
    }

    @inlinable public mutating func write<T: CompactCodable>(_ value: T?) {
        write(value != nil)
        value?.encode(to: &self)
    }

    @inlinable public mutating func write<T: CompactCodable>(_ values: [T]) {
        write(UInt64(values.count))
        for v in values { v.encode(to: &self) }
    }
}

/// Reads what `CompactWriter` wrote, in the same order.
@frozen public struct CompactReader {
    @usableFromInline let bytes: [UInt8]
    @usableFromInline var position: Int

    @inlinable public init(_ bytes: [UInt8], from position: Int = 0) {
        self.bytes = bytes
        self.position = position
    }

    @inlinable public var isAtEnd: Bool { position == bytes.count }

    @inlinable public mutating func read(_: UInt64.Type = UInt64.self) throws(StateDamaged) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard position < bytes.count, shift < 64 else { throw StateDamaged("a number ends early or is too long") }
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << shift
            if byte & 0x80 == 0 { return result }
            shift += 7
        }
    }

    @inlinable public mutating func read(_: Int.Type) throws(StateDamaged) -> Int {
        let v = try read(UInt64.self)
        return Int(truncatingIfNeeded: Int64(bitPattern: (v >> 1) ^ (0 &- (v & 1))))
    }

    /// A count of things that each take at least one byte: no more than the bytes left.
    @inlinable public mutating func readCount() throws(StateDamaged) -> Int {
        let v = try read(UInt64.self)
        guard v <= UInt64(bytes.count - position) else { throw StateDamaged("a count of \(v) is past the end") }
        return Int(v)
    }

    @inlinable public mutating func read(_: Bool.Type) throws(StateDamaged) -> Bool {
        guard position < bytes.count, bytes[position] <= 1 else { throw StateDamaged("not a boolean") }
        position += 1
        return bytes[position - 1] == 1
    }

    @inlinable public mutating func read(_: Double.Type) throws(StateDamaged) -> Double {
        Double(bitPattern: try readFixed())
    }

    @inlinable public mutating func readFixed() throws(StateDamaged) -> UInt64 {
        guard bytes.count - position >= 8 else { throw StateDamaged("a number ends early") }
        var bits: UInt64 = 0
        for i in 0..<8 { bits |= UInt64(bytes[position + i]) << (8 * UInt64(i)) }
        position += 8
        return bits
    }

    @inlinable public mutating func readBytes() throws(StateDamaged) -> ArraySlice<UInt8> {
        let count = try readCount()
        defer { position += count }
        return bytes[position..<position + count]
    }

    @inlinable public mutating func read(_: String.Type) throws(StateDamaged) -> String {
        String(decoding: try readBytes(), as: UTF8.self)
    }

    @inlinable public mutating func read<T: CompactCodable>(_: T?.Type) throws(StateDamaged) -> T? {
        try read(Bool.self) ? try T(from: &self) : nil
    }

    @inlinable public mutating func read<T: CompactCodable>(_: [T].Type) throws(StateDamaged) -> [T] {
        let count = try readCount()
        var result: [T] = []
        result.reserveCapacity(count)
        for _ in 0..<count { result.append(try T(from: &self)) }
        return result
    }
}

extension String: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) { writer.write(self) }
    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) {
        self = try reader.read(String.self)
    }
}

extension UInt64: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) { writer.write(self) }
    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) {
        self = try reader.read(UInt64.self)
    }
}

extension Int: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) { writer.write(self) }
    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) { self = try reader.read(Int.self) }
}

extension Double: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) { writer.write(self) }
    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) {
        self = try reader.read(Double.self)
    }
}

extension Bool: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) { writer.write(self) }
    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) { self = try reader.read(Bool.self) }
}

extension SessionDigest: CompactCodable {
    @inlinable public func encode(to writer: inout CompactWriter) {
        writer.write(fixed: low)
        writer.write(fixed: high)
    }

    @inlinable public init(from reader: inout CompactReader) throws(StateDamaged) {
        let low = try reader.readFixed()
        self.init(low: low, high: try reader.readFixed())
    }
}

/// Sessions in the order last seen (the same state writes the same bytes): the limit, the
/// count, then each session's digest, when it was last seen and its state.
extension BoundedSessions: CompactCodable where State: CompactCodable {
    public func encode(to writer: inout CompactWriter) {
        writer.write(limit)
        writer.write(UInt64(entries.count))
        for slot in orderSeen() {
            entries[slot].id.encode(to: &writer)
            writer.write(entries[slot].seen)
            entries[slot].state.encode(to: &writer)
        }
    }

    public init(from reader: inout CompactReader) throws(StateDamaged) {
        self.init(limit: try reader.read(Int.self))
        let count = try reader.readCount()
        entries.reserveCapacity(count)
        slots.reserveCapacity(count)
        for _ in 0..<count {
            let id = try SessionDigest(from: &reader)
            let seen = try reader.read(UInt64.self)
            insert(Entry(id: id, state: try State(from: &reader), seen: seen))
        }
    }
}
