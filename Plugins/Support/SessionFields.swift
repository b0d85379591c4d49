// The compact forms a `SessionIndex` keeps a session's fields in.

import WhendWire

/// A time as `YYYY-MM-DDTHH:MM:SS[.f…]Z` (up to six digits of fraction, fields in their
/// ranges) packed in 63 bits below a flag bit: the same text is made from it, byte for byte.
/// 0 is no time (empty); 1, a time kept as text elsewhere.
package struct PackedTime: Equatable {
    package var bits: UInt64

    static let spilled = PackedTime(bits: 1)

    package init(bits: UInt64) { self.bits = bits }

    init?(_ text: String) {
        if text.isEmpty {
            bits = 0
            return
        }
        var text = text
        guard let packed = text.withUTF8({ PackedTime($0) }) else { return nil }
        self = packed
    }

    package init?(_ b: UnsafeBufferPointer<UInt8>) {
        let n = b.count
        guard n >= 20, n <= 27, b[n - 1] == UInt8(ascii: "Z"), b[4] == UInt8(ascii: "-"),
            b[7] == UInt8(ascii: "-"), b[10] == UInt8(ascii: "T"), b[13] == UInt8(ascii: ":"),
            b[16] == UInt8(ascii: ":")
        else { return nil }
        func digits(_ from: Int, _ count: Int) -> UInt64? {
            var v: UInt64 = 0
            for i in from..<from + count {
                let d = b[i] &- UInt8(ascii: "0")
                guard d < 10 else { return nil }
                v = v * 10 + UInt64(d)
            }
            return v
        }
        guard let year = digits(0, 4), let month = digits(5, 2), month <= 12, let day = digits(8, 2), day <= 31,
            let hour = digits(11, 2), hour <= 23, let minute = digits(14, 2), minute <= 59,
            let second = digits(17, 2), second <= 60
        else { return nil }
        var fractionDigits: UInt64 = 0
        var fraction: UInt64 = 0
        if n > 20 {
            guard n >= 22, b[19] == UInt8(ascii: "."), let f = digits(20, n - 21) else { return nil }
            fractionDigits = UInt64(n - 21)
            fraction = f
        }
        bits =
            1 << 63 | year << 49 | month << 45 | day << 40 | hour << 35 | minute << 29 | second << 23
            | fractionDigits << 20 | fraction
    }

    /// The text, or nil for one kept elsewhere.
    package var string: String? { withText { String(decoding: $0, as: UTF8.self) } }

    /// `body` given the text's bytes (no allocation), or nil for one kept elsewhere.
    func withText<R>(_ body: (UnsafeBufferPointer<UInt8>) -> R) -> R? {
        if bits == 1 { return nil }
        if bits == 0 { return body(UnsafeBufferPointer(start: nil, count: 0)) }
        let fractionDigits = Int((bits >> 20) & 7)
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 28) { out in
            var i = 0
            func put(_ value: UInt64, _ count: Int) {
                var v = value
                for j in stride(from: count - 1, through: 0, by: -1) {
                    out[i + j] = UInt8(ascii: "0") + UInt8(v % 10)
                    v /= 10
                }
                i += count
            }
            func char(_ c: Unicode.Scalar) {
                out[i] = UInt8(ascii: c)
                i += 1
            }
            put((bits >> 49) & 0x3FFF, 4)
            char("-")
            put((bits >> 45) & 0xF, 2)
            char("-")
            put((bits >> 40) & 0x1F, 2)
            char("T")
            put((bits >> 35) & 0x1F, 2)
            char(":")
            put((bits >> 29) & 0x3F, 2)
            char(":")
            put((bits >> 23) & 0x3F, 2)
            if fractionDigits > 0 {
                char(".")
                put(bits & 0xFFFFF, fractionDigits)
            }
            char("Z")
            return body(UnsafeBufferPointer(rebasing: out[0..<i]))
        }
    }
}

/// A short text in 32 bytes, no allocation: up to 31 bytes as they are, or up to 41 characters
/// of `0-9a-zA-Z-_` (a UUID's, a base64url id's) at six bits each. The last byte says which:
/// the length, or 0x80 plus the length; 0xFF is a text kept elsewhere.
struct InlineText {
    private var words: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    static let spilled: InlineText = {
        var t = InlineText()
        withUnsafeMutableBytes(of: &t.words) { $0[31] = 0xFF }
        return t
    }()

    private init() {}

    private static let alphabet = Array("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_".utf8)
    private static let codes: [UInt8] = {
        var codes = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { codes[Int(c)] = UInt8(i) }
        return codes
    }()

    init?(_ text: String) {
        var text = text
        guard let inline = text.withUTF8({ InlineText($0) }) else { return nil }
        self = inline
    }

    init?(_ b: UnsafeBufferPointer<UInt8>) {
        if b.count <= 31 {
            withUnsafeMutableBytes(of: &words) { out in
                for i in b.indices { out[i] = b[i] }
                out[31] = UInt8(b.count)
            }
            return
        }
        guard b.count <= 41 else { return nil }
        let codes = Self.codes
        var fits = true
        withUnsafeMutableBytes(of: &words) { out in
            var bit = 0
            for c in b {
                let code = codes[Int(c)]
                guard code != 0xFF else {
                    fits = false
                    return
                }
                // Six bits from `bit` on, least significant first.
                let byte = bit >> 3
                let shift = bit & 7
                out[byte] |= code << shift
                if shift > 2 { out[byte + 1] |= code >> (8 - shift) }
                bit += 6
            }
            out[31] = 0x80 | UInt8(b.count)
        }
        if !fits { return nil }
    }

    var isSpilled: Bool { withUnsafeBytes(of: words) { $0[31] == 0xFF } }

    /// The text, or nil for one kept elsewhere.
    var string: String? { withText { String(decoding: $0, as: UTF8.self) } }

    /// `body` given the text's bytes (no allocation), or nil for one kept elsewhere.
    func withText<R>(_ body: (UnsafeBufferPointer<UInt8>) -> R) -> R? {
        withUnsafeBytes(of: words) { b -> R? in
            let tag = b[31]
            if tag == 0xFF { return nil }
            if tag & 0x80 == 0 {
                return b.withMemoryRebound(to: UInt8.self) { body(UnsafeBufferPointer(rebasing: $0[0..<Int(tag)])) }
            }
            let count = Int(tag & 0x7F)
            let alphabet = Self.alphabet
            return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 41) { out in
                var bit = 0
                for i in 0..<count {
                    let byte = bit >> 3
                    let shift = bit & 7
                    var code = Int(b[byte] >> shift)
                    if shift > 2 { code |= Int(b[byte + 1]) << (8 - shift) }
                    out[i] = alphabet[code & 0x3F]
                    bit += 6
                }
                return body(UnsafeBufferPointer(rebasing: out[0..<count]))
            }
        }
    }
}

/// The names of the types counted, each once, for `InlineCounts` to count them by number: at
/// most 1,024 (a type past those is counted by name). Names are told apart by their bytes, as the
/// journal stores them: Swift's `==` on strings takes "é" and "e\u{301}" for one.
struct TypeTable {
    private(set) var names: [String] = []
    private var numbers: [[UInt8]: UInt16] = [:]

    /// The number of `type`, added if new and there is room.
    mutating func index(of type: String) -> UInt16? {
        if names.count <= 16 {
            if let i = names.firstIndex(where: { $0.utf8.elementsEqual(type.utf8) }) { return UInt16(i) }
        } else if let i = numbers[Array(type.utf8)] {
            return i
        }
        guard names.count < 1024 else { return nil }
        let i = UInt16(names.count)
        names.append(type)
        numbers[Array(type.utf8)] = i
        return i
    }

    func name(_ index: UInt16) -> String { names[Int(index)] }

    /// The first 16 names' first spellings as stored (a JSON string, quotes included), by
    /// number: a record's type is found by its bytes, without making a string of it (the same
    /// bytes decode to the same name). Empty for a name not seen so.
    private var spellings: [[UInt8]] = []

    /// `index(of:)` the type of a record as stored: a string's text, else "".
    mutating func index(ofStored value: JSONValue?) -> UInt16? {
        guard let value, value.stringContents != nil else { return index(of: "") }
        for (i, spelling) in spellings.enumerated()
        where spelling.withUnsafeBufferPointer({ JSONBytes.equal($0, value.raw) }) {
            return UInt16(i)
        }
        guard let i = index(of: value.string ?? "") else { return nil }
        if i < 16 {
            while spellings.count <= Int(i) { spellings.append([]) }
            if spellings[Int(i)].isEmpty { spellings[Int(i)] = Array(value.raw) }
        }
        return i
    }
}

/// A session's counts by type, up to eight types, in the order of their names' bytes (as `TypeCounts`):
/// each a lane of 32 bits, the type's number in `TypeTable` (plus one) in 11 bits above a
/// count of 21. A session of an app's journeys has five types or six (its screens' lifecycle,
/// navigation, `When` events, errors, and what screen-tracking derives): with four, most
/// spilled their counts to a table of their own. All ones in the first lane: the counts are
/// kept elsewhere (2,047 is no type's number).
struct InlineCounts {
    private var words: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (0, 0, 0, 0, 0, 0, 0, 0)
    private static let lanes = 8
    private static let countBits: UInt32 = 21
    private static let countMask: UInt32 = (1 << countBits) - 1

    static let spilled: InlineCounts = {
        var c = InlineCounts()
        c.words.0 = .max
        return c
    }()

    var isSpilled: Bool { words.0 == .max }

    func forEach(_ body: (UInt16, Int) -> Void) {
        withUnsafeBytes(of: words) { raw in
            for w in raw.bindMemory(to: UInt32.self) where w != 0 {
                body(UInt16(w >> Self.countBits) - 1, Int(w & Self.countMask))
            }
        }
    }

    /// One more of `type`; false if it does not fit.
    mutating func add(_ type: UInt16, names: TypeTable) -> Bool {
        guard type < 2046 else { return false }
        let tag = UInt32(type + 1) << Self.countBits
        let found = withUnsafeMutableBytes(of: &words) { raw -> Bool? in
            let w = raw.bindMemory(to: UInt32.self)
            for i in 0..<Self.lanes where w[i] & ~Self.countMask == tag {
                guard w[i] & Self.countMask < Self.countMask else { return false }
                w[i] += 1
                return true
            }
            return nil
        }
        if let found { return found }
        return set(type, 1, names: names)
    }

    /// Counts `n` of a type not counted yet; false if it does not fit.
    mutating func set(_ type: UInt16, _ n: Int, names: TypeTable) -> Bool {
        guard n >= 0, n <= Int(Self.countMask), type < 2046 else { return false }
        let name = names.name(type)
        return withUnsafeMutableBytes(of: &words) { raw -> Bool in
            let w = raw.bindMemory(to: UInt32.self)
            let last = Self.lanes - 1
            guard w[last] == 0 else { return false }
            var at = 0
            while at < Self.lanes, w[at] != 0,
                names.name(UInt16(w[at] >> Self.countBits) - 1).utf8.lexicographicallyPrecedes(name.utf8)
            {
                at += 1
            }
            var i = last
            while i > at {
                w[i] = w[i - 1]
                i -= 1
            }
            w[at] = UInt32(type + 1) << Self.countBits | UInt32(n)
            return true
        }
    }
}
