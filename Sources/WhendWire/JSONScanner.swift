/// The kind of a JSON value, as the scanner saw it.
public enum JSONKind: Sendable, Equatable {
    case string, number, bool, null, object, array
}

/// A validating, allocation-free JSON scanner over one line of bytes.
///
/// It checks the grammar of RFC 8259 exactly (strings, escapes, numbers, literals, nesting) but
/// builds no tree: callers ask for the next token and get byte ranges back. Values the caller
/// does not care about are skipped with full validation. Nesting deeper than `maxDepth` is an
/// error rather than a deep recursion, so hostile input cannot exhaust the stack.
package struct JSONScanner {
    package static let maxDepth = 512

    package let bytes: UnsafeBufferPointer<UInt8>
    package var position: Int
    /// Whether the last string value `scanValue` crossed held escapes (so that its reader need
    /// not look again).
    package private(set) var lastValueHadEscapes = false
    /// Whether the scan crossed anything not in canonical form (`appendCanonicalJSON`) since
    /// this was last cleared: whitespace between tokens, or an escape other than the few the
    /// canonical form writes. `scanObject` clears it before each member, so that a member
    /// already canonical (most of them: encoders write compact JSON) is copied whole.
    package var sawNonCanonical = false

    package init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
        self.position = 0
    }

    @inlinable package var atEnd: Bool { position >= bytes.count }

    @inlinable package func peek() -> UInt8? { position < bytes.count ? bytes[position] : nil }

    package mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case 0x20, 0x09, 0x0A, 0x0D:
                position += 1
                sawNonCanonical = true
            default: return
            }
        }
    }

    package func syntaxError(_ what: String) -> WireError {
        WireError(.invalidJSON, "the line is not valid JSON: \(what) at byte \(position + 1)")
    }

    package mutating func expect(_ byte: UInt8, _ what: String) throws(WireError) {
        skipWhitespace()
        guard peek() == byte else {
            throw syntaxError(atEnd ? "the line ends where \(what) was expected" : "expected \(what)")
        }
        position += 1
    }

    /// Scans a string starting at the current position (which must be its opening quote).
    /// Returns the range of its raw contents (without quotes) and whether it holds escapes.
    package mutating func scanString() throws(WireError) -> (range: Range<Int>, hasEscapes: Bool) {
        guard peek() == UInt8(ascii: "\"") else { throw syntaxError("expected a string") }
        position += 1
        let start = position
        var hasEscapes = false
        let count = bytes.count
        let base = bytes.baseAddress!
        while position < count {
            // Straight to the next quote, backslash or control character.
            position += firstStringSpecial(base + position, count - position)
            guard position < count else { break }
            let b = bytes[position]
            if b == UInt8(ascii: "\"") {
                let range = start..<position
                position += 1
                return (range, hasEscapes)
            } else if b == UInt8(ascii: "\\") {
                hasEscapes = true
                position += 1
                guard position < count else { break }
                switch bytes[position] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    position += 1
                case UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"):
                    position += 1
                    sawNonCanonical = true
                case UInt8(ascii: "u"):
                    guard position + 4 < count else { position = count; break }
                    for k in 1...4 where hexValue(bytes[position + k]) == nil {
                        position += k
                        throw syntaxError("invalid \\u escape")
                    }
                    if !isCanonicalControlEscape(position + 1) { sawNonCanonical = true }
                    position += 5
                default:
                    throw syntaxError("invalid escape")
                }
            } else if b < 0x20 {
                throw syntaxError("control character inside a string")
            } else {
                position += 1
            }
        }
        throw syntaxError("unterminated string")
    }

    /// Whether the four hex digits at `at` are how the canonical form escapes a control
    /// character (`\u00` and two lower-case digits, below 0x20, not \t \n \r): any other `\u`
    /// (a printable character, a surrogate, upper case) is written otherwise there.
    @inline(__always) private func isCanonicalControlEscape(_ at: Int) -> Bool {
        guard bytes[at] == 0x30, bytes[at + 1] == 0x30 else { return false }
        let high = bytes[at + 2]
        let low = bytes[at + 3]
        guard high == 0x30 || high == 0x31, (low >= 0x30 && low <= 0x39) || (low >= 0x61 && low <= 0x66) else {
            return false
        }
        return !(high == 0x30 && (low == 0x39 || low == 0x61 || low == 0x64))
    }

    mutating func scanNumber() throws(WireError) {
        let count = bytes.count
        if peek() == UInt8(ascii: "-") { position += 1 }
        guard let first = peek(), first >= 0x30 && first <= 0x39 else { throw syntaxError("invalid number") }
        position += 1
        if first != 0x30 {
            while position < count, bytes[position] >= 0x30 && bytes[position] <= 0x39 { position += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            position += 1
            guard let d = peek(), d >= 0x30 && d <= 0x39 else { throw syntaxError("invalid number") }
            while position < count, bytes[position] >= 0x30 && bytes[position] <= 0x39 { position += 1 }
        }
        if let e = peek(), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            position += 1
            if let s = peek(), s == UInt8(ascii: "+") || s == UInt8(ascii: "-") { position += 1 }
            guard let d = peek(), d >= 0x30 && d <= 0x39 else { throw syntaxError("invalid number") }
            while position < count, bytes[position] >= 0x30 && bytes[position] <= 0x39 { position += 1 }
        }
    }

    mutating func scanLiteral(_ literal: StaticString) throws(WireError) {
        let n = literal.utf8CodeUnitCount
        guard position + n <= bytes.count else { throw syntaxError("invalid literal") }
        let lit = literal.utf8Start
        for k in 0..<n where bytes[position + k] != lit[k] { throw syntaxError("invalid literal") }
        position += n
    }

    /// Scans (validates and skips) any value starting at the current position, after
    /// whitespace. Returns its kind and its raw byte range.
    package mutating func scanValue(depth: Int = 0) throws(WireError) -> (kind: JSONKind, range: Range<Int>) {
        skipWhitespace()
        let start = position
        guard let b = peek() else { throw syntaxError("the line ends where a value was expected") }
        let kind: JSONKind
        switch b {
        case UInt8(ascii: "\""):
            lastValueHadEscapes = try scanString().hasEscapes
            kind = .string
        case UInt8(ascii: "{"):
            try scanContainer(close: UInt8(ascii: "}"), isObject: true, depth: depth + 1)
            kind = .object
        case UInt8(ascii: "["):
            try scanContainer(close: UInt8(ascii: "]"), isObject: false, depth: depth + 1)
            kind = .array
        case UInt8(ascii: "t"):
            try scanLiteral("true")
            kind = .bool
        case UInt8(ascii: "f"):
            try scanLiteral("false")
            kind = .bool
        case UInt8(ascii: "n"):
            try scanLiteral("null")
            kind = .null
        case UInt8(ascii: "-"), 0x30...0x39:
            try scanNumber()
            kind = .number
        default:
            throw syntaxError("unexpected character")
        }
        return (kind, start..<position)
    }

    /// One member of an object: where its key (without quotes) and its value lie.
    package struct Member {
        /// The key's raw contents, without the quotes.
        package var key: Range<Int>
        /// The key with its quotes, as it came.
        package var quotedKey: Range<Int>
        package var keyHasEscapes: Bool
        package var kind: JSONKind
        package var value: Range<Int>
        /// For a string value: whether it holds escapes.
        package var valueHasEscapes: Bool
        /// Whether the bytes from the key's opening quote to the value's end are already the
        /// member's canonical form, `"key":value` (`appendCanonicalJSON`).
        package var canonical: Bool
    }

    /// Scans the object that starts at the current position (after whitespace), calling `body`
    /// for each member in order, and leaves the position after its closing brace.
    @inline(__always)
    package mutating func scanObject(depth: Int = 0, _ body: (Member) throws(WireError) -> Void) throws(WireError) {
        skipWhitespace()
        guard peek() == UInt8(ascii: "{") else { throw syntaxError("expected an object") }
        position += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            position += 1
            return
        }
        while true {
            skipWhitespace()
            let keyStart = position
            sawNonCanonical = false
            let (key, escaped) = try scanString()
            let keyEnd = position
            try expect(UInt8(ascii: ":"), "':' after a key")
            let (kind, value) = try scanValue(depth: depth + 1)
            try body(
                Member(
                    key: key, quotedKey: keyStart..<keyEnd, keyHasEscapes: escaped, kind: kind, value: value,
                    valueHasEscapes: kind == .string && lastValueHadEscapes, canonical: !sawNonCanonical))
            skipWhitespace()
            guard let b = peek() else { throw syntaxError("the line ends inside an object") }
            position += 1
            if b == UInt8(ascii: "}") { return }
            guard b == UInt8(ascii: ",") else {
                position -= 1
                throw syntaxError("expected ',' or '}'")
            }
        }
    }

    /// Scans the array that starts at the current position (after whitespace), calling `body`
    /// with each element's kind and range in order, and leaves the position after its bracket.
    package mutating func scanArray(
        depth: Int = 0, _ body: (JSONKind, Range<Int>) throws(WireError) -> Void
    ) throws(WireError) {
        skipWhitespace()
        guard peek() == UInt8(ascii: "[") else { throw syntaxError("expected an array") }
        position += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "]") {
            position += 1
            return
        }
        while true {
            let (kind, value) = try scanValue(depth: depth + 1)
            try body(kind, value)
            skipWhitespace()
            guard let b = peek() else { throw syntaxError("the line ends inside an array") }
            position += 1
            if b == UInt8(ascii: "]") { return }
            guard b == UInt8(ascii: ",") else {
                position -= 1
                throw syntaxError("expected ',' or ']'")
            }
        }
    }

    mutating func scanContainer(close: UInt8, isObject: Bool, depth: Int) throws(WireError) {
        guard depth <= JSONScanner.maxDepth else {
            throw WireError(.invalidJSON, "values nest deeper than \(JSONScanner.maxDepth) levels")
        }
        position += 1  // the opening bracket
        skipWhitespace()
        if peek() == close {
            position += 1
            return
        }
        while true {
            if isObject {
                skipWhitespace()
                _ = try scanString()
                try expect(UInt8(ascii: ":"), "':' after a key")
            }
            _ = try scanValue(depth: depth)
            skipWhitespace()
            guard let b = peek() else { throw syntaxError("the line ends inside a container") }
            position += 1
            if b == close { return }
            guard b == UInt8(ascii: ",") else {
                position -= 1
                throw syntaxError("expected ',' or '\(Character(Unicode.Scalar(close)))'")
            }
        }
    }
}

/// Where the first byte of `p[0..<n]` that ends a string's plain run is — a `"`, a `\\` or a
/// control character (below 0x20) — or `n` if there is none: sixteen bytes at a time (Swift's
/// SIMD types: SSE2 on x86-64, NEON on arm64), the byte found in a block by the position of its
/// lane's mark, then one at a time for the tail. The one string skip of every reader of JSON in
/// whend: the event scanner crosses every key and string value of an event with it, and
/// readers of stored records and plugins' field scans theirs. Plain Swift rather than C, so
/// that importing WhendWire needs no C module (apps compile against it with `swiftc -I`), and
/// inlinable into those other modules.
@inlinable @inline(__always) package func firstStringSpecial(_ p: UnsafePointer<UInt8>, _ n: Int) -> Int {
    var i = 0
    let quote = SIMD16<UInt8>(repeating: 0x22)
    let backslash = SIMD16<UInt8>(repeating: 0x5C)
    let space = SIMD16<UInt8>(repeating: 0x20)
    while i + 16 <= n {
        let v = UnsafeRawPointer(p + i).loadUnaligned(as: SIMD16<UInt8>.self)
        let found = (v .== quote) .| (v .== backslash) .| (v .< space)
        if any(found) {
            // Each lane found becomes 0xFF; the first is the lowest nonzero byte (little-endian).
            let marks = unsafeBitCast(
                SIMD16<UInt8>(repeating: 0).replacing(with: 0xFF, where: found), to: SIMD2<UInt64>.self)
            return i + (marks[0] != 0 ? marks[0].trailingZeroBitCount : 64 + marks[1].trailingZeroBitCount) / 8
        }
        i += 16
    }
    while i < n {
        let b = p[i]
        if b == 0x22 || b == 0x5C || b < 0x20 { return i }
        i += 1
    }
    return n
}

@inline(__always) func hexValue(_ b: UInt8) -> UInt32? {
    switch b {
    case 0x30...0x39: return UInt32(b - 0x30)
    case 0x41...0x46: return UInt32(b - 0x41 + 10)
    case 0x61...0x66: return UInt32(b - 0x61 + 10)
    default: return nil
    }
}

/// Where the string whose contents start at `start` in `p` (of `n` bytes) closes: the index of
/// its closing quote (`n`, or one past it, when there is none), and whether a backslash escape
/// came before it. For strings already validated or stored: a control byte is stepped over as
/// the byte it is.
@inlinable @inline(__always) package func stringEnd(
    _ p: UnsafePointer<UInt8>, from start: Int, _ n: Int
) -> (quote: Int, escaped: Bool) {
    var j = start
    var escaped = false
    while j < n {
        j += firstStringSpecial(p + j, n - j)
        guard j < n else { break }
        if p[j] == UInt8(ascii: "\\") {
            escaped = true
            j += 2
        } else if p[j] == UInt8(ascii: "\"") {
            return (j, escaped)
        } else {
            j += 1
        }
    }
    return (j, escaped)
}

/// What the `\u` escape whose four hex digits start at `i` in `raw` (validated string contents)
/// spells, and how many bytes after the `\u` it takes: a high surrogate followed by the escape
/// of its low partner is the pair's scalar (10 bytes); anything else is its 16-bit value (4
/// bytes), a lone surrogate included, for the caller to keep or replace.
@inline(__always) func unicodeEscape(_ raw: UnsafeBufferPointer<UInt8>, at i: Int) -> (value: UInt32, length: Int) {
    func hex4(_ at: Int) -> UInt32 {
        var v: UInt32 = 0
        for k in 0..<4 { v = v << 4 | (hexValue(raw[at + k]) ?? 0) }
        return v
    }
    let v = hex4(i)
    if v >= 0xD800 && v <= 0xDBFF, i + 10 <= raw.count, raw[i + 4] == UInt8(ascii: "\\"),
        raw[i + 5] == UInt8(ascii: "u")
    {
        let low = hex4(i + 6)
        if low >= 0xDC00 && low <= 0xDFFF { return (0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00), 10) }
    }
    return (v, 4)
}

/// Decodes the raw contents of a JSON string (as `JSONScanner.scanString` delimits them, already
/// validated) into UTF-8 bytes. Unpaired surrogates in `\u` escapes become U+FFFD, or, with
/// `keepingLoneSurrogates`, the three bytes UTF-8's pattern would give them (as WTF-8 does):
/// then two strings decode alike only if they are one JSON string, and a string without such a
/// surrogate decodes as without the option.
package func decodeJSONString(_ raw: UnsafeBufferPointer<UInt8>, keepingLoneSurrogates: Bool = false) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(raw.count)
    var i = 0
    func appendScalar(_ v: UInt32) {
        if keepingLoneSurrogates, v >= 0xD800, v <= 0xDFFF {
            out.append(UInt8(0xE0 | (v >> 12)))
            out.append(UInt8(0x80 | ((v >> 6) & 0x3F)))
            out.append(UInt8(0x80 | (v & 0x3F)))
            return
        }
        let scalar = Unicode.Scalar(v) ?? "\u{FFFD}"
        out.append(contentsOf: String(Character(scalar)).utf8)
    }
    while i < raw.count {
        let b = raw[i]
        guard b == UInt8(ascii: "\\"), i + 1 < raw.count else {
            out.append(b)
            i += 1
            continue
        }
        let e = raw[i + 1]
        i += 2
        switch e {
        case UInt8(ascii: "b"): out.append(0x08)
        case UInt8(ascii: "f"): out.append(0x0C)
        case UInt8(ascii: "n"): out.append(0x0A)
        case UInt8(ascii: "r"): out.append(0x0D)
        case UInt8(ascii: "t"): out.append(0x09)
        case UInt8(ascii: "u"):
            guard i + 4 <= raw.count else { return out }
            let (v, length) = unicodeEscape(raw, at: i)
            i += length
            appendScalar(v)
        default: out.append(e)
        }
    }
    return out
}

/// The string whose raw contents (as `JSONScanner.scanString` delimits them, already
/// validated) are `raw`, decoded; nil where Foundation's JSON reader refuses one: bytes that are
/// not UTF-8, or a `\u` escape of a surrogate without its partner (not made U+FFFD).
package func decodedJSONString(_ raw: UnsafeBufferPointer<UInt8>, hasEscapes: Bool) -> String? {
    guard hasEscapes else { return String(validating: raw, as: UTF8.self) }
    var i = 0
    while i + 1 < raw.count {
        guard raw[i] == UInt8(ascii: "\\") else {
            i += 1
            continue
        }
        guard raw[i + 1] == UInt8(ascii: "u"), i + 6 <= raw.count else {
            i += 2
            continue
        }
        let (value, length) = unicodeEscape(raw, at: i + 2)
        if value >= 0xD800 && value <= 0xDFFF { return nil }
        i += 2 + length
    }
    return String(validating: decodeJSONString(raw), as: UTF8.self)
}

/// Appends `bytes` to `out` as a JSON string literal, quotes included.
package func appendJSONString(_ bytes: some Sequence<UInt8>, to out: inout [UInt8]) {
    if let done: Void = bytes.withContiguousStorageIfAvailable({ appendJSONString($0, to: &out) }) { return done }
    appendJSONString(Array(bytes), to: &out)
}

/// Appends `bytes` to `out` as a JSON string literal, quotes included. Runs that need no escape
/// are copied whole: this runs for every string of every derived record.
package func appendJSONString(_ bytes: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
    func hex(_ nibble: UInt8) -> UInt8 { nibble < 10 ? 0x30 + nibble : 0x57 + nibble }
    out.append(UInt8(ascii: "\""))
    var runStart = 0
    for i in 0..<bytes.count {
        let b = bytes[i]
        guard b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") else { continue }
        if i > runStart { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<i])) }
        runStart = i + 1
        out.append(UInt8(ascii: "\\"))
        switch b {
        case 0x0A: out.append(UInt8(ascii: "n"))
        case 0x0D: out.append(UInt8(ascii: "r"))
        case 0x09: out.append(UInt8(ascii: "t"))
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(b)
        default:
            out.append(UInt8(ascii: "u"))
            out.append(UInt8(ascii: "0"))
            out.append(UInt8(ascii: "0"))
            out.append(hex(b >> 4))
            out.append(hex(b & 0xF))
        }
    }
    if bytes.count > runStart { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart...])) }
    out.append(UInt8(ascii: "\""))
}
