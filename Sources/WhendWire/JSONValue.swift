import Foundation

/// One JSON value inside a record: a view of its bytes, valid only during the call. Reading a
/// string that has no escapes, a bool or a number allocates nothing.
public struct JSONValue {
    /// The value's JSON text, as stored (a string with its quotes, an object with its braces).
    public let raw: UnsafeBufferPointer<UInt8>

    public init(raw: UnsafeBufferPointer<UInt8>) { self.raw = raw }

    public var kind: JSONKind {
        switch raw.first {
        case UInt8(ascii: "\""): return .string
        case UInt8(ascii: "{"): return .object
        case UInt8(ascii: "["): return .array
        case UInt8(ascii: "t"), UInt8(ascii: "f"): return .bool
        case UInt8(ascii: "n"): return .null
        default: return .number
        }
    }

    /// A string's contents as stored, escapes not decoded.
    public var stringContents: UnsafeBufferPointer<UInt8>? {
        guard raw.count >= 2, raw[0] == UInt8(ascii: "\"") else { return nil }
        return UnsafeBufferPointer(rebasing: raw[1..<(raw.count - 1)])
    }

    /// A string, decoded.
    public var string: String? {
        guard let contents = stringContents else { return nil }
        if contents.contains(UInt8(ascii: "\\")) { return String(decoding: decodeJSONString(contents), as: UTF8.self) }
        return String(decoding: contents, as: UTF8.self)
    }

    /// Whether this is the string `text` (compared without decoding when it has no escapes).
    public func isString(_ text: StaticString) -> Bool {
        guard let contents = stringContents else { return false }
        let expected = UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount)
        if JSONBytes.equal(contents, expected) {
            return true
        }
        return contents.contains(UInt8(ascii: "\\")) && decodeJSONString(contents).elementsEqual(expected)
    }

    /// Whether this is a string equal to `other`'s (both decoded when either has escapes).
    public func sameString(as other: JSONValue) -> Bool {
        guard let a = stringContents, let b = other.stringContents else { return false }
        if JSONBytes.equal(a, b) { return true }
        guard a.contains(UInt8(ascii: "\\")) || b.contains(UInt8(ascii: "\\")) else { return false }
        return decodeJSONString(a) == decodeJSONString(b)
    }

    public var bool: Bool? {
        if raw.count == 4 && raw[0] == UInt8(ascii: "t") { return true }
        if raw.count == 5 && raw[0] == UInt8(ascii: "f") { return false }
        return nil
    }

    /// An unsigned integer (no sign, fraction or exponent), else nil.
    public var uint64: UInt64? { kind == .number ? JSONBytes.parseUInt(raw) : nil }

    public var double: Double? {
        // Any length: a literal of 64 digits is as much a number as one of 6 (the buffer is on
        // the heap past the stack's share).
        guard kind == .number else { return nil }
        return withUnsafeTemporaryAllocation(of: CChar.self, capacity: raw.count + 1) { buffer in
            for i in 0..<raw.count { buffer[i] = CChar(bitPattern: raw[i]) }
            buffer[raw.count] = 0
            var end: UnsafeMutablePointer<CChar>?
            let value = strtod(buffer.baseAddress!, &end)
            return end == buffer.baseAddress! + raw.count ? value : nil
        }
    }

    /// A string holding an RFC 3339 time, as seconds since 1970.
    public var seconds: Double? {
        guard let contents = stringContents else { return nil }
        return RFC3339.parse(contents)?.secondsSince1970
    }
}

/// Small operations on the bytes of records, under one name: what plugins reach through the
/// SDK is then one namespace, not loose functions.
public enum JSONBytes {
    /// Byte-wise equality of two views. Short ones (keys, names) are compared in line: a call to
    /// memcmp costs more than the comparison itself there.
    @inlinable @inline(__always)
    public static func equal(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        guard let pa = a.baseAddress, let pb = b.baseAddress else { return true }
        if a.count <= 32 {
            for i in 0..<a.count where pa[i] != pb[i] { return false }
            return true
        }
        return memcmp(pa, pb, a.count) == 0
    }

    /// Whether `needle` occurs in `haystack` (a plain search: the needles are short keys).
    public static func contains(_ haystack: UnsafeBufferPointer<UInt8>, _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count, let first = needle.first else { return false }
        return needle.withUnsafeBufferPointer { n in
            var i = 0
            while i <= haystack.count - n.count {
                if haystack[i] == first && equal(UnsafeBufferPointer(rebasing: haystack[i..<(i + n.count)]), n) {
                    return true
                }
                i += 1
            }
            return false
        }
    }
}

extension JSONBytes {
    /// A decimal unsigned integer, or nil if it is not one (or overflows).
    public static func parseUInt(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64? {
        guard !bytes.isEmpty else { return nil }
        var v: UInt64 = 0
        for b in bytes {
            guard b >= 0x30 && b <= 0x39 else { return nil }
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (a, o2) = m.addingReportingOverflow(UInt64(b - 0x30))
            if o1 || o2 { return nil }
            v = a
        }
        return v
    }
}
