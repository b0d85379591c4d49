import Foundation
import PropertyBased
import SeededRandom
import Testing
import WhendConfiguration

/// Secrets in plugin configurations: what prints as `***`, and secrets read from files and
/// systemd credentials.
@Suite struct SecretRedactionTests {
    @Test func secretMembersHeadersAndUserInfoPrintAsStars() throws {
        let json = #"""
            {"endpoint": "https://alice:s3cr%40t@example.com:8443/v1?x=1", "write_key": "wk1",
             "nested": {"deeper": [{"Token": 987654, "api_token": {"a": ["t1", "t2"]}}]},
             "headers": {"Authorization": "Bearer b1", "X-Trace": "x1"}, "AUTHORIZATION": true,
             "password": null, "client_secret": "cs1", "servers": ["nats://u:p1@h1:4222", "nats://h2"],
             "name": "plain", "n": 3}
            """#
        let redacted = try #require(Secrets.redact(json))
        for secret in ["alice", "s3cr%40t", "wk1", "987654", "t1", "t2", "b1", "x1", "true", "null", "cs1", "u:p1"] {
            #expect(!redacted.contains(secret), "\(secret) in \(redacted)")
        }
        // Everything else as written: order, spacing, the URLs' hosts.
        #expect(redacted.contains(#""endpoint": "https://***@example.com:8443/v1?x=1""#))
        #expect(redacted.contains(#""servers": ["nats://***@h1:4222", "nats://h2"]"#))
        #expect(redacted.contains(#""name": "plain", "n": 3}"#))
        #expect(redacted.contains(#""headers": {"Authorization": "***", "X-Trace": "***"}"#))
        #expect(redacted.contains(#""Token": "***""#))
        // Still JSON.
        #expect((try? JSONSerialization.jsonObject(with: Data(redacted.utf8))) != nil)
    }

    /// A reference says where a secret is; it is not one, and shows.
    @Test func referencesShowAndKnownValuesHideAnywhere() throws {
        let json = #"{"write_key": "$credential:wk", "token": "$file:/etc/t", "url": "v-from-a-file"}"#
        #expect(Secrets.redact(json) == json)
        #expect(
            Secrets.redact(json, hiding: ["v-from-a-file"])
                == #"{"write_key": "$credential:wk", "token": "$file:/etc/t", "url": "***"}"#)
    }

    /// What is not JSON is not shown at all: its secrets cannot be told from the rest.
    @Test func notJSONIsNotShown() {
        #expect(Secrets.redact(#"{"password": "p1",}"#) == nil)
        #expect(Secrets.shown(key: "plugin.x", value: #"{"password": "p1""#) == "(not shown: not JSON)")
        #expect(Secrets.shown(key: "durability", value: "fsync") == "fsync")
    }

    /// A reload that adds a plugin's configuration shows the old value as what it was: nothing
    /// (it printed `(not shown: not JSON) → {…}`).
    @Test func aPluginConfigurationNotSetBeforeShowsAsNothing() {
        #expect(Secrets.shown(key: "plugin.x", value: "") == "")
        #expect(Secrets.shown(key: "plugin.x", value: " ") == "(not shown: not JSON)")
    }

    @Test func scrubHidesSecretsInFreeText() {
        let message = #"analytics: endpoint must be http(s), not ftp://u:pw1@h; config {"k":"a\/bc"}"#
        #expect(
            Secrets.scrub(message, Secrets.values(in: #"{"endpoint": "ftp://u:pw1@h", "token": "a/bc"}"#))
                == #"analytics: endpoint must be http(s), not ftp://***@h; config {"k":"***"}"#)
        // Too short to scrub from free text without mangling it (a configuration still hides it).
        #expect(Secrets.scrub("backoff", ["k"]) == "backoff")
    }

    /// Secret member names however spelled (case, `_`, `-`), and a secret repeated elsewhere.
    @Test func secretNamesAreNormalisedAndRepeatedValuesHidden() throws {
        for name in [
            "writeKey", "write-key", "WRITE_KEY", "api-key", "X-Api-Key", "privateKey", "bearer", "cookie",
            "credentials", "pass", "key", "Key",
        ] {
            let redacted = try #require(Secrets.redact(#"{"\#(name)": "v4lue-\#(name)", "n": "plain"}"#))
            #expect(!redacted.contains("v4lue"), "\(name): \(redacted)")
            #expect(redacted.contains("plain"))
        }
        // Names that only hold a short word: not secrets.
        #expect(Secrets.redact(#"{"keys": "k1k1", "monkey": "m1m1"}"#)?.contains("k1k1") == true)
        let repeated = #"{"write_key": "wk-repeat-1", "endpoint": "https://h/v1?api_key=wk-repeat-1&x=1"}"#
        let shown = try #require(Secrets.redact(repeated))
        #expect(!shown.contains("wk-repeat-1") && shown.contains("https://h/v1?api_key=***&x=1"), "\(shown)")
        #expect(!Secrets.shown(key: "plugin.analytics", value: repeated).contains("wk-repeat-1"))
    }

    /// User-info holding what ends an authority elsewhere (`/`, `#`, `?`, spaces), after odd
    /// slashes; and its percent-encoded spelling (as Foundation prints a URL) in free text.
    @Test func userInfoOfAnySpellingIsHidden() throws {
        for url in [
            "http://u:pw 1/2#3?4@h/v1", "http:\\\\u:pw-bs-1@h/v1", "http:/u:pw-one-1@h", "https:///u:pw-3@h",
            "nats://u:pw-a1@h1, nats://u:pw-b2@h2",
        ] {
            let json =
                #"{"endpoint": \#(String(decoding: try JSONSerialization.data(withJSONObject: url, options: [.fragmentsAllowed]), as: UTF8.self))}"#
            let redacted = try #require(Secrets.redact(json))
            #expect(!redacted.contains("pw"), "\(url): \(redacted)")
            for secret in Secrets.values(in: json) {
                #expect(!Secrets.scrub("GET \(url) failed", [secret]).contains(secret), "\(url)")
            }
            #expect(!Secrets.scrub("GET \(url) failed", Secrets.values(in: json)).contains("pw"), "\(url)")
        }
        let json = #"{"endpoint": "http://user:päss{}| x@example.com/v1"}"#
        let secrets = Secrets.values(in: json)
        let printed = try #require(URL(string: "http://user:p%C3%A4ss%7B%7D%7C%20x@example.com/v1"))
        for text in [printed.absoluteString, "user:p%c3%a4ss%7b%7d%7c%20x", "user:päss{}| x"] {
            let scrubbed = Secrets.scrub("POST \(text): 503", secrets)
            #expect(!scrubbed.contains("ss") && scrubbed.contains("***"), "\(scrubbed)")
        }
        // A secret read from a file, printed percent-encoded in a URL.
        #expect(Secrets.scrub("GET http://h/?k=a%2Fb%2Bc%3D", ["a/b+c="]) == "GET http://h/?k=***")
    }

    /// Found from outside: a `$file:` write key repeated in an endpoint's query as
    /// `encodeURIComponent` writes it (`-` as is, `/`, `+` and `=` escaped) was printed whole by
    /// `--check-config`, reload and status; and a plugin that logged its configuration as
    /// written, with `\u` escapes, had its secrets in whend's log.
    @Test func secretsSpelledAsEncodersWriteThemAreHidden() throws {
        let key = "wk-live/AB+cd=="
        for text in [
            "http://127.0.0.1:18081/v1/batch?key=wk-live%2FAB%2Bcd%3D%3D",
            "http://h/?key=wk-live%2fAB%2bcd%3d%3d", "key=wk%2Dlive%2FAB%2Bcd%3D%3D",
        ] {
            #expect(Secrets.scrub(text, [key]).hasSuffix("=***"), "\(Secrets.scrub(text, [key]))")
        }
        let json = #"{"endpoint": "http://h/v1/batch?key=wk-live%2FAB%2Bcd%3D%3D", "write_key": "$file:/k"}"#
        let redacted = try #require(Secrets.redact(json, hiding: [key]))
        #expect(!redacted.contains("wk-live"), "\(redacted)")
        let logged = #"config: {"write_key": "\u006b3y-escaped", "token": "s\u00e9cret\/x"}"#
        #expect(
            Secrets.scrub(logged, ["k3y-escaped", "sécret/x"]) == #"config: {"write_key": "***", "token": "***"}"#,
            "\(Secrets.scrub(logged, ["k3y-escaped", "sécret/x"]))")
    }

    /// Found in the second outside attack: JSON inside a URL's query (`%5C%2F`), a URL inside
    /// a URL (`%252F`), a numeric secret, a URL's password or a header's token quoted alone,
    /// and a password holding `:/`, which was taken for the start of another URL.
    @Test func secretsQuotedInPartsOrEncodedTwiceAreHidden() throws {
        let token = "Tr0ub4dor/x9+Q"
        for text in ["Tr0ub4dor%5C%2Fx9%2BQ", "Tr0ub4dor%5Cu002fx9%2BQ", "Tr0ub4dor%252Fx9%252BQ"] {
            #expect(Secrets.scrub("got \(text) back", [token]) == "got *** back", "\(text)")
        }
        let json = #"""
            {"pin": 98765432101, "endpoint": "https://alice:Sw0rdfish-Long@h/",
             "headers": {"Authorization": "Bearer HdrT0kenValue"}}
            """#
        let secrets = Secrets.values(in: json)
        for quoted in ["98765432101", "Sw0rdfish-Long", "HdrT0kenValue"] {
            #expect(Secrets.scrub("plugin says \(quoted)", secrets) == "plugin says ***", "\(quoted)")
        }
        let redacted = try #require(Secrets.redact(#"{"endpoint":"http://bob:Hunter2:/Secr3t@127.0.0.1:9/v1/batch"}"#))
        #expect(redacted == #"{"endpoint":"http://***@127.0.0.1:9/v1/batch"}"#, "\(redacted)")
        // A URL as a member name.
        let named = try #require(Secrets.redact(#"{"routes":{"https://carol:KeyPassw0rd@h.example/":"primary"}}"#))
        #expect(named == #"{"routes":{"https://***@h.example/":"primary"}}"#, "\(named)")
        // Two URLs are still two.
        #expect(
            Secrets.redact(#"{"servers":"nats://u:p1@h1, nats://v:p2@h2"}"#)
                == #"{"servers":"nats://***@h1, nats://***@h2"}"#)
    }

    /// A plugin's log line is cut at `Secrets.logLineLimit` bytes, and read no further than
    /// the longest secret needs: a secret the cut falls in is hidden whole, no prefix of it
    /// shown; one past the cut is gone with the rest.
    @Test func aLongLogLineIsCutAndASecretAtTheCutIsHidden() {
        let secret = "S3cret-token-value"
        let limit = Secrets.logLineLimit
        for spelled in [secret, "S3cret%2Dtoken%2Dvalue", #"S3cret-tok\u0065n-value"#] {
            let line = String(repeating: "a", count: limit - 5) + spelled + String(repeating: "b", count: 3 * limit)
            let logged = line.withCString { Secrets.scrubbedLogLine($0, [secret]) }
            #expect(logged == String(repeating: "a", count: limit - 5) + "*** … (cut at \(limit) bytes)", "\(spelled)")
        }
        #expect("short S3cret-token-value".withCString { Secrets.scrubbedLogLine($0, [secret]) } == "short ***")
    }

    /// For any secret and any way an encoder may spell it — each character as is or escaped,
    /// JSON's `\u` of either case (surrogate pairs for astral ones) or its short escapes,
    /// percent-encoding of any bytes with hex of either case, or JSON around a percent-encoded
    /// URL — a message that quotes it shows `***` and none of it.
    @Test func noSpellingOfASecretSurvivesScrubbing() async {
        await propertyCheck(count: 3000, input: Gen<UInt64>.value(in: 0...UInt64.max)) { seed in
            var random = SplitMix64(state: seed)
            let alphabet = Array("aZ9-._~/+=?&%@: \"\\é😀\u{2028}")
            let secret = "S" + String((0..<(3 + random.int(10))).map { _ in alphabet[random.int(alphabet.count)] })
            func hex(_ v: UInt32, _ digits: Int) -> String {
                let h = String(v, radix: 16)
                let padded = String(repeating: "0", count: max(0, digits - h.count)) + h
                return random.int(2) == 0 ? padded : padded.uppercased()
            }
            func percent(_ text: String) -> String {
                text.utf8.map { b in
                    let c = Character(Unicode.Scalar(b))
                    let unreserved = b < 0x80 && (c.isLetter || c.isNumber || "-._~".contains(c))
                    return unreserved && random.int(3) > 0 ? String(c) : "%" + hex(UInt32(b), 2)
                }.joined()
            }
            func json(_ text: String) -> String {
                text.unicodeScalars.map { u in
                    let must = u == "\"" || u == "\\" || u.value < 0x20
                    if !must && random.int(3) > 0 { return String(u) }
                    if u == "/" && random.int(2) == 0 { return "\\/" }
                    if u.value >= 0x10000 {
                        let v = u.value - 0x10000
                        return "\\u" + hex(0xD800 + (v >> 10), 4) + "\\u" + hex(0xDC00 + (v & 0x3FF), 4)
                    }
                    return "\\u" + hex(u.value, 4)
                }.joined()
            }
            let spelled: String
            switch random.int(5) {
            case 0: spelled = percent(secret)
            case 1: spelled = json(secret)
            case 2: spelled = json("http://h/?k=" + percent(secret))
            case 3: spelled = "http://h/?q=" + percent(#"{"k":""# + json(secret) + #""}"#)
            default: spelled = "http://h/?next=" + percent("http://i/?k=" + percent(secret))
            }
            let scrubbed = Secrets.scrub("POST \(spelled) failed", [secret])
            #expect(scrubbed.contains("***") && !scrubbed.contains(secret), "seed \(seed): \(spelled) → \(scrubbed)")
        }
    }

    /// For any configuration with secrets at any depth (members of any secret name, headers,
    /// URLs with user-info; values with escapes and any Unicode), no secret's bytes are in the
    /// redacted text, as written or as JSON escapes them, and the rest parses to the same values.
    /// A failure names its seed: `.fixedSeed(…)` on the test repeats it.
    @Test func noSecretSurvivesRedactionAtAnyDepth() async {
        await propertyCheck(count: 400, input: Gen<UInt64>.value(in: 0...UInt64.max)) { seed in
            var generator = ConfigurationGenerator(seed: seed)
            let (text, expected) = generator.configuration()
            guard let redacted = Secrets.redact(text) else {
                Issue.record("not redacted (seed \(seed)): \(text)")
                return
            }
            for secret in generator.secrets {
                let escaped = Secrets.jsonEscaped(secret)
                #expect(
                    !redacted.contains(secret) && !escaped.contains(where: redacted.contains),
                    "seed \(seed): \(secret) in \(redacted)")
            }
            // The rest as it was: the same values once parsed, secrets as "***".
            func canonical(_ value: Any?) -> String? {
                value.flatMap { try? JSONSerialization.data(withJSONObject: $0, options: [.sortedKeys]) }
                    .map { String(decoding: $0, as: UTF8.self) }
            }
            let parsed = try? JSONSerialization.jsonObject(with: Data(redacted.utf8))
            #expect(canonical(parsed) != nil && canonical(parsed) == canonical(expected), "seed \(seed): \(redacted)")
        }
    }
}

/// Random plugin configurations with secrets at any depth, written with random spacing and
/// escapes; `secrets` collects every secret value written, and the expected value has `***` in
/// their place.
struct ConfigurationGenerator {
    /// The seed decides everything.
    private var random: SplitMix64
    private(set) var secrets: [String] = []

    init(seed: UInt64) { random = SplitMix64(state: seed) }

    private mutating func int(_ n: Int) -> Int { random.int(n) }
    private mutating func pick<T>(_ items: [T]) -> T { items[int(items.count)] }

    private mutating func space() -> String { pick(["", "", " ", "\n\t", "  "]) }

    private static let secretNames = [
        "write_key", "token", "password", "secret", "auth", "Authorization", "authToken", "API_KEY", "apiKey",
        "client_secret", "x_Password", "refresh_token", "passphrase", "private_key",
    ]
    private static let plainNames = ["name", "endpoint", "n", "fields", "tls", "ca", "flush_interval", "é", "k\"q"]

    /// A unique secret: any Unicode, quotes and backslashes included.
    private mutating func secret() -> String {
        let alphabet: [String] = ["a", "Z", "9", "\"", "\\", "/", "é", "😀", "\u{7}", " ", "@", ":", "\u{2028}"]
        var s = "S\(secrets.count)x"
        for _ in 0..<(4 + int(8)) { s += pick(alphabet) }
        secrets.append(s)
        return s
    }

    /// A string for a URL's user-info: RFC 3986 allows unreserved characters, sub-delims, ':'
    /// and percent-escapes there.
    private mutating func userInfo() -> String {
        let alphabet = Array("abcXYZ019-._~!$&'()*+,;=:%")
        var s = "U\(secrets.count)u"
        for _ in 0..<(4 + int(8)) { s.append(pick(alphabet)) }
        secrets.append(s)
        return s
    }

    /// JSON text for `s`, escaping some characters that need not be.
    private mutating func encode(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default:
                if scalar.value < 0x20 || int(6) == 0 {
                    if scalar.value > 0xFFFF {
                        for unit in String(scalar).utf16 { out += String(format: "\\u%04x", unit) }
                    } else {
                        out += String(format: "\\u%04X", scalar.value)
                    }
                } else if scalar == "/" && int(2) == 0 {
                    out += "\\/"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }

    /// A value in secret position: everything in it is secret.
    private mutating func secretValue(depth: Int) -> (String, Any) {
        switch depth > 2 ? int(2) : int(5) {
        case 0: return (encode(secret()), "***")
        case 1:
            let n = 100_000 + int(900_000)
            secrets.append(String(n))
            return (String(n), "***")
        case 2:
            var texts: [String] = []
            var values: [Any] = []
            for _ in 0..<(1 + int(3)) {
                let (t, v) = secretValue(depth: depth + 1)
                texts.append(t)
                values.append(v)
            }
            return ("[" + texts.joined(separator: "," + space()) + "]", values)
        default:
            var texts: [String] = []
            var values: [String: Any] = [:]
            for i in 0..<(1 + int(3)) {
                let name = pick(Self.plainNames) + String(i)
                let (t, v) = secretValue(depth: depth + 1)
                texts.append(encode(name) + space() + ":" + space() + t)
                values[name] = v
            }
            return ("{" + space() + texts.joined(separator: "," + space()) + space() + "}", values)
        }
    }

    /// A plain value, with secrets somewhere inside it at times.
    private mutating func plainValue(depth: Int) -> (String, Any) {
        switch depth > 3 ? int(4) : int(7) {
        case 0:
            let plain = pick(["plain", "/var/lib/x", "é😀", "a\"b", "#frag", "$notareference"])
            return (encode(plain), plain)
        case 1:
            let n = int(1000)
            return (String(n), n)
        case 2:
            let (user, host) = (userInfo(), pick(["example.com", "127.0.0.1:4318", "h"]))
            let path = pick(["", "/v1/batch", "/p?q=a@b"])
            // A password may hold `/`, `?` or `#`: up to the last `@` is hidden, a path's `@` too.
            let shown =
                path.contains("@") ? "https://***@" + path.split(separator: "@").last! : "https://***@\(host)\(path)"
            return (encode("https://\(user)@\(host)\(path)"), shown)
        case 3: return ("true", true)
        case 4:
            var texts: [String] = []
            var values: [Any] = []
            for _ in 0..<int(4) {
                let (t, v) = plainValue(depth: depth + 1)
                texts.append(t)
                values.append(v)
            }
            return ("[" + space() + texts.joined(separator: "," + space()) + "]", values)
        default: return object(depth: depth + 1)
        }
    }

    private mutating func object(depth: Int) -> (String, [String: Any]) {
        var texts: [String] = []
        var values: [String: Any] = [:]
        for i in 0..<(1 + int(depth > 3 ? 2 : 5)) {
            let text: String
            let value: Any
            var name: String
            switch int(4) {
            case 0:
                name = pick(Self.secretNames)
                (text, value) = secretValue(depth: depth)
            case 1:
                name = pick(["headers", "Headers"])
                var members: [String] = []
                var headers: [String: Any] = [:]
                for j in 0..<(1 + int(3)) {
                    let header = pick(["Authorization", "X-Api-Key", "Cookie"]) + String(j)
                    let (t, v) = secretValue(depth: 3)
                    members.append(encode(header) + ":" + space() + t)
                    headers[header] = v
                }
                (text, value) = ("{" + members.joined(separator: ",") + "}", headers)
            default:
                name = pick(Self.plainNames)
                (text, value) = plainValue(depth: depth)
            }
            name += String(i)
            texts.append(space() + encode(name) + space() + ":" + space() + text)
            values[name] = value
        }
        return ("{" + texts.joined(separator: ",") + space() + "}", values)
    }

    mutating func configuration() -> (String, [String: Any]) {
        secrets = []
        return object(depth: 0)
    }
}

/// Secrets from files and systemd credentials, resolved before any plugin sees them.
@Suite struct SecretReferenceTests {
    @Test func credentialsAndFilesAreReadAndTheirValuesAreSecrets() throws {
        let directory = scratchDirectory("creds")
        try "wk-from-credential\n".write(toFile: directory + "/analytics-key", atomically: true, encoding: .utf8)
        // CRLF ends a line as LF does (a token file from Windows: its CR made every batch a 401).
        try "tok \"quoted\"\r\n".write(toFile: directory + "/token", atomically: true, encoding: .utf8)
        let json = #"{"write_key": "$credential:analytics-key", "nested": [{"x": "$file:\#(directory)/token"}]}"#
        let (resolved, secrets) = try Secrets.resolveReferences(
            json, environment: ["CREDENTIALS_DIRECTORY": directory])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(resolved.utf8)) as? [String: Any])
        #expect(object["write_key"] as? String == "wk-from-credential")
        #expect(((object["nested"] as? [[String: Any]])?.first?["x"] as? String) == "tok \"quoted\"")
        #expect(secrets == ["wk-from-credential", "tok \"quoted\""])
        // Printed, both are stars, the one under a member that does not look secret too.
        let shown = try #require(Secrets.redact(resolved, hiding: secrets))
        #expect(!shown.contains("wk-from") && !shown.contains("quoted"))
    }

    @Test func aReferenceThatCannotBeReadSaysWhatToDo() throws {
        func failure(_ json: String) -> String {
            do {
                _ = try Secrets.resolveReferences(json, environment: [:])
                return "resolved"
            } catch {
                return error.description
            }
        }
        #expect(failure(#"{"token": "$credential:t"}"#).contains("LoadCredential=t:"))
        #expect(failure(#"{"token": "$credential:../etc/shadow"}"#).contains("file name"))
        #expect(failure(#"{"token": "$file:/nonexistent/t"}"#).contains("cannot read /nonexistent/t"))
        #expect(failure(#"{"token": "$file:relative"}"#).contains("absolute"))
        // Without a reference, nothing is read.
        #expect(failure(#"{"token": "plain"}"#) == "resolved")
    }
}
