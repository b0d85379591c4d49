import Glibc

/// A `pattern`, compiled once with the C library's POSIX extended regular expressions
/// (`regcomp` with `REG_EXTENDED | REG_NOSUB`), and searched for anywhere in a string's UTF-8
/// bytes as JSON Schema searches (unanchored: write `^…$` for the whole string).
///
/// JSON Schema names ECMA-262 regular expressions; whend reads the part of them POSIX ERE
/// reads the same — literals, `.`, bracket expressions, `^`, `$`, `|`, groups, `*`, `+`, `?`,
/// `{m,n}` — and refuses the escapes and groups ERE would read otherwise (`\d`, `\w`, `\s`,
/// `\b` and their capitals, `(?…)` lookarounds), so that a plan never means one thing to its
/// author and another to whend. Matching is by bytes in the C locale: `.` and a bracket
/// expression take one byte, so a pattern over non-ASCII text should spell its characters out.
final class Pattern: @unchecked Sendable {
    // glibc's regexec locks the compiled expression itself: one shared by every connection's
    // thread is safe.
    private let regex: UnsafeMutablePointer<regex_t>
    let source: String

    init(_ source: String) throws(PatternError) {
        if let unsupported = Self.unsupported(in: source) { throw PatternError(reason: unsupported) }
        let compiled = UnsafeMutablePointer<regex_t>.allocate(capacity: 1)
        compiled.initialize(to: regex_t())
        let status = regcomp(compiled, source, REG_EXTENDED | REG_NOSUB)
        guard status == 0 else {
            var message = [CChar](repeating: 0, count: 256)
            regerror(status, compiled, &message, message.count)
            compiled.deallocate()
            let reason = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw PatternError(reason: "not a POSIX extended regular expression: \(reason)")
        }
        self.regex = compiled
        self.source = source
    }

    deinit {
        regfree(regex)
        regex.deallocate()
    }

    /// Whether the pattern occurs in `bytes`, which need not end in a NUL (`REG_STARTEND`).
    func matches(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        // On the stack: the search allocates nothing of ours (regexec allocates, and frees, its
        // own matching state).
        var match = regmatch_t(rm_so: 0, rm_eo: regoff_t(bytes.count))
        guard let base = bytes.baseAddress else { return regexec(regex, "", 1, &match, 0) == 0 }
        return base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
            regexec(regex, $0, 1, &match, REG_STARTEND) == 0
        }
    }

    /// What ERE would read otherwise than ECMA-262, if the pattern holds any.
    static func unsupported(in source: String) -> String? {
        let bytes = Array(source.utf8)
        var i = 0
        var inBracket = false
        while i < bytes.count {
            let b = bytes[i]
            if b == UInt8(ascii: "\\"), i + 1 < bytes.count {
                let next = bytes[i + 1]
                if !inBracket, "dDwWsSbBuxcpPkfnrtv0123456789".utf8.contains(next) {
                    return
                        "the escape \\\(Character(Unicode.Scalar(next))) is ECMA-262's, which POSIX extended expressions read otherwise; spell it out (\\d as [0-9], \\s as [ \\t])"
                }
                if inBracket {
                    return
                        "a backslash inside [...] means itself to POSIX and an escape to ECMA-262; move it out of the brackets"
                }
                i += 2
                continue
            }
            if b == UInt8(ascii: "[") && !inBracket {
                inBracket = true
                // A ']' right after '[' or '[^' is a member, in both dialects.
                if i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "^") { i += 1 }
                if i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "]") {
                    return "[] and [^] are ECMA-262 classes POSIX reads otherwise; put ']' elsewhere"
                }
            } else if b == UInt8(ascii: "]") && inBracket {
                inBracket = false
            } else if b == UInt8(ascii: "(") && !inBracket && i + 1 < bytes.count && bytes[i + 1] == UInt8(ascii: "?") {
                return "(?…) groups (lookarounds, named or non-capturing groups) are ECMA-262's only"
            } else if b == UInt8(ascii: "[") && inBracket && i + 1 < bytes.count
                && ":.=".utf8.contains(bytes[i + 1])
            {
                return "[: :], [. .] and [= =] inside brackets are POSIX's only"
            }
            i += 1
        }
        return nil
    }
}

struct PatternError: Error {
    var reason: String
}
