/// Builds one JSON object as bytes, keys in the order they are written: the same calls write
/// the same bytes (so a live pipeline and `whenctl replay` derive byte-identical records). No
/// Foundation, no dictionary, one growing buffer.
///
///     var out = JSONObjectWriter()
///     out.string("type", "screen")
///     out.value("name", record[.screen])   // copied as stored
///     try host.emit(out)
public struct JSONObjectWriter {
    public private(set) var bytes: [UInt8]
    private var empty = true

    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
        removeAll()
    }

    /// Back to `{}`, keeping the buffer: a plugin that derives many records writes each in one.
    public mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        bytes.append(UInt8(ascii: "{"))
        bytes.append(UInt8(ascii: "}"))
        empty = true
    }

    /// Opens a member: the closing brace is kept at the end, so `bytes` is always a whole object.
    private mutating func key(_ key: StaticString) {
        bytes.removeLast()
        if !empty { bytes.append(UInt8(ascii: ",")) }
        empty = false
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
    }

    private mutating func close() { bytes.append(UInt8(ascii: "}")) }

    public mutating func string(_ key: StaticString, _ value: String) {
        self.key(key)
        var value = value
        value.withUTF8 { appendJSONString($0, to: &bytes) }
        close()
    }

    public mutating func string(_ key: StaticString, _ value: StaticString) {
        self.key(key)
        appendJSONString(UnsafeBufferPointer(start: value.utf8Start, count: value.utf8CodeUnitCount), to: &bytes)
        close()
    }

    /// A value from a record, copied as it is stored; nothing when `value` is nil.
    public mutating func value(_ key: StaticString, _ value: JSONValue?) {
        guard let value else { return }
        raw(key, value.raw)
    }

    /// A value from a record, or JSON `null` when the record has none.
    public mutating func valueOrNull(_ key: StaticString, _ value: JSONValue?) {
        self.key(key)
        if let value {
            bytes.append(contentsOf: value.raw)
        } else {
            bytes.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
        }
        close()
    }

    /// Already-encoded JSON (a value, or an object another writer built).
    public mutating func raw(_ key: StaticString, _ json: UnsafeBufferPointer<UInt8>) {
        self.key(key)
        bytes.append(contentsOf: json)
        close()
    }

    public mutating func raw(_ key: StaticString, _ json: [UInt8]) {
        json.withUnsafeBufferPointer { raw(key, $0) }
    }

    public mutating func object(_ key: StaticString, _ object: JSONObjectWriter) { raw(key, object.bytes) }

    public mutating func number(_ key: StaticString, _ value: UInt64) {
        self.key(key)
        appendDecimal(value)
        close()
    }

    public mutating func number(_ key: StaticString, _ value: Int) {
        self.key(key)
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude.asUInt64)
        close()
    }

    /// A finite number with at most `fractionDigits` decimals, trailing zeros dropped (1.5, 2).
    public mutating func number(_ key: StaticString, _ value: Double, fractionDigits: Int = 3) {
        self.key(key)
        guard value.isFinite else {
            bytes.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
            close()
            return
        }
        var scale: UInt64 = 1
        for _ in 0..<max(0, min(fractionDigits, 9)) { scale *= 10 }
        let negative = value < 0
        let scaled = (abs(value) * Double(scale)).rounded()
        guard scaled < 9e18 else {
            bytes.append(contentsOf: "\(value)".utf8)
            close()
            return
        }
        let units = UInt64(scaled)
        if negative && units > 0 { bytes.append(UInt8(ascii: "-")) }
        appendDecimal(units / scale)
        var fraction = units % scale
        if fraction > 0 {
            var digits = max(0, min(fractionDigits, 9))
            while fraction % 10 == 0 {
                fraction /= 10
                digits -= 1
            }
            bytes.append(UInt8(ascii: "."))
            let start = bytes.count
            appendDecimal(fraction)
            // Leading zeros of the fraction (0.05 → "05").
            let written = bytes.count - start
            if written < digits {
                bytes.insert(contentsOf: repeatElement(UInt8(ascii: "0"), count: digits - written), at: start)
            }
        }
        close()
    }

    public mutating func bool(_ key: StaticString, _ value: Bool) {
        self.key(key)
        bytes.append(contentsOf: value ? [0x74, 0x72, 0x75, 0x65] : [0x66, 0x61, 0x6C, 0x73, 0x65])
        close()
    }

    public mutating func null(_ key: StaticString) {
        self.key(key)
        bytes.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
        close()
    }

    private mutating func appendDecimal(_ value: UInt64) { JSONBytes.appendDecimal(value, to: &bytes) }
}

extension UInt {
    fileprivate var asUInt64: UInt64 { UInt64(self) }
}

extension JSONBytes {
    /// Appends `value` in decimal, without building a String.
    public static func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
        if value == 0 {
            out.append(UInt8(ascii: "0"))
            return
        }
        let start = out.count
        var v = value
        while v > 0 {
            out.append(UInt8(ascii: "0") + UInt8(v % 10))
            v /= 10
        }
        out[start...].reverse()
    }
}
