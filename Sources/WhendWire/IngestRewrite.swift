/// Builds the record body that goes to the journal when ingest middleware changed an event.
///
/// A plugin may change anything a client may send, but never a trusted field: every member of
/// its output whose key begins with `_` (escaped or not) is left out, and the original record's
/// `_` members are put back after the rest, as whend wrote them. Whatever valid JSON the plugin
/// returns is stored in canonical form (`appendCanonicalJSON`): one line, however it was
/// written.
package enum IngestRewrite {
    /// - Parameters:
    ///   - output: the plugin's record, one JSON object.
    ///   - original: the record as whend encoded it (a JSON object with its trusted fields).
    /// - Returns: the new body: the members without the opening brace, ending with `}` (the form
    ///   the journal writer puts after `{"_seq":N,`).
    /// - Throws: `WireError` when the output is not one JSON object with a string `type`.
    package static func body(output: UnsafeBufferPointer<UInt8>, original: UnsafeBufferPointer<UInt8>)
        throws(WireError) -> [UInt8]
    {
        var body = try untrustedMembers(of: output, reserving: 128)
        var trusted = JSONScanner(original)
        try trusted.scanObject { m throws(WireError) in
            guard isTrusted(m, in: original) else { return }
            body.append(UInt8(ascii: ","))
            append(m, of: original, to: &body)
        }
        body.append(UInt8(ascii: "}"))
        return body
    }

    /// The body of a record a plugin derived, appended to `out` (a batch being built: no array of
    /// its own): its members as `body(output:original:)` keeps them, then `trustedMembers`,
    /// whend's own (as whend wrote them: not scanned again). On error `out` is as it was.
    package static func appendDerivedBody(
        output: UnsafeBufferPointer<UInt8>, trustedMembers: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]
    ) throws(WireError) {
        let start = out.count
        do throws(WireError) {
            // No reserveCapacity here: it grows an array to exactly what is asked, and called
            // for each record of a batch it copied the whole batch every time.
            try appendUntrustedMembers(of: output, to: &out)
        } catch {
            out.removeSubrange(start...)
            throw error
        }
        out.append(UInt8(ascii: ","))
        out.append(contentsOf: trustedMembers)
        out.append(UInt8(ascii: "}"))
    }

    /// The output's members but the trusted ones, comma-separated, validated.
    private static func untrustedMembers(of output: UnsafeBufferPointer<UInt8>, reserving extra: Int)
        throws(WireError) -> [UInt8]
    {
        var body: [UInt8] = []
        body.reserveCapacity(output.count + extra)
        try appendUntrustedMembers(of: output, to: &body)
        return body
    }

    /// Appends the output's members but the trusted ones to `body`, comma-separated, validated.
    private static func appendUntrustedMembers(of output: UnsafeBufferPointer<UInt8>, to body: inout [UInt8])
        throws(WireError)
    {
        if let bad = firstInvalidUTF8Offset(output) {
            throw WireError(.invalidUTF8, "the changed record is not UTF-8 at byte \(bad + 1)")
        }
        let start = body.count
        var sawType = false
        var seen: UInt32 = 0  // the well-known keys met, one bit each
        // Members kept and already canonical are copied a run at a time (a plugin's encoder
        // writes them so): `run` is the span not yet copied, commas included.
        var run: Range<Int>?
        func copyRun() {
            guard let r = run else { return }
            if body.count > start { body.append(UInt8(ascii: ",")) }
            body.append(contentsOf: UnsafeBufferPointer(rebasing: output[r]))
            run = nil
        }
        var scanner = JSONScanner(output)
        try scanner.scanObject { m throws(WireError) in
            guard !isTrusted(m, in: output) else { return }
            if let known = knownKey(m, in: output) {
                // A second app, type, session, id…, however its key is spelled, would make
                // readers disagree on which one counts (the first for some, the last for
                // others), and a filter that reads one is escaped by the other. Clients are
                // refused the same (EventScanner).
                let bit: UInt32 = 1 << UInt32(known.rawValue)
                guard seen & bit == 0 else {
                    throw WireError(.invalidField, "the changed record has more than one \(known.name) member")
                }
                seen |= bit
                if known == .type {
                    guard m.kind == .string else {
                        throw WireError(.invalidField, "the changed record's type is not a string")
                    }
                    sawType = true
                }
            }
            if m.canonical, let r = run, m.quotedKey.lowerBound == r.upperBound + 1 {
                run = r.lowerBound..<m.value.upperBound
                return
            }
            copyRun()
            if m.canonical {
                run = m.quotedKey.lowerBound..<m.value.upperBound
            } else {
                // Whitespace (line breaks too: a pretty-printing encoder's) or escapes written
                // otherwise: the stored record is one line, in the form whend stores
                // everything in, whatever the plugin wrote.
                if body.count > start { body.append(UInt8(ascii: ",")) }
                appendCanonicalMember(m, of: output, to: &body)
            }
        }
        copyRun()
        scanner.skipWhitespace()
        guard scanner.atEnd else { throw scanner.syntaxError("unexpected data after the changed record") }
        guard sawType else { throw WireError(.missingField, "the changed record has no type") }
    }

    /// `"key":value`, in one copy when the member is canonical already.
    private static func append(_ m: JSONScanner.Member, of bytes: UnsafeBufferPointer<UInt8>, to body: inout [UInt8]) {
        if m.canonical {
            body.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[m.quotedKey.lowerBound..<m.value.upperBound]))
        } else {
            appendCanonicalMember(m, of: bytes, to: &body)
        }
    }

    /// The member's key if it is one of the well-known ones, spelled plainly or with escapes
    /// (`"typ\u0065"`).
    private static func knownKey(_ m: JSONScanner.Member, in bytes: UnsafeBufferPointer<UInt8>) -> KnownKey? {
        let key = UnsafeBufferPointer(rebasing: bytes[m.key])
        if m.keyHasEscapes { return decodeJSONString(key).withUnsafeBufferPointer { KnownKey.match($0) } }
        return KnownKey.match(key)
    }

    private static func isTrusted(_ m: JSONScanner.Member, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let key = UnsafeBufferPointer(rebasing: bytes[m.key])
        if m.keyHasEscapes { return decodeJSONString(key).first == UInt8(ascii: "_") }
        return key.first == UInt8(ascii: "_")
    }
}
