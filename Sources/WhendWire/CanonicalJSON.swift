/// The canonical form in which whend stores JSON (PROTOCOL.md §7): no whitespace between tokens,
/// and every string escaped the one way `appendJSONString` escapes: `\"`, `\\`, `\n`, `\r`, `\t`,
/// other control characters as `\u00xx` (lower-case), everything else as its UTF-8 bytes. A
/// `\u` escape of a surrogate that has no partner stays an escape (lower-case): UTF-8 has no
/// bytes for it, and turning it into U+FFFD would change the value. Numbers are kept as written.
///
/// Stored records are one line each, so a value a client or a plugin wrote over several lines
/// must lose its line breaks here; and a plugin that matches bytes (`"app":"x"`) must not be
/// escapable by a space or by `\u0078`. `JSONScanner` tells whether a member is canonical already
/// (`Member.canonical`): only members that are not come here.
///
/// - Parameter value: one JSON value, validated by `JSONScanner` (this does not check it again).
package func appendCanonicalJSON(_ value: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
    guard let base = value.baseAddress else { return }
    let count = value.count
    var i = 0
    while i < count {
        let b = value[i]
        switch b {
        case 0x20, 0x09, 0x0A, 0x0D:
            i += 1
        case UInt8(ascii: "\""):
            // To the closing quote: a backslash escapes the byte after it.
            let (quote, escaped) = stringEnd(base, from: i + 1, count)
            let end = min(quote, count)
            if escaped {
                appendCanonicalString(UnsafeBufferPointer(rebasing: value[(i + 1)..<end]), to: &out)
            } else {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: value[i..<min(end + 1, count)]))
            }
            i = end + 1
        default:
            // A run of punctuation, digits or a literal, up to the next space or string.
            var j = i + 1
            while j < count {
                let c = value[j]
                if c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D || c == UInt8(ascii: "\"") { break }
                j += 1
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: value[i..<j]))
            i = j
        }
    }
}

/// Appends the raw contents of a validated JSON string (between its quotes, escapes as written)
/// as a string literal in canonical form, quotes included.
package func appendCanonicalString(_ raw: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
    out.append(UInt8(ascii: "\""))
    var i = 0
    var run = 0
    func appendHex4(_ v: UInt32) {
        for shift in stride(from: 12, through: 0, by: -4) {
            let nibble = UInt8((v >> UInt32(shift)) & 0xF)
            out.append(nibble < 10 ? 0x30 + nibble : 0x57 + nibble)
        }
    }
    func appendScalar(_ v: UInt32) {
        switch v {
        case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
        case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
        case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
        case 0..<0x20:
            out.append(contentsOf: [0x5C, UInt8(ascii: "u")])
            appendHex4(v)
        case 0x22, 0x5C: out.append(contentsOf: [0x5C, UInt8(v)])
        case 0x20..<0x80: out.append(UInt8(v))
        case 0x80..<0x800:
            out.append(UInt8(0xC0 | (v >> 6)))
            out.append(UInt8(0x80 | (v & 0x3F)))
        case 0x800..<0x10000:
            out.append(UInt8(0xE0 | (v >> 12)))
            out.append(UInt8(0x80 | ((v >> 6) & 0x3F)))
            out.append(UInt8(0x80 | (v & 0x3F)))
        default:
            out.append(UInt8(0xF0 | (v >> 18)))
            out.append(UInt8(0x80 | ((v >> 12) & 0x3F)))
            out.append(UInt8(0x80 | ((v >> 6) & 0x3F)))
            out.append(UInt8(0x80 | (v & 0x3F)))
        }
    }
    while i < raw.count {
        guard raw[i] == UInt8(ascii: "\\"), i + 1 < raw.count else {
            i += 1
            continue
        }
        if i > run { out.append(contentsOf: UnsafeBufferPointer(rebasing: raw[run..<i])) }
        let e = raw[i + 1]
        i += 2
        switch e {
        case UInt8(ascii: "b"): appendScalar(0x08)
        case UInt8(ascii: "f"): appendScalar(0x0C)
        case UInt8(ascii: "n"): appendScalar(0x0A)
        case UInt8(ascii: "r"): appendScalar(0x0D)
        case UInt8(ascii: "t"): appendScalar(0x09)
        case UInt8(ascii: "u") where i + 4 <= raw.count:
            let (v, length) = unicodeEscape(raw, at: i)
            i += length
            // A lone surrogate stays an escape: it has no UTF-8 to write raw.
            if v >= 0xD800 && v <= 0xDFFF {
                out.append(contentsOf: [0x5C, UInt8(ascii: "u")])
                appendHex4(v)
            } else {
                appendScalar(v)
            }
        default: appendScalar(UInt32(e))  // \" \\ \/
        }
        run = i
    }
    if raw.count > run { out.append(contentsOf: UnsafeBufferPointer(rebasing: raw[run...])) }
    out.append(UInt8(ascii: "\""))
}

/// `"key":value` in canonical form, for a member `JSONScanner` found not canonical.
package func appendCanonicalMember(
    _ m: JSONScanner.Member, of bytes: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]
) {
    if m.keyHasEscapes {
        appendCanonicalString(UnsafeBufferPointer(rebasing: bytes[m.key]), to: &out)
    } else {
        out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[m.quotedKey]))
    }
    out.append(UInt8(ascii: ":"))
    appendCanonicalJSON(UnsafeBufferPointer(rebasing: bytes[m.value]), to: &out)
}
