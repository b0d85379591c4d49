import Foundation

/// The secrets in plugin configurations: which members hold one, how they print (`***`), and
/// how a string value names a file or a systemd credential to read one from.
///
/// A member holds a secret when its name, in any case and without `_` or `-`, starts with
/// `auth`, is `pass`, `key`, `pwd` or `pin`, or contains `token`, `password`, `passwd`,
/// `passphrase`, `secret`, `writekey`, `apikey`, `privatekey`, `bearer`, `cookie`,
/// `credential`, `signingkey`, `accesskey` or `sessionkey`; every value of a `headers` object
/// (or `extra_headers`…) is one; so is the user-info of any URL (`https://user:pass@host`), and
/// any value read from a file or a credential. whend prints
/// configuration only through `redact`: reload output and its log, `--check-config`, status,
/// and the errors that quote a value.
package enum Secrets {
    /// What a secret prints as.
    package static let mask = "***"

    /// The prefixes of a string value that whend replaces, before any plugin sees its
    /// configuration, by the contents of a systemd credential (`$CREDENTIALS_DIRECTORY/NAME`)
    /// or of a file.
    package static let credentialPrefix = "$credential:"
    package static let filePrefix = "$file:"

    /// How deep a plugin's configuration may nest: the event scanner's limit. The walkers here
    /// recurse once a level, so a deeper configuration is refused before any of them sees it.
    package static let maximumDepth = 512

    /// How deep the arrays and objects of JSON text `json` nest, found without recursion.
    package static func nestingDepth(of json: String) -> Int {
        var depth = 0
        var deepest = 0
        var inString = false
        var escaped = false
        for byte in json.utf8 {
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
                deepest = max(deepest, depth)
            case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
            default: break
            }
        }
        return deepest
    }

    /// Whether a member named `name` holds a secret.
    /// The name is compared in lower case without `_` and `-`: `writeKey`, `write-key` and
    /// `WRITE_KEY` are one name.
    package static func isSecretMember(_ name: String) -> Bool {
        let n = String(name.lowercased().unicodeScalars.filter { $0 != "_" && $0 != "-" })
        if n.hasPrefix("auth") || ["pass", "key", "pwd", "pin"].contains(n) { return true }
        return [
            "token", "password", "passwd", "passphrase", "secret", "writekey", "apikey", "privatekey", "bearer",
            "cookie", "credential", "signingkey", "accesskey", "sessionkey",
        ].contains { n.contains($0) }
    }

    /// Whether a member named `name` holds HTTP headers (`headers`, `extra_headers`…), each
    /// value of which is a secret.
    package static func isHeadersMember(_ name: String) -> Bool { name.lowercased().contains("headers") }

    /// `json` with every secret value, at any depth, replaced by `"***"` and everything else
    /// as written; values in `known` (read from files and credentials) are secrets wherever
    /// they are. Nil when `json` is not JSON: then nothing of it may be shown.
    package static func redact(_ json: String, hiding known: Set<String> = []) -> String? {
        // A secret member's value repeated elsewhere (an endpoint's query) is hidden there too.
        let hidden = known.union(values(in: json))
        var walker = JSONSpanWalker(Array(json.utf8))
        walker.visitsNames = true
        let ok = walker.walk { string, inSecret in
            if inSecret {
                // A reference is not the secret: it says where the secret is.
                return isReference(string) ? nil : mask
            }
            if known.contains(string) { return mask }
            let text = redactUserInfo(string) ?? string
            let scrubbed = scrub(text, hidden)
            return scrubbed == string ? nil : scrubbed
        }
        return ok ? walker.result : nil
    }

    /// How the value of setting `key` prints: a plugin's configuration redacted, the rest as is.
    package static func shown(key: String, value: String, hiding known: Set<String> = []) -> String {
        guard key.hasPrefix("plugin.") else { return value }
        return redact(value, hiding: known) ?? "(not shown: not JSON)"
    }

    /// The secret values in `json` (as `redact` finds them), for `scrub`.
    package static func values(in json: String) -> Set<String> {
        var found: Set<String> = []
        var walker = JSONSpanWalker(Array(json.utf8))
        walker.visitsNames = true
        _ = walker.walk { string, inSecret in
            if inSecret, !isReference(string), !string.isEmpty {
                found.insert(string)
                // A header's credentials without their scheme (`Bearer T`, `Basic B`), as a
                // message may quote them alone.
                if let space = string.firstIndex(of: " ") {
                    found.insert(String(string[string.index(after: space)...]).trimmingCharacters(in: .whitespaces))
                }
            }
            for userInfo in userInfos(in: string) {
                found.insert(userInfo)
                // The password alone, as a message may quote it.
                if let colon = userInfo.firstIndex(of: ":") {
                    found.insert(String(userInfo[userInfo.index(after: colon)...]))
                }
            }
            return nil
        }
        return found
    }

    /// `text` (a message that may quote a configuration, a plugin's own words) with every one of
    /// `secrets` replaced by `***`, however the message spells it (`occurrences`). Values of
    /// fewer than 4 characters are left: they would mangle every word they occur in, and guard
    /// nothing (`redact` still hides them in a configuration).
    package static func scrub(_ text: String, _ secrets: Set<String>) -> String {
        scrub(Array(text.utf8), secrets, keeping: Int.max)
    }

    /// A plugin's log line as whend logs it: at most `logLineLimit` bytes of it, scrubbed. The
    /// decoded views cost some 17 bytes a byte of text each, so a line of megabytes is not read
    /// whole: only the bytes kept and enough after them to hold the longest secret however it
    /// is encoded, so that a secret the cut falls in is hidden, not shown in part.
    package static func scrubbedLogLine(_ message: UnsafePointer<CChar>, _ secrets: Set<String>) -> String {
        let longest = secrets.map(\.utf8.count).max() ?? 0
        let window = logLineLimit + 24 * longest
        let length = strnlen(message, window)
        let bytes = UnsafeRawBufferPointer(start: message, count: length)
        let kept = scrub(Array(bytes), secrets, keeping: logLineLimit)
        return length > logLineLimit ? kept + " … (cut at \(logLineLimit) bytes)" : kept
    }

    /// How much of one plugin log line whend logs (journald itself keeps 48 KiB of a line).
    package static let logLineLimit = 64 * 1024

    /// `text`'s first `limit` bytes with every secret in them hidden, one the cut falls in too.
    package static func scrub(_ text: [UInt8], _ secrets: Set<String>, keeping limit: Int) -> String {
        let needles = secrets.filter { $0.count >= 4 }
        let bytes = text.count > limit ? Array(text[..<limit]) : text
        guard !needles.isEmpty else { return String(decoding: bytes, as: UTF8.self) }
        let views = SpelledText.views(of: text)
        var found: [Range<Int>] = []
        for secret in needles {
            for needle in Set([secret, secret.removingPercentEncoding ?? secret]) where needle.count >= 4 {
                let n = Array(needle.utf8)
                for view in views { found += view.occurrences(of: n) }
            }
        }
        found = found.compactMap { $0.lowerBound < bytes.count ? $0.lowerBound..<min($0.upperBound, bytes.count) : nil }
        guard !found.isEmpty else { return String(decoding: bytes, as: UTF8.self) }
        return String(decoding: SpelledText.replacing(found, in: bytes, with: Array(mask.utf8)), as: UTF8.self)
    }

    /// Whether `secret` stands anywhere in `text`, however spelled (as `scrub` finds it).
    package static func occurs(_ secret: String, in text: String) -> Bool {
        let n = Array(secret.utf8)
        return SpelledText.views(of: Array(text.utf8)).contains { !$0.occurrences(of: n).isEmpty }
    }

    /// `SWIFT_BACKTRACE` for a process that runs plugin code (`setting`: what whend was given):
    /// the stack trace stays, the register dump goes — it prints the bytes each register points
    /// at, and a crash in a plugin holding its configuration prints its secrets.
    package static func backtraceSetting(_ setting: String?) -> String {
        // The runtime reads its settings in order: the last one given wins.
        [setting, "registers=none"].compactMap { $0 }.filter { !$0.isEmpty }.joined(separator: ",")
    }

    static func isReference(_ string: String) -> Bool {
        string.hasPrefix(credentialPrefix) || string.hasPrefix(filePrefix)
    }

    /// Where the user-info (`user:pass` of `scheme://user:pass@host`) of each URL in `string`
    /// is: everything after a scheme's `:` and its slashes (`/` or `\\`, any number) up to the
    /// last `@` before the next URL. A password may hold anything (`/`, `#`, `?`, spaces), so
    /// the host part cannot be found first; a path holding `@` is hidden too, on the safe side.
    static func userInfoRanges(in string: String) -> [Range<String.Index>] {
        var starts: [(scheme: String.Index, authority: String.Index)] = []
        var i = string.startIndex
        while let colon = string[i...].firstIndex(of: ":") {
            var after = string.index(after: colon)
            while after < string.endIndex, string[after] == "/" || string[after] == "\\" {
                after = string.index(after: after)
            }
            var scheme = colon
            while scheme > string.startIndex {
                let before = string[string.index(before: scheme)]
                guard before.isASCII, before.isLetter || before.isNumber || "+.-".contains(before) else { break }
                scheme = string.index(before: scheme)
            }
            // A URL starts the text or follows a separator: `pass:/word` inside a user-info is
            // no URL of its own (it cut the user-info short, and its first part was shown).
            let separated =
                scheme == string.startIndex || " \t\r\n,;|\"'<([{=".contains(string[string.index(before: scheme)])
            if after > string.index(after: colon), scheme < colon, string[scheme].isLetter, separated {
                starts.append((scheme, after))
            }
            i = after > colon ? after : string.index(after: colon)
            if i >= string.endIndex { break }
        }
        var ranges: [Range<String.Index>] = []
        for (n, start) in starts.enumerated() {
            let end = n + 1 < starts.count ? starts[n + 1].scheme : string.endIndex
            guard start.authority < end, let at = string[start.authority..<end].lastIndex(of: "@") else { continue }
            if start.authority < at { ranges.append(start.authority..<at) }
        }
        return ranges
    }

    /// The user-info parts of the URLs in `string` (`userInfoRanges`).
    static func userInfos(in string: String) -> [String] {
        userInfoRanges(in: string).map { String(string[$0]) }
    }

    /// `string` with the user-info of every URL in it replaced by `***`; nil if it has none.
    static func redactUserInfo(_ string: String) -> String? {
        let ranges = userInfoRanges(in: string)
        guard !ranges.isEmpty else { return nil }
        var result = ""
        var copied = string.startIndex
        for range in ranges {
            result += string[copied..<range.lowerBound]
            result += mask
            copied = range.upperBound
        }
        return result + string[copied...]
    }

    /// `string` as a JSON string's insides would spell it, slashes escaped or not.
    package static func jsonEscaped(_ string: String) -> [String] {
        [[.fragmentsAllowed, .withoutEscapingSlashes], [.fragmentsAllowed]].compactMap {
            (options: JSONSerialization.WritingOptions) in
            (try? JSONSerialization.data(withJSONObject: string, options: options))
                .map { String(decoding: $0.dropFirst().dropLast(), as: UTF8.self) }
        }
    }

    static func jsonString(_ string: String) -> [UInt8] {
        let data = try? JSONSerialization.data(
            withJSONObject: string, options: [.fragmentsAllowed, .withoutEscapingSlashes])
        return Array(data ?? Data(#""***""#.utf8))
    }
}

/// Why a reference to a secret could not be read.
package struct SecretReferenceError: Error, CustomStringConvertible, Equatable {
    package var reference: String
    package var reason: String

    package var description: String { "\(reference): \(reason)" }
}

extension Secrets {
    /// `json` with every string value that is a reference replaced by what it names:
    /// `"$credential:NAME"` by the contents of `$CREDENTIALS_DIRECTORY/NAME` (systemd's
    /// `LoadCredential=`), `"$file:/absolute/path"` by the contents of that file; one trailing
    /// line end (LF or CRLF) is dropped. Returns the text and the values read, which are secrets wherever they
    /// are.
    package static func resolveReferences(
        _ json: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(SecretReferenceError) -> (json: String, secrets: Set<String>) {
        guard json.contains(credentialPrefix) || json.contains(filePrefix) else { return (json, []) }
        var walker = JSONSpanWalker(Array(json.utf8))
        var secrets: Set<String> = []
        var failure: SecretReferenceError?
        let ok = walker.walk { string, _ in
            guard failure == nil, isReference(string) else { return nil }
            do throws(SecretReferenceError) {
                let value = try read(string, environment: environment)
                secrets.insert(value)
                return value
            } catch {
                failure = error
                return nil
            }
        }
        if let failure { throw failure }
        guard ok else { return (json, []) }
        return (walker.result, secrets)
    }

    private static func read(_ reference: String, environment: [String: String]) throws(SecretReferenceError)
        -> String
    {
        let path: String
        if reference.hasPrefix(credentialPrefix) {
            let name = String(reference.dropFirst(credentialPrefix.count))
            guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
                throw SecretReferenceError(
                    reference: reference, reason: "a credential's name is a file name, such as $credential:write-key")
            }
            guard let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty else {
                throw SecretReferenceError(
                    reference: reference,
                    reason:
                        "$CREDENTIALS_DIRECTORY is not set: systemd sets it for a unit with LoadCredential=\(name):/path/to/file; elsewhere use $file:/path/to/file"
                )
            }
            path = directory + "/" + name
        } else {
            path = String(reference.dropFirst(filePrefix.count))
            guard path.hasPrefix("/") else {
                throw SecretReferenceError(reference: reference, reason: "the path must be absolute")
            }
        }
        guard var text = String(data: try readSecretFile(path, reference: reference), encoding: .utf8) else {
            throw SecretReferenceError(reference: reference, reason: "\(path) is not UTF-8 text")
        }
        // One line end, LF or CRLF (one Character in Swift: `hasSuffix("\n")` missed it).
        if text.hasSuffix("\n") || text.hasSuffix("\r\n") { text.removeLast() }
        guard !text.isEmpty else { throw SecretReferenceError(reference: reference, reason: "\(path) is empty") }
        return text
    }
}

extension Secrets {
    /// The most a file or credential holding a secret may hold.
    package static let maximumSecretSize = 64 * 1024

    /// The contents of the regular file at `path`, at most `maximumSecretSize` bytes. Opened
    /// without blocking (a FIFO would hold the reload, and the daemon, until a writer came) and
    /// checked after opening (`fstat`, so a symlink is followed to what it names, as systemd's
    /// and container runtimes' secret files are, yet nothing is swapped in between): a device
    /// (`/dev/zero`), a FIFO or a directory is refused, and so is a file larger than the cap.
    private static func readSecretFile(_ path: String, reference: String) throws(SecretReferenceError) -> Data {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else {
            throw SecretReferenceError(
                reference: reference,
                reason: "cannot read \(path): \(String(cString: strerror(errno))); whend's user must be able to read it"
            )
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            throw SecretReferenceError(
                reference: reference,
                reason: "\(path) is not a regular file; put the secret in a file of its own and name that")
        }
        let tooLarge = SecretReferenceError(
            reference: reference,
            reason: "\(path) holds more than \(maximumSecretSize / 1024) KiB; a secret file holds only the secret")
        guard info.st_size <= maximumSecretSize else { throw tooLarge }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else {
                throw SecretReferenceError(
                    reference: reference, reason: "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if n == 0 { return data }
            data.append(contentsOf: buffer[..<n])
            // It may grow after fstat: the cap holds for what is read.
            guard data.count <= maximumSecretSize else { throw tooLarge }
        }
    }
}

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
