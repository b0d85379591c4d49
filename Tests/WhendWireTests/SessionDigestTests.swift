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
}
