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

    /// How the value of setting `key` prints: a plugin's configuration redacted, the rest as is
    /// (and a plugin's configuration that is not set, as a reload that adds one shows its old
    /// value, as nothing: there is nothing in it to hide).
    package static func shown(key: String, value: String, hiding known: Set<String> = []) -> String {
        guard key.hasPrefix("plugin."), !value.isEmpty else { return value }
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
