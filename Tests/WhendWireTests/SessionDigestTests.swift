import PropertyBased
import Testing
import WhendWire

/// Session digests key plugins' in-memory tables (`BoundedSessions`, the session index). The
/// digest's own key is fixed and public (a digest is saved), so a client can craft session ids
/// whose digests agree in their low bits; the tables must spread them all the same.
@Suite struct SessionDigestTests {
    /// Session ids of one app whose digests agree in their low `bits` bits, found as a client
    /// would: by trying ids until enough do.
    static func craftedIDs(count: Int, bits: Int, base: UInt64) -> [SessionDigest] {
        let mask = (UInt64(1) << UInt64(bits)) - 1
        var found: [SessionDigest] = []
        var i = base
        while found.count < count {
            let id = SessionDigest(app: "com.example.app", session: "s-\(i)")
            if id.low & mask == 0 { found.append(id) }
            i &+= 1
        }
        return found
    }

    /// The longest run of probes a linear-probing table (as Swift's `Dictionary` is: the bucket
    /// is the low bits of `_rawHashValue(seed:)`) of `buckets` takes to place `ids`.
    static func longestProbe(_ ids: [SessionDigest], buckets: Int, seed: Int) -> Int {
        var taken = [Bool](repeating: false, count: buckets)
        var longest = 0
        for id in ids {
            var bucket = id._rawHashValue(seed: seed) & (buckets - 1)
            var probes = 1
            while taken[bucket] {
                bucket = (bucket + 1) & (buckets - 1)
                probes += 1
            }
            taken[bucket] = true
            longest = max(longest, probes)
        }
        return longest
    }

    /// 300 ids crafted to agree in the low 9 bits of their digests, in a table of 1024 buckets
    /// under any seed: no id takes more than 32 probes. (Under the digest's bits alone, mixed
    /// with the seed by an exclusive or, they fell in two runs of about 150.)
    @Test func craftedSessionIDsDoNotCollideInATable() async {
        await propertyCheck(count: 4, input: Gen.uint64(), Gen.int()) { base, seed in
            let ids = Self.craftedIDs(count: 300, bits: 9, base: base)
            #expect(Set(ids).count == ids.count)
            let longest = Self.longestProbe(ids, buckets: 1024, seed: seed)
            #expect(longest <= 32, "the longest probe is \(longest)")
        }
    }

    /// The digest itself stays what it was: saved states key by it.
    @Test func theDigestIsTheSameInEveryProcess() {
        let id = SessionDigest(app: "com.example.app", session: "s-1")
        #expect(id == SessionDigest(low: id.low, high: id.high))
        #expect(String(id.low, radix: 16) + "/" + String(id.high, radix: 16) == Self.savedDigest)
    }

    static let savedDigest = "e6658ae53dcccfa0/bc360d1c14945f8a"

    /// The digest of an app and session as stored, spelled `app` and `session` (the contents of
    /// JSON strings).
    static func digest(app: String, session: String) -> SessionDigest {
        let a = Array("\"\(app)\"".utf8)
        let s = Array("\"\(session)\"".utf8)
        return a.withUnsafeBufferPointer { a in
            s.withUnsafeBufferPointer { s in SessionDigest(app: JSONValue(raw: a), session: JSONValue(raw: s)) }
        }
    }

    /// Whether `units` hold a surrogate without its partner.
    static func hasLoneSurrogate(_ units: [UInt16]) -> Bool {
        var i = 0
        while i < units.count {
            if (0xD800...0xDBFF).contains(units[i]), i + 1 < units.count, (0xDC00...0xDFFF).contains(units[i + 1]) {
                i += 2
                continue
            }
            if (0xD800...0xDFFF).contains(units[i]) { return true }
            i += 1
        }
        return false
    }

    /// Sessions follow the JSON string, as the journal stores it apart: two spellings of one are
    /// one session, two strings are two even where decoding makes them alike (surrogates
    /// without their partner all decode to U+FFFD); and the digest of a string without such a
    /// surrogate is the one saved states hold, that of its decoded text.
    static func check(seed: UInt64) {
        var g = GeneratedID(seed: seed)
        let app = g.value()
        let a = g.value()
        let b = g.value()
        let a1 = digest(app: g.spelling(of: app), session: g.spelling(of: a))
        let a2 = digest(app: g.spelling(of: app), session: g.spelling(of: a))
        let b1 = digest(app: g.spelling(of: app), session: g.spelling(of: b))
        #expect(a1 == a2, "seed \(seed): two spellings of \(a) are two sessions")
        if a != b { #expect(a1 != b1, "seed \(seed): \(a) and \(b) are one session") }
        let other = digest(app: g.spelling(of: b), session: g.spelling(of: a))
        if app != b { #expect(other != a1, "seed \(seed): apps \(app) and \(b) are one") }
        if !hasLoneSurrogate(app) && !hasLoneSurrogate(a) {
            let saved = SessionDigest(
                app: String(decoding: app, as: UTF16.self), session: String(decoding: a, as: UTF16.self))
            #expect(a1 == saved, "seed \(seed): \(app)/\(a) is no longer the session saved")
        }
    }

    /// The ids of the report: decoded, each of the first five is "s" and U+FFFD.
    @Test func sessionIDsThatDifferOnlyInLoneSurrogatesAreDifferentSessions() {
        let ids = [#"s\ud800"#, #"s\udbff"#, #"s\udc00"#, #"s\udfff"#, #"s\ufffd"#, #"s\udc00\ud800"#]
        #expect(Set(ids.map { Self.digest(app: "a", session: $0) }).count == ids.count)
        #expect(Self.digest(app: "a", session: #"s\ufffd"#) == SessionDigest(app: "a", session: "s\u{FFFD}"))
        #expect(Self.digest(app: "a", session: #"s\uD800"#) == Self.digest(app: "a", session: #"s\ud800"#))
    }

    /// Every seed of a fixed range: repeatable.
    @Test func sessionsFollowTheStringForFixedSeeds() {
        for seed in UInt64(0)..<3000 { Self.check(seed: seed) }
    }

    /// New seeds each run (PropertyBased reports the failing one).
    @Test func sessionsFollowTheString() async {
        await propertyCheck(count: 2000, input: Gen.uint64()) { seed in Self.check(seed: seed) }
    }
}
