import Foundation

/// A text's bytes as a reader would decode them, each decoded byte knowing the bytes of the
/// text it came from: as written, with JSON's escapes decoded (`\u` of any case, surrogate
/// pairs, `\/`), with URL percent-escapes decoded (any byte escaped or not, hex of any case,
/// `+` for a space or not), and both at once (a URL quoted in JSON). A secret is found in any
/// view, and hidden where it stands in the text, so that no encoder's choice of what to escape
/// lets it through: enumerating the encodings of a secret missed, for one, `-` left as is
/// beside `/` escaped.
struct SpelledText {
    var bytes: [UInt8]
    /// For each decoded byte, the range of the text it came from.
    var sources: [Range<Int>]

    /// The text as written, and decoded by one or two of JSON, percent-decoding and
    /// percent-decoding with `+` as a space, in any order (JSON in a URL's query, a URL in
    /// JSON, a URL in a URL); a decoding that would change nothing is skipped.
    static func views(of text: [UInt8]) -> [SpelledText] {
        let plain = SpelledText(bytes: text, sources: text.indices.map { $0..<($0 + 1) })
        func decodings(of view: SpelledText) -> [SpelledText] {
            var out: [SpelledText] = []
            if view.bytes.contains(UInt8(ascii: "\\")) { out.append(view.jsonDecoded()) }
            if view.bytes.contains(UInt8(ascii: "%")) { out.append(view.percentDecoded(plusIsSpace: false)) }
            if view.bytes.contains(UInt8(ascii: "+")) { out.append(view.percentDecoded(plusIsSpace: true)) }
            return out
        }
        let once = decodings(of: plain)
        return [plain] + once + once.flatMap(decodings)
    }

    /// The ranges of the text where `needle` stands in this view.
    func occurrences(of needle: [UInt8]) -> [Range<Int>] {
        guard !needle.isEmpty, needle.count <= bytes.count else { return [] }
        var found: [Range<Int>] = []
        // Knuth–Morris–Pratt, linear in the text: a long secret (a PEM key) against a long
        // message sharing its prefix took a naive search tens of seconds.
        var failure = [Int](repeating: 0, count: needle.count)
        var k = 0
        for q in 1..<max(1, needle.count) {
            while k > 0, needle[q] != needle[k] { k = failure[k - 1] }
            if needle[q] == needle[k] { k += 1 }
            failure[q] = k
        }
        var matched = 0
        for (at, byte) in bytes.enumerated() {
            while matched > 0, byte != needle[matched] { matched = failure[matched - 1] }
            if byte == needle[matched] { matched += 1 }
            if matched == needle.count {
                found.append(sources[at + 1 - needle.count].lowerBound..<sources[at].upperBound)
                matched = 0
            }
        }
        return found
    }

    /// `text` with each of `ranges` (merged where they overlap or touch) replaced by `mask`.
    static func replacing(_ ranges: [Range<Int>], in text: [UInt8], with mask: [UInt8]) -> [UInt8] {
        var merged: [Range<Int>] = []
        for r in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) {
            if let last = merged.last, r.lowerBound <= last.upperBound {
                merged[merged.count - 1] = last.lowerBound..<max(last.upperBound, r.upperBound)
            } else {
                merged.append(r)
            }
        }
        var out: [UInt8] = []
        var position = 0
        for r in merged {
            out += text[position..<r.lowerBound]
            out += mask
            position = r.upperBound
        }
        out += text[position...]
        return out
    }

    private static func hexValue(_ b: UInt8) -> UInt32? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return UInt32(b - UInt8(ascii: "0"))
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return UInt32(b - UInt8(ascii: "a") + 10)
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return UInt32(b - UInt8(ascii: "A") + 10)
        default: return nil
        }
    }

    private func hex(_ at: Int, digits: Int) -> UInt32? {
        guard at + digits <= bytes.count else { return nil }
        var v: UInt32 = 0
        for k in at..<(at + digits) {
            guard let d = Self.hexValue(bytes[k]) else { return nil }
            v = v << 4 | d
        }
        return v
    }

    private func jsonDecoded() -> SpelledText {
        var out = SpelledText(bytes: [], sources: [])
        var i = 0
        func emit(_ decoded: [UInt8], through last: Int) {
            let source = sources[i].lowerBound..<sources[last].upperBound
            for b in decoded {
                out.bytes.append(b)
                out.sources.append(source)
            }
            i = last + 1
        }
        while i < bytes.count {
            guard bytes[i] == UInt8(ascii: "\\"), i + 1 < bytes.count else {
                emit([bytes[i]], through: i)
                continue
            }
            switch bytes[i + 1] {
            case UInt8(ascii: "u"):
                guard let v = hex(i + 2, digits: 4) else {
                    emit([bytes[i]], through: i)
                    continue
                }
                var scalar = v
                var last = i + 5
                if v >= 0xD800, v <= 0xDBFF, i + 11 < bytes.count, bytes[i + 6] == UInt8(ascii: "\\"),
                    bytes[i + 7] == UInt8(ascii: "u"), let low = hex(i + 8, digits: 4), low >= 0xDC00, low <= 0xDFFF
                {
                    scalar = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00)
                    last = i + 11
                }
                if let u = Unicode.Scalar(scalar) {
                    emit(Array(String(Character(u)).utf8), through: last)
                } else {
                    emit(Array(bytes[i...last]), through: last)
                }
            case UInt8(ascii: "b"): emit([0x08], through: i + 1)
            case UInt8(ascii: "f"): emit([0x0C], through: i + 1)
            case UInt8(ascii: "n"): emit([0x0A], through: i + 1)
            case UInt8(ascii: "r"): emit([0x0D], through: i + 1)
            case UInt8(ascii: "t"): emit([0x09], through: i + 1)
            default: emit([bytes[i + 1]], through: i + 1)
            }
        }
        return out
    }

    private func percentDecoded(plusIsSpace: Bool) -> SpelledText {
        var out = SpelledText(bytes: [], sources: [])
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), let v = hex(i + 1, digits: 2) {
                out.bytes.append(UInt8(v))
                out.sources.append(sources[i].lowerBound..<sources[i + 2].upperBound)
                i += 3
            } else {
                out.bytes.append(plusIsSpace && bytes[i] == UInt8(ascii: "+") ? 0x20 : bytes[i])
                out.sources.append(sources[i])
                i += 1
            }
        }
        return out
    }
}
