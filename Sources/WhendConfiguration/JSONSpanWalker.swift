import WhendWire

/// Walks a JSON text and rewrites string values in place: everything it does not rewrite stays
/// byte for byte as written (order, spacing, escapes). The text is tokenized by `JSONScanner`,
/// the one JSON scanner of whend (strings, numbers, literals, whitespace, the depth limit); the
/// walker follows its objects and arrays, decides which values lie within a secret member, and
/// splices the rewrites into the text.
struct JSONSpanWalker {
    private let bytes: [UInt8]
    /// The rewrites, in the order of the text: each range of `bytes` and what replaces it.
    private var edits: [(range: Range<Int>, replacement: [UInt8])] = []
    /// Called for each string value with whether it lies within a secret member; returns its
    /// replacement (a string), or nil to keep it.
    private var visit: (String, Bool) -> String? = { _, _ in nil }
    /// Whether member names are visited too (as not secret): a name may be a URL with its
    /// user-info (`{"https://u:pw@h/": "primary"}`). Not where references are resolved: a
    /// name is never read as one.
    var visitsNames = false

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var result: String {
        var output: [UInt8] = []
        output.reserveCapacity(bytes.count)
        var copied = 0
        for edit in edits {
            output += bytes[copied..<edit.range.lowerBound]
            output += edit.replacement
            copied = edit.range.upperBound
        }
        return String(decoding: output + bytes[copied...], as: UTF8.self)
    }

    /// Whether the text was one JSON value (with only whitespace around it). Values nested
    /// deeper than `JSONScanner.maxDepth` (`Secrets.maximumDepth`) are refused, not recursed
    /// into. Strings are visited in the order of the text as the scan reaches them: on text
    /// that is not JSON, those before the fault are.
    mutating func walk(_ visit: @escaping (String, Bool) -> String?) -> Bool {
        self.visit = visit
        edits = []
        let bytes = self.bytes
        return bytes.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer)
            do throws(WireError) {
                try value(&scanner, depth: 0, secret: false, headers: false)
            } catch {
                return false
            }
            scanner.skipWhitespace()
            return scanner.atEnd
        }
    }

    /// Walks the value at the scanner's position (after whitespace), `depth` levels in as
    /// `JSONScanner.scanValue` counts them, within a secret member (`secret`) or as the value
    /// of a `headers` member, and leaves the position after it.
    private mutating func value(_ scanner: inout JSONScanner, depth: Int, secret: Bool, headers: Bool)
        throws(WireError)
    {
        scanner.skipWhitespace()
        let open = scanner.peek()
        guard open == UInt8(ascii: "{") || open == UInt8(ascii: "[") else {
            return try scalar(&scanner, depth: depth, secret: secret || headers)
        }
        // As `JSONScanner` refuses it, before recursing.
        guard depth < JSONScanner.maxDepth else {
            throw WireError(.invalidJSON, "values nest deeper than \(JSONScanner.maxDepth) levels")
        }
        let close = open == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
        scanner.position += 1
        scanner.skipWhitespace()
        if scanner.peek() == close {
            scanner.position += 1
            return
        }
        while true {
            if open == UInt8(ascii: "{") {
                try member(&scanner, depth: depth + 1, secret: secret, headers: headers)
            } else {
                try value(&scanner, depth: depth + 1, secret: secret || headers, headers: false)
            }
            scanner.skipWhitespace()
            guard scanner.peek() == UInt8(ascii: ",") else { break }
            scanner.position += 1
        }
        try scanner.expect(close, "',' or '\(Character(Unicode.Scalar(close)))'")
    }

    /// One member of an object within a secret member (`secret`) or the value of a `headers`
    /// member (each of whose values is a secret), `depth` levels in.
    private mutating func member(_ scanner: inout JSONScanner, depth: Int, secret: Bool, headers: Bool)
        throws(WireError)
    {
        scanner.skipWhitespace()
        let start = scanner.position
        let (key, escaped) = try scanner.scanString()
        let name = try string(in: scanner.bytes, key, escaped: escaped)
        if visitsNames, let replacement = visit(name, false) {
            edits.append((start..<scanner.position, Secrets.jsonString(replacement)))
        }
        try scanner.expect(UInt8(ascii: ":"), "':' after a key")
        let valueSecret = headers || secret || Secrets.isSecretMember(name)
        let isHeaders = !secret && Secrets.isHeadersMember(name)
        try value(&scanner, depth: depth, secret: valueSecret, headers: isHeaders && !valueSecret)
    }

    /// A string, a number or a literal, within a secret member or not.
    private mutating func scalar(_ scanner: inout JSONScanner, depth: Int, secret: Bool) throws(WireError) {
        let (kind, range) = try scanner.scanValue(depth: depth)
        let buffer = scanner.bytes
        if kind == .string {
            let raw = range.lowerBound + 1..<range.upperBound - 1
            let decoded = try string(in: buffer, raw, escaped: scanner.lastValueHadEscapes)
            if let replacement = visit(decoded, secret) {
                edits.append((range, Secrets.jsonString(replacement)))
            }
            return
        }
        // Beyond a Double, a number is refused, as `Settings` (Foundation's JSON reader) refuses
        // it; and one that runs on (`7825n59`) is refused before any of it is visited.
        let token = String(decoding: buffer[range], as: UTF8.self)
        guard kind != .number || Double(token)?.isFinite == true else {
            throw WireError(.invalidJSON, "a number beyond a Double")
        }
        if let next = scanner.peek(), !" \t\n\r,]}".utf8.contains(next) {
            throw scanner.syntaxError("expected ',' or the end of a container")
        }
        if secret {
            // As a secret, it prints as one. Seen by `values(in:)` too: a plugin may print a
            // numeric secret in a message.
            _ = visit(token, true)
            edits.append((range, Secrets.jsonString(Secrets.mask)))
        }
    }

    /// The string whose raw contents (as `JSONScanner.scanString` delimits them) are `raw`,
    /// decoded (`decodedJSONString`).
    private func string(in buffer: UnsafeBufferPointer<UInt8>, _ raw: Range<Int>, escaped: Bool) throws(WireError)
        -> String
    {
        guard let decoded = decodedJSONString(UnsafeBufferPointer(rebasing: buffer[raw]), hasEscapes: escaped) else {
            throw WireError(.invalidJSON, "a string that is not UTF-8 or holds a lone surrogate")
        }
        return decoded
    }
}
