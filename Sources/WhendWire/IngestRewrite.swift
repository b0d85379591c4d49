/// Builds the record body that goes to the journal when ingest middleware changed an event.
///
/// A plugin may change anything a client may send, but never a trusted field: every member of
/// its output whose key begins with `_` (escaped or not) is left out, and the original record's
/// `_` members are put back after the rest, as whend wrote them.
public enum IngestRewrite {
    /// - Parameters:
    ///   - output: the plugin's record, one JSON object.
    ///   - original: the record as whend encoded it (a JSON object with its trusted fields).
    /// - Returns: the new body: the members without the opening brace, ending with `}` (the form
    ///   the journal writer puts after `{"_seq":N,`).
    /// - Throws: `WireError` when the output is not one JSON object with a string `type`.
    public static func body(output: UnsafeBufferPointer<UInt8>, original: UnsafeBufferPointer<UInt8>)
        throws(WireError) -> [UInt8]
    {
        if let bad = firstInvalidUTF8Offset(output) {
            throw WireError(.invalidUTF8, "the changed record is not UTF-8 at byte \(bad + 1)")
        }
        var body: [UInt8] = []
        body.reserveCapacity(output.count + 128)
        var sawType = false
        var scanner = JSONScanner(output)
        try scanner.scanObject { m throws(WireError) in
            guard !isTrusted(m, in: output) else { return }
            if equal(UnsafeBufferPointer(rebasing: output[m.key]), "type") {
                guard m.kind == .string else {
                    throw WireError(.invalidField, "the changed record's type is not a string")
                }
                sawType = true
            }
            if !body.isEmpty { body.append(UInt8(ascii: ",")) }
            body.append(contentsOf: output[m.quotedKey])
            body.append(UInt8(ascii: ":"))
            body.append(contentsOf: output[m.value])
        }
        scanner.skipWhitespace()
        guard scanner.atEnd else { throw scanner.syntaxError("unexpected data after the changed record") }
        guard sawType else { throw WireError(.missingField, "the changed record has no type") }
        var trusted = JSONScanner(original)
        try trusted.scanObject { m throws(WireError) in
            guard isTrusted(m, in: original) else { return }
            body.append(UInt8(ascii: ","))
            body.append(contentsOf: original[m.quotedKey])
            body.append(UInt8(ascii: ":"))
            body.append(contentsOf: original[m.value])
        }
        body.append(UInt8(ascii: "}"))
        return body
    }

    private static func isTrusted(_ m: JSONScanner.Member, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let key = UnsafeBufferPointer(rebasing: bytes[m.key])
        if m.keyHasEscapes { return decodeJSONString(key).first == UInt8(ascii: "_") }
        return key.first == UInt8(ascii: "_")
    }
}
