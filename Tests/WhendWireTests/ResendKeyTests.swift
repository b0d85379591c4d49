import Foundation
import PropertyBased
import SeededRandom
import Testing
import WhendRecord
import WhendWire

/// A JSON string value as UTF-16 code units (what JSON's `\u` escapes spell, lone surrogates
/// included), from a small alphabet where decoding makes one of values that differ: lone
/// surrogates, U+FFFD, a pair, and characters that must or may be escaped.
struct GeneratedID {
    var rng: SplitMix64

    init(seed: UInt64) { rng = SplitMix64(state: seed) }

    mutating func pick(_ n: Int) -> Int { rng.int(n) }

    static let alphabet: [[UInt16]] = [
        [0x61], [0x78], [0xFFFD], [0xD800], [0xDBFF], [0xDC00], [0xDFFF], [0xD83D], [0xDE00], [0xD83D, 0xDE00],
        [0xE9], [0x0A], [0x22], [0x5C], [0x2F], [0x00], [0x7F],
    ]

    mutating func value() -> [UInt16] {
        (0...pick(4)).flatMap { _ in Self.alphabet[pick(Self.alphabet.count)] }
    }

    /// One way of writing `units` as the contents of a JSON string: each character raw where
    /// JSON allows it, or as a `\u` escape in either case, or as a short escape.
    mutating func spelling(of units: [UInt16]) -> String {
        var out = ""
        var i = 0
        func escape(_ u: UInt16) -> String {
            let hex = String(u, radix: 16)
            let padded = String(repeating: "0", count: 4 - hex.count) + hex
            return "\\u" + (pick(2) == 0 ? padded : padded.uppercased())
        }
        while i < units.count {
            let u = units[i]
            if (0xD800...0xDBFF).contains(u), i + 1 < units.count, (0xDC00...0xDFFF).contains(units[i + 1]) {
                // A pair: one scalar, raw or two escapes.
                let scalar = 0x10000 + (UInt32(u - 0xD800) << 10) + UInt32(units[i + 1] - 0xDC00)
                out += pick(2) == 0 ? String(Unicode.Scalar(scalar)!) : escape(u) + escape(units[i + 1])
                i += 2
                continue
            }
            i += 1
            let short: [UInt16: String] = [0x0A: "\\n", 0x22: "\\\"", 0x5C: "\\\\", 0x2F: "\\/"]
            if let s = short[u], pick(2) == 0 {
                out += s
            } else if (0xD800...0xDFFF).contains(u) || u < 0x20 || u == 0x22 || u == 0x5C || pick(2) == 0 {
                out += escape(u)
            } else {
                out += String(Unicode.Scalar(u)!)
            }
        }
        return out
    }
}

/// The resend key of an event whose `id` is spelled `id` (the contents of the string), as the
/// daemon computes it from the line, and as it computes it again from the stored record at
/// start-up; the stored record's `id` member as stored.
func resendKeys(id: String, hello: Hello = Hello()) throws -> (live: DedupKey?, rebuilt: DedupKey?, stored: String) {
    let (stored, live) = try body(#"{"type":"when","name":"e","id":"\#(id)"}"#, hello: hello)
    let bytes = Array(stored.utf8)
    let record = try bytes.withUnsafeBufferPointer { try StoredRecord.scan($0) }
    let member = try #require(stored.range(of: #","id":""#))
    let value = stored[member.upperBound...].prefix { $0 != "," }
    return (live, record.dedupKey, String(value))
}

@Suite struct ResendKeyTests {
    /// The ids of the report: five different strings, each a different event. Decoded, each of
    /// the first three is U+FFFD and each of the last two "x" + U+FFFD, and only two of the five
    /// were stored (the rest acknowledged as resends).
    @Test func idsThatDifferOnlyInLoneSurrogatesAreDifferentEvents() throws {
        let ids = [#"\ud800"#, #"\udfff"#, #"\ufffd"#, #"x\udc00"#, #"x\ud83d"#]
        let keys = try ids.map { try resendKeys(id: $0) }
        #expect(Set(keys.compactMap(\.live)).count == 5)
        for k in keys { #expect(k.live == k.rebuilt) }
    }

    /// Another spelling of the same string is the same event, whatever it was written with.
    @Test func spellingsOfOneStringAreOneEvent() throws {
        let same: [[String]] = [
            [#"\ud800"#, #"\uD800"#, #"\uD800"#],
            ["\u{FFFD}", #"\ufffd"#, #"\uFFFD"#],
            ["😀", #"\ud83d\ude00"#, #"\uD83D\uDE00"#],
            [#"a/b"#, #"a\/b"#, #"\u0061\u002f\u0062"#],
            [#"\n\""#, #"\u000a\u0022"#, #"\u000A\""#],
        ]
        for spellings in same {
            let keys = try spellings.map { try resendKeys(id: $0) }
            #expect(Set(keys.compactMap(\.live)).count == 1, "\(spellings)")
            #expect(Set(keys.map(\.stored)).count == 1, "\(spellings)")
            for k in keys { #expect(k.live == k.rebuilt) }
        }
    }

    /// The defaults an event without its own app or session is stored with count as they are
    /// stored too: a hello's app with a quote in it, a process name with a control character.
    @Test func defaultsAreKeyedAsStored() throws {
        let hello = Hello(app: Array("a\"b\u{1}".utf8), session: Array("s\\1".utf8), acks: true)
        let (live, rebuilt, _) = try resendKeys(id: "e1", hello: hello)
        #expect(live != nil && live == rebuilt)
        let (stored, key) = try body(#"{"type":"when","name":"e","id":"e1"}"#, comm: "we\"ird\u{7}")
        let record = try Array(stored.utf8).withUnsafeBufferPointer { try StoredRecord.scan($0) }
        #expect(key != nil && key == record.dedupKey)
        // And an event that names the same app itself is the same event.
        let (_, own) = try body(#"{"type":"when","name":"e","app":"we\"ird\u0007","id":"e1"}"#, comm: "we\"ird\u{7}")
        #expect(own == key)
    }

    /// An app and a session given in the hello are stored, and keyed, as the same strings given
    /// by the event itself, however each is spelled: before, a lone surrogate in the hello's
    /// became U+FFFD, where the event's own kept its escape.
    @Test(arguments: 0..<1000 as Range<UInt64>)
    func theHellosAppAndSessionAreStoredAsAnEventsOwn(seed: UInt64) throws {
        var g = GeneratedID(seed: seed)
        var app = g.value()
        var session = g.value()
        // An app and a session are never empty.
        if app.isEmpty { app = [0x61] }
        if session.isEmpty { session = [0x73] }
        let named = #""app":"\#(g.spelling(of: app))","session":"\#(g.spelling(of: session))""#
        let hello = #"{"hello":{"protocol":1,"# + named + "}}"
        guard
            case .hello(let scanned) = try Array(hello.utf8).withUnsafeBufferPointer({
                try EventScanner.scan($0, helloAllowed: true)
            })
        else { throw WireError(.invalidJSON, "not a hello: \(hello)") }
        let (defaulted, defaultedKey) = try body(#"{"type":"when","name":"e","id":"e1"}"#, hello: scanned)
        let own =
            #"{"type":"when","name":"e","id":"e1","# + #""app":"\#(g.spelling(of: app))","#
            + #""session":"\#(g.spelling(of: session))"}"#
        let (explicit, explicitKey) = try body(own, hello: Hello())
        func member(_ name: String, _ record: String) throws -> Substring {
            let start = try #require(record.range(of: #","\#(name)":""#), "seed \(seed): \(record)")
            return record[start.upperBound...].prefix { $0 != "," }
        }
        #expect(try member("app", defaulted) == member("app", explicit), "seed \(seed): \(hello) \(own)")
        #expect(try member("session", defaulted) == member("session", explicit), "seed \(seed): \(hello) \(own)")
        #expect(defaultedKey != nil && defaultedKey == explicitKey, "seed \(seed)")
    }

    static func check(seed: UInt64) throws {
        var g = GeneratedID(seed: seed)
        let a = g.value()
        let b = g.value()
        let a1 = try resendKeys(id: g.spelling(of: a))
        let a2 = try resendKeys(id: g.spelling(of: a))
        let b1 = try resendKeys(id: g.spelling(of: b))
        #expect(a1.live == a2.live, "seed \(seed): two spellings of \(a) are two keys")
        #expect(a1.stored == a2.stored, "seed \(seed): two spellings of \(a) are stored apart")
        #expect(a1.live == a1.rebuilt && a2.live == a2.rebuilt && b1.live == b1.rebuilt, "seed \(seed)")
        if a != b {
            #expect(a1.live != b1.live, "seed \(seed): \(a) and \(b) are one key")
            #expect(a1.stored != b1.stored, "seed \(seed): \(a) and \(b) are stored alike")
        }
    }

    /// Every seed of a fixed range: repeatable.
    @Test func keysFollowTheStringForFixedSeeds() throws {
        for seed in UInt64(0)..<3000 { try Self.check(seed: seed) }
    }

    /// New seeds each run (PropertyBased reports the failing one).
    @Test func keysFollowTheString() async {
        await propertyCheck(count: 2000, input: Gen.uint64()) { seed in
            do { try Self.check(seed: seed) } catch { Issue.record("seed \(seed): \(error)") }
        }
    }
}
