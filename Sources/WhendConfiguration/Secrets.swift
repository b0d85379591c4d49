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
        _ = walker.walk { string, inSecret in
            if inSecret, !isReference(string), !string.isEmpty { found.insert(string) }
            found.formUnion(userInfos(in: string))
            return nil
        }
        return found
    }

    /// `text` (a message that may quote a configuration, a plugin's own words) with every one of
    /// `secrets` replaced by `***`, longest first so that one inside another goes too. Values of
    /// fewer than 4 characters are left: they would mangle every word they occur in, and guard
    /// nothing (`redact` still hides them in a configuration).
    package static func scrub(_ text: String, _ secrets: Set<String>) -> String {
        var text = text
        for secret in secrets.sorted(by: { $0.utf8.count > $1.utf8.count }) where secret.count >= 4 {
            text = text.replacingOccurrences(of: secret, with: mask)
            // As a JSON string would spell it, should the message quote JSON; as a URL would
            // (Foundation percent-encodes a URL's parts), and decoded from a URL's spelling.
            for spelling in spellings(of: secret) where spelling != secret && spelling.count >= 4 {
                text = text.replacingOccurrences(of: spelling, with: mask)
            }
        }
        return text
    }

    /// The other ways a message may spell `secret`: JSON-escaped, percent-encoded (as each part
    /// of a URL allows, or every byte but letters and digits), percent-decoded; longest first.
    static func spellings(of secret: String) -> [String] {
        var forms = Set(jsonEscaped(secret))
        let sets: [CharacterSet] = [
            .urlUserAllowed, .urlPasswordAllowed, .urlQueryAllowed, .urlPathAllowed, .urlHostAllowed,
            .urlFragmentAllowed, .alphanumerics,
        ]
        for set in sets {
            guard let encoded = secret.addingPercentEncoding(withAllowedCharacters: set) else { continue }
            forms.insert(encoded)
            // Lower-case hex, as some encoders write it.
            forms.insert(lowercasedPercentEscapes(encoded))
        }
        if let decoded = secret.removingPercentEncoding { forms.insert(decoded) }
        return forms.sorted { $0.utf8.count > $1.utf8.count }
    }

    private static func lowercasedPercentEscapes(_ string: String) -> String {
        var result = ""
        var left = 0
        for ch in string {
            if ch == "%" {
                left = 2
                result.append(ch)
            } else if left > 0 {
                left -= 1
                result += ch.lowercased()
            } else {
                result.append(ch)
            }
        }
        return result
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
            if after > string.index(after: colon), scheme < colon, string[scheme].isLetter {
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
    /// newline is dropped. Returns the text and the values read, which are secrets wherever they
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
        if text.hasSuffix("\n") { text.removeLast() }
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
    /// Called for each string value (not member names) with whether it lies within a secret
    /// member; returns its replacement (a string), or nil to keep it.
    private var visit: (String, Bool) -> String? = { _, _ in nil }

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
            if secret || headers { replace(start..<i, with: Secrets.jsonString(Secrets.mask)) }
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
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\""), let name = string() else { return false }
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
