import Foundation
import SeededRandom
import Testing
import WhendWire

@testable import BuiltinPluginSupport

/// The compact forms session-recorder keeps a session in give back exactly what they were given,
/// and what does not fit them is kept whole: the index reads as the one of plain strings did.
struct SessionIndexTests {
    @Test func aPackedTimeIsItsTextOrNothing() {
        for text in [
            "2026-11-24T05:57:45.681Z", "2026-11-26T08:57:55.759524Z", "0000-00-00T00:00:00Z", "9999-12-31T23:59:60.9Z",
        ] {
            #expect(PackedTime(text)?.string == text, "\(text)")
        }
        #expect(PackedTime("")?.string == "")
        for text in [
            "2026-11-24T05:57:45.681z", "2026-11-24t05:57:45Z", "2026-11-24T05:57:45+02:00",
            "2026-11-24T05:57:45.1234567Z",
            "2026-13-24T05:57:45Z", "2026-11-32T05:57:45Z", "2026-11-24T24:57:45Z", "2026-11-24T05:60:45Z",
            "2026-11-24T05:57:61Z", "2026-11-24T05:57:45.Z", "2026-1-24T05:57:45Z", "+026-11-24T05:57:45Z", "yesterday",
            "2026-11-24 05:57:45Z", "٢٠٢٦-11-24T05:57:45Z",
        ] {
            #expect(PackedTime(text) == nil, "\(text)")
        }
        var random = SplitMix64(state: 7)
        let characters = Array("0123456789-:TZ.z+ ")
        for _ in 0..<20_000 {
            var text = Array("2026-11-24T05:57:45.681Z")
            for _ in 0..<Int.random(in: 1...3, using: &random) {
                text[Int.random(in: 0..<text.count, using: &random)] = characters.randomElement(using: &random)!
            }
            let string = String(text)
            if let packed = PackedTime(string) { #expect(packed.string == string, "\(string)") }
        }
    }

    @Test func anInlineTextIsItsTextOrNothing() {
        var random = SplitMix64(state: 11)
        let alphabets = [
            Array("0123456789abcdef-"), Array("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_"),
            Array("abc é\"\\/+=."),
        ]
        for _ in 0..<20_000 {
            let alphabet = alphabets.randomElement(using: &random)!
            let length = Int.random(in: 0...50, using: &random)
            let text = String((0..<length).map { _ in alphabet.randomElement(using: &random)! })
            if let inline = InlineText(text) {
                #expect(inline.string == text, "\(text)")
            } else {
                #expect(text.utf8.count > 31, "\(text)")
            }
        }
        #expect(InlineText(String(repeating: "a", count: 41)) != nil)
        #expect(InlineText(String(repeating: "a", count: 42)) == nil)
        #expect(InlineText(String(repeating: "é", count: 16)) == nil)
        #expect(InlineText.spilled.string == nil)
    }

    /// An index of sessions with ids, times and types of every kind reads as the plain entries
    /// it was given, after records, a trim, and a copy made from its entries.
    @Test func anIndexReadsAsTheEntriesItWasGiven() {
        var random = SplitMix64(state: 3)
        let sessions = [
            "s1", "cbca3ba3-712d-62311df02c34", "6F9619FF-8B86-D011-B42D-00C04FC964FF",
            String(repeating: "x", count: 60),
            "with \"quotes\" and é", "",
        ]
        let times = [
            "2026-11-24T05:57:45.681Z", "2026-11-24T05:57:45+02:00", "", "2026-11-24T05:57:45.123456789Z", "later",
        ]
        let types = ["lifecycle", "navigation", "when", "screen", "error", "a", "é", "", "zz"]
        var index = SessionIndex(directory: "", indexedThrough: 0, entries: [:])
        var expected: [SessionDigest: SessionIndex.Entry] = [:]
        for seq in UInt64(1)...3000 {
            let app = ["com.example.a", "com.example.b"].randomElement(using: &random)!
            let session = sessions.randomElement(using: &random)!
            let time = times.randomElement(using: &random)!
            let type = types[Int.random(in: 0..<(seq < 1500 ? 4 : types.count), using: &random)]
            let key = SessionDigest(app: app, session: session)
            index.apply(seq: seq, session: key, app: { app }, sessionID: { session }, type: type, time: { time })
            if var e = expected[key] {
                e.lastSeq = seq
                if !time.isEmpty { e.lastTime = time }
                e.counts.add(type)
                expected[key] = e
            } else {
                expected[key] = SessionIndex.Entry(
                    app: app, session: session, firstSeq: seq, lastSeq: seq, firstTime: time, lastTime: time,
                    counts: [type: 1])
            }
        }
        func entries(_ index: SessionIndex) -> [SessionDigest: SessionIndex.Entry] {
            Dictionary(uniqueKeysWithValues: (0..<index.count).map { index.entry(at: $0) })
        }
        #expect(entries(index) == expected)
        let copy = SessionIndex(directory: "", indexedThrough: index.indexedThrough, entries: expected)
        #expect(entries(copy) == expected)
        #expect(copy.sessions == index.sessions)
        var trimmed = index
        trimmed.trim(to: 4)
        let kept = expected.filter { e in expected.values.filter { $0.lastSeq > e.value.lastSeq }.count < 4 }
        #expect(entries(trimmed) == kept)
        #expect(entries(index) == expected)
    }
}
