import Foundation

/// Keys an object gives more than once, inside a stored value (a `when` event's `params`, an
/// app's own members): whend stores them as the app sent them, and its readers take the first
/// (the plugins' field lookups, the tracking plan's path reads). What leaves whend for a reader
/// it did not write — an analytics destination, an OTLP collector, a crash report read with
/// `jq` — must say the same: most JSON readers take the last of a repeated key, and OTLP allows
/// each key of a list once. So exports carry each key once, the first, at every depth.
///
/// Keys are told apart by what they decode to (`"x"` and `"\u0078"` are one key), as every JSON
/// reader tells them apart; in the canonical form whend stores, that is their bytes. Two keys
/// that differ only as Unicode's normalisation allows ("é" and "e" with a combining accent) are
/// two keys, to whend and to JSON readers.
package struct RepeatedKeys {
    /// The keys of the objects being scanned, each object's after its parent's: reused from
    /// value to value, so that a check allocates nothing once it has grown.
    private var keys: [Range<Int>] = []

    /// Whether a surrogate without its partner (`\ud800`) is read as U+FFFD, as by an export
    /// that writes it so (analytics), or kept apart from it, as by one that keeps the escape.
    private let loneSurrogatesAsReplacement: Bool

    package init(loneSurrogatesAsReplacement: Bool = false) {
        self.loneSurrogatesAsReplacement = loneSurrogatesAsReplacement
    }

    /// Beyond this many keys in one object, keys are compared through a set rather than each
    /// with each: a hostile object of thousands of keys must not cost their square.
    static let linearLimit = 16

    /// Whether an object in `value` (one valid JSON value), at any depth, gives a key twice.
    package mutating func present(in value: UnsafeBufferPointer<UInt8>) -> Bool {
        // The shortest value that repeats a key is `{"":0,"":0}`; most params are shorter.
        guard value.count >= 11 else { return false }
        if let known = quickly(value) { return known }
        keys.removeAll(keepingCapacity: true)
        var scanner = JSONScanner(value)
        guard let (kind, range) = try? scanner.scanValue() else { return false }
        var nothing: [UInt8]? = nil
        return walk(value, kind, range, into: &nothing)
    }

    /// The answer in one pass over the bytes, not validating them (the value is stored, so
    /// valid), for the common case: plain keys, a few to an object, not nested too deep; nil
    /// for anything else. It runs for each `when` an analytics pipeline sends, where the
    /// validating walk cost a twentieth of the plugin's time.
    private mutating func quickly(_ value: UnsafeBufferPointer<UInt8>) -> Bool? {
        guard let p = value.baseAddress else { return false }
        keys.removeAll(keepingCapacity: true)
        // Which open containers are objects (a bit each, the innermost lowest), and where each
        // open object's keys begin in `keys`: both bounded by the depth this handles.
        var objects: UInt64 = 0
        var depth = 0
        var bases = InlineArray<8, Int>(repeating: 0)
        var expectKey = false
        let n = value.count
        var i = 0
        while i < n {
            switch p[i] {
            case UInt8(ascii: "{"):
                guard depth < 8 else { return nil }
                bases[depth] = keys.count
                objects = objects << 1 | 1
                depth += 1
                expectKey = true
            case UInt8(ascii: "["):
                guard depth < 8 else { return nil }
                objects <<= 1
                depth += 1
                expectKey = false
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if objects & 1 == 1 {
                    keys.removeSubrange(bases[depth - 1]...)
                }
                objects >>= 1
                depth -= 1
                expectKey = false
            case UInt8(ascii: ","):
                expectKey = objects & 1 == 1
            case UInt8(ascii: "\""):
                let (quote, escaped) = stringEnd(p, from: i + 1, n)
                if expectKey {
                    guard !escaped, depth > 0 else { return nil }
                    let key = (i + 1)..<quote
                    let base = bases[depth - 1]
                    guard keys.count - base < Self.linearLimit else { return nil }
                    if isGiven(key, in: value, since: base) { return true }
                    keys.append(key)
                    expectKey = false
                }
                i = quote
            default:
                break
            }
            i += 1
        }
        return false
    }

    /// Calls `body` with `value` as an export writes it: itself when no key in it repeats (the
    /// common case, with no copy), else with each key's first member only.
    package mutating func withFirstOfEach<R>(
        _ value: UnsafeBufferPointer<UInt8>, _ body: (UnsafeBufferPointer<UInt8>) -> R
    ) -> R {
        guard present(in: value) else { return body(value) }
        var firsts: [UInt8] = []
        appendFirstOfEach(value, to: &firsts)
        return firsts.withUnsafeBufferPointer(body)
    }

    /// `value` with each object's members but the first of each key left out, at every depth;
    /// everything else as it is.
    package mutating func appendFirstOfEach(_ value: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        keys.removeAll(keepingCapacity: true)
        var scanner = JSONScanner(value)
        guard let (kind, range) = try? scanner.scanValue() else {
            out.append(contentsOf: value)
            return
        }
        var result: [UInt8]? = []
        _ = walk(value, kind, range, into: &result)
        out.append(contentsOf: result ?? [])
    }

    /// Crosses the value at `range`; with `out`, writes it with repeated keys left out. Returns
    /// whether a key was repeated.
    private mutating func walk(
        _ bytes: UnsafeBufferPointer<UInt8>, _ kind: JSONKind, _ range: Range<Int>, into out: inout [UInt8]?
    ) -> Bool {
        let slice = UnsafeBufferPointer(rebasing: bytes[range])
        switch kind {
        case .object:
            let base = keys.count
            defer { keys.removeSubrange(base...) }
            var large: Set<[UInt8]>?
            var repeated = false
            var first = true
            out?.append(UInt8(ascii: "{"))
            var scanner = JSONScanner(slice)
            try? scanner.scanObject(depth: 0) { m in
                let key = (m.key.lowerBound + range.lowerBound)..<(m.key.upperBound + range.lowerBound)
                if isRepeated(key, in: bytes, escaped: m.keyHasEscapes, since: base, large: &large) {
                    repeated = true
                    return
                }
                if out != nil {
                    if !first { out!.append(UInt8(ascii: ",")) }
                    out!.append(contentsOf: UnsafeBufferPointer(rebasing: slice[m.quotedKey]))
                    out!.append(UInt8(ascii: ":"))
                }
                first = false
                let value = (m.value.lowerBound + range.lowerBound)..<(m.value.upperBound + range.lowerBound)
                if walk(bytes, m.kind, value, into: &out) { repeated = true }
            }
            out?.append(UInt8(ascii: "}"))
            return repeated
        case .array:
            var repeated = false
            var first = true
            out?.append(UInt8(ascii: "["))
            var scanner = JSONScanner(slice)
            try? scanner.scanArray(depth: 0) { kind, element in
                if out != nil, !first { out!.append(UInt8(ascii: ",")) }
                first = false
                let value = (element.lowerBound + range.lowerBound)..<(element.upperBound + range.lowerBound)
                if walk(bytes, kind, value, into: &out) { repeated = true }
            }
            out?.append(UInt8(ascii: "]"))
            return repeated
        default:
            out?.append(contentsOf: slice)
            return false
        }
    }

    /// Whether `key` (raw contents) was given before in the object whose keys begin at `base`;
    /// if not, it is noted as given.
    private mutating func isRepeated(
        _ key: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>, escaped: Bool, since base: Int,
        large: inout Set<[UInt8]>?
    ) -> Bool {
        // A key with escapes is compared by what it decodes to; in canonical form, an escape
        // is only ever written one way, and such keys are rare.
        if escaped || large != nil || keys.count - base >= Self.linearLimit {
            if large == nil {
                large = Set(keys[base...].map { identity(bytes, $0) })
            }
            let inserted = large!.insert(identity(bytes, key)).inserted
            keys.append(key)
            return !inserted
        }
        if isGiven(key, in: bytes, since: base) { return true }
        keys.append(key)
        return false
    }

    /// Whether the plain key `key` is, byte for byte, one of the keys noted from `base` on.
    private func isGiven(_ key: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>, since base: Int) -> Bool {
        let raw = UnsafeBufferPointer(rebasing: bytes[key])
        return keys[base...].contains { JSONBytes.equal(raw, UnsafeBufferPointer(rebasing: bytes[$0])) }
    }

    /// What a key decodes to (a surrogate without its partner as `loneSurrogatesAsReplacement`
    /// says).
    private func identity(_ bytes: UnsafeBufferPointer<UInt8>, _ key: Range<Int>) -> [UInt8] {
        let raw = UnsafeBufferPointer(rebasing: bytes[key])
        guard let base = raw.baseAddress, memchr(base, 0x5C, raw.count) != nil else { return Array(raw) }
        return decodeJSONString(raw, keepingLoneSurrogates: !loneSurrogatesAsReplacement)
    }
}
