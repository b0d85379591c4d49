import Foundation

/// Walks a JSON text and rewrites string values in place: everything it does not rewrite stays
/// byte for byte as written (order, spacing, escapes).
struct JSONSpanWalker {
    private let bytes: [UInt8]
    private var i = 0
    private var copied = 0
    private var depth = 0
    private var output: [UInt8] = []
    /// Called for each string value with whether it lies within a secret member; returns its
    /// replacement (a string), or nil to keep it.
    private var visit: (String, Bool) -> String? = { _, _ in nil }
    /// Whether member names are visited too (as not secret): a name may be a URL with its
    /// user-info (`{"https://u:pw@h/": "primary"}`). Not where references are resolved: a
    /// name is never read as one.
    var visitsNames = false

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var result: String { String(decoding: output + bytes[copied...], as: UTF8.self) }

    /// Whether the text was one JSON value (with only whitespace around it).
    mutating func walk(_ visit: @escaping (String, Bool) -> String?) -> Bool {
        self.visit = visit
        i = 0
        copied = 0
        output = []
        skipSpace()
        guard value(secret: false, headers: false) else { return false }
        skipSpace()
        return i == bytes.count
    }

    private mutating func skipSpace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }

    private mutating func replace(_ range: Range<Int>, with replacement: [UInt8]) {
        output += bytes[copied..<range.lowerBound]
        output += replacement
        copied = range.upperBound
    }

    /// A value within a secret member (`secret`), or the value of a `headers` member.
    private mutating func value(secret: Bool, headers: Bool) -> Bool {
        guard i < bytes.count else { return false }
        // Deeper than a configuration may be (`Secrets.maximumDepth`): refused, not recursed into.
        depth += 1
        defer { depth -= 1 }
        guard depth <= Secrets.maximumDepth + 1 else { return false }
        switch bytes[i] {
        case UInt8(ascii: "{"):
            if headers { return object(memberSecret: { _ in true }, secret: secret) }
            return object(memberSecret: { secret || Secrets.isSecretMember($0) }, secret: secret)
        case UInt8(ascii: "["):
            i += 1
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
                i += 1
                return true
            }
            while true {
                skipSpace()
                guard value(secret: secret || headers, headers: false) else { return false }
                skipSpace()
                guard i < bytes.count else { return false }
                if bytes[i] == UInt8(ascii: ",") {
                    i += 1
                    continue
                }
                guard bytes[i] == UInt8(ascii: "]") else { return false }
                i += 1
                return true
            }
        case UInt8(ascii: "\""):
            let start = i
            guard let decoded = string() else { return false }
            if let replacement = visit(decoded, secret || headers) {
                replace(start..<i, with: Secrets.jsonString(replacement))
            }
            return true
        default:
            // A number or a literal: as a secret, it prints as one.
            let start = i
            while i < bytes.count, !",]} \n\r\t".utf8.contains(bytes[i]) { i += 1 }
            let token = bytes[start..<i]
            guard !token.isEmpty,
                (try? JSONSerialization.jsonObject(with: Data(token), options: [.fragmentsAllowed])) != nil
            else { return false }
            if secret || headers {
                // Seen by `values(in:)` too: a plugin may print a numeric secret in a message.
                _ = visit(String(decoding: token, as: UTF8.self), true)
                replace(start..<i, with: Secrets.jsonString(Secrets.mask))
            }
            return true
        }
    }

    private mutating func object(memberSecret: (String) -> Bool, secret: Bool) -> Bool {
        i += 1
        skipSpace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
            i += 1
            return true
        }
        while true {
            skipSpace()
            let nameStart = i
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\""), let name = string() else { return false }
            if visitsNames, let replacement = visit(name, false) {
                replace(nameStart..<i, with: Secrets.jsonString(replacement))
            }
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return false }
            i += 1
            skipSpace()
            let isHeaders = !secret && Secrets.isHeadersMember(name)
            let valueSecret = memberSecret(name)
            guard value(secret: valueSecret, headers: isHeaders && !valueSecret) else { return false }
            skipSpace()
            guard i < bytes.count else { return false }
            if bytes[i] == UInt8(ascii: ",") {
                i += 1
                continue
            }
            guard bytes[i] == UInt8(ascii: "}") else { return false }
            i += 1
            return true
        }
    }

    /// The string at `i` (its opening quote), decoded; `i` moves past its closing quote.
    private mutating func string() -> String? {
        let start = i
        i += 1
        var escaped = false
        while i < bytes.count {
            let b = bytes[i]
            i += 1
            if escaped {
                escaped = false
            } else if b == UInt8(ascii: "\\") {
                escaped = true
            } else if b == UInt8(ascii: "\"") {
                let token = bytes[start..<i]
                if !token.contains(UInt8(ascii: "\\")) {
                    guard token.allSatisfy({ $0 >= 0x20 }) else { return nil }
                    return String(validating: token.dropFirst().dropLast(), as: UTF8.self)
                }
                return (try? JSONSerialization.jsonObject(with: Data(token), options: [.fragmentsAllowed])) as? String
            }
        }
        return nil
    }
}
