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

    /// A reader completing session-recorder's export from the journal lists what the plugin
    /// exports from the same records in one go, under any `max_sessions`, whenever the plugin
    /// exported on the way and however often it was restarted from a saved state (and handled
    /// the records after it again). Before, the reader kept every session the journal named
    /// past the export, whatever the limit.
    @Test func aListingCompletedFromTheJournalIsWhatThePluginExportsInOneGo() throws {
        for seed in UInt64(0)..<60 { try Self.checkListing(seed: seed) }
    }

    static func checkListing(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let limit = 1 + random.int(5)
        let pool = limit + 1 + random.int(8)
        var named: [String] = []
        let lines: [[UInt8]] = (1...(10 + random.int(100))).map { seq in
            let session = #""app":"a\#(random.int(2))","session":"s\#(random.int(pool))""#
            named.append(session)
            let time = random.int(4) == 0 ? "" : #","ts":"2026-11-24T05:\#(10 + random.int(50)):00Z""#
            let type = ["when", "lifecycle", "error"][random.int(3)]
            return Array(#"{"_seq":\#(seq),\#(session),"type":"\#(type)"\#(time)}"#.utf8)
        }
        let live = scratchDirectory("listing-live")
        defer { try? FileManager.default.removeItem(atPath: live) }
        var plugin = try SessionIndexExport(directory: live, maxSessions: limit)
        try plugin.export()  // as the plugin does when it finds no export
        var saved = (index: plugin.index, through: 0)
        var handled = 0
        // What the journal holds: a restarted plugin handles again what it had handled.
        var stored = 0
        var checks = 0
        while handled < lines.count {
            handled += 1
            stored = max(stored, handled)
            record(lines[handled - 1], seq: UInt64(handled), into: plugin)
            switch random.int(12) {
            case 0: try plugin.export()  // every so often
            case 1: saved = (plugin.index, handled)  // a snapshot with its cursor
            case 2:
                // Stopped (exported) or killed, then restarted from the last snapshot: the records
                // after it are handled again.
                if random.int(2) == 0 { try plugin.export() }
                plugin = try SessionIndexExport(directory: live, maxSessions: limit)
                plugin.index = saved.index.moved(to: live)
                handled = saved.through
            default: break
            }
            guard random.int(8) == 0 || handled == lines.count else { continue }
            checks += 1
            var reader = SessionIndex(directory: live)
            for (i, line) in lines[..<stored].enumerated() where UInt64(i + 1) > reader.indexedThrough {
                line.withUnsafeBufferPointer { reader.apply(stored: $0, seq: UInt64(i + 1)) }
            }
            let oneGo = scratchDirectory("listing-once")
            defer { try? FileManager.default.removeItem(atPath: oneGo) }
            let once = try SessionIndexExport(directory: oneGo, maxSessions: limit)
            for (i, line) in lines[..<stored].enumerated() { record(line, seq: UInt64(i + 1), into: once) }
            try once.export()
            let expected = SessionIndex(directory: oneGo).sessions
            #expect(expected.count == min(limit, Set(named[..<stored]).count), "seed \(seed)")
            func brief(_ sessions: [SessionIndex.Entry]) -> String {
                sessions.map { "\($0.app)/\($0.session) \($0.firstSeq)…\($0.lastSeq)" }.joined(separator: ", ")
            }
            let same = reader.sessions == expected
            #expect(
                same,
                "seed \(seed), max_sessions \(limit), through _seq \(stored): listed \(brief(reader.sessions)); exported in one go \(brief(expected))"
            )
            if !same { return }
        }
        #expect(checks > 0)
    }

    /// An export as earlier versions wrote it (no limit, no sessions beyond it) reads as it did,
    /// and is completed without a limit; one written now says its limit and keeps what is
    /// beyond it.
    @Test func anExportWithoutItsLimitIsReadAsBefore() throws {
        let directory = scratchDirectory("old-export")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let old =
            #"{"indexedThrough":2,"sessions":[{"app":"a","counts":{"when":1},"firstSeq":2,"firstTime":"","lastSeq":2,"lastTime":"","session":"s2"},"#
            + #"{"app":"a","counts":{"when":1},"firstSeq":1,"firstTime":"","lastSeq":1,"lastTime":"","session":"s1"}]}"#
        try old.write(toFile: directory + "/sessions.json", atomically: true, encoding: .utf8)
        var index = SessionIndex(directory: directory)
        #expect(index.maxSessions == nil && index.indexedThrough == 2)
        #expect(index.sessions.map(\.session) == ["s2", "s1"])
        Array(#"{"_seq":3,"app":"a","session":"s3","type":"when"}"#.utf8).withUnsafeBufferPointer {
            index.apply(stored: $0, seq: 3)
        }
        #expect(index.sessions.map(\.session) == ["s3", "s2", "s1"])

        let plugin = try SessionIndexExport(directory: directory, maxSessions: 3)
        #expect(plugin.index.sessions.map(\.session) == ["s2", "s1"])
        for (seq, session) in [(3, "s3"), (4, "s4")] {
            Self.record(
                Array(#"{"app":"a","session":"\#(session)","type":"when"}"#.utf8), seq: UInt64(seq), into: plugin)
        }
        try plugin.export()
        let text = try String(contentsOfFile: directory + "/sessions.json", encoding: .utf8)
        #expect(text.hasPrefix(#"{"indexedThrough":4,"maxSessions":3,"sessions":[{"app":"a","#), "\(text)")
        #expect(text.contains(#""sessionsBeyondMax":[{"app":"a","#), "\(text)")
        let read = SessionIndex(directory: directory)
        #expect(read.maxSessions == 3 && read.count == 4 && read.sessions.map(\.session) == ["s4", "s3", "s2"])
    }

    /// Session ids that differ only in surrogates without their partner (decoded, each is "s"
    /// and U+FFFD) are as many sessions to the plugin, in its export, and to a reader completing
    /// the export from the journal.
    @Test func sessionsThatDifferOnlyInLoneSurrogatesStayApartThroughTheExport() throws {
        let directory = scratchDirectory("lone-export")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let ids = [#"s\ud800"#, #"s\udfff"#, "s\u{FFFD}", #"s\udc00\ud800"#]
        func line(_ id: String) -> [UInt8] { Array(#"{"app":"a","session":"\#(id)","type":"when"}"#.utf8) }
        let plugin = try SessionIndexExport(directory: directory)
        for (i, id) in ids.enumerated() { Self.record(line(id), seq: UInt64(i + 1), into: plugin) }
        #expect(plugin.index.count == ids.count)
        try plugin.export()
        var reader = SessionIndex(directory: directory)
        #expect(reader.count == ids.count)
        line(ids[1]).withUnsafeBufferPointer { reader.apply(stored: $0, seq: 5) }
        line(ids[0]).withUnsafeBufferPointer { reader.apply(stored: $0, seq: 6) }
        #expect(reader.count == ids.count)
        #expect(reader.sessions.map(\.lastSeq) == [6, 5, 4, 3])
        #expect(reader.sessions.map(\.records) == [2, 2, 1, 1])
    }

    /// The export written from each session's compact form is, byte for byte, the one written
    /// from its entry, for sessions of every kind: ids, apps and types that need escapes or
    /// hold U+FFFD (decoded lone surrogates, whose digests are written), times and counts that
    /// do not fit the compact forms, with a limit or none.
    @Test func anExportFromCompactSessionsIsTheOneFromTheirEntries() throws {
        for seed in UInt64(1)...20 {
            var random = SplitMix64(state: seed)
            let apps = ["com.example.a", #"app \"quoted\""#, #"a\ud800"#, #"é\u0001"#, "app\u{FFFD}"]
            let sessions = [
                "s1", "cbca3ba3-712d-62311df02c34", "6F9619FF-8B86-D011-B42D-00C04FC964FF", #"s\udfff"#,
                String(repeating: "x", count: 60), #"with \"quotes\" and é"#, #"tab\t"#, "s\u{FFFD}",
            ]
            let times = [
                "2026-11-24T05:57:45.681Z", "2026-11-24T05:57:45+02:00", "", "2026-11-24T05:57:45Z", "later",
            ]
            // Spellings of one name ("when" and "wh\u0065n", "é" and "\u00e9"), names whose bytes
            // differ where Swift's `==` does not ("é" and "e\u0301"), and more than 16 names.
            let types =
                [
                    "lifecycle", "navigation", "when", "screen", "error", "a", "é", "", #"q\"uote"#, #"wh\u0065n"#,
                    #"\u00e9"#, #"e\u0301"#,
                ] + (0..<12).map { "t\($0)" }
            var index = SessionIndex(directory: "", indexedThrough: 0, entries: [:])
            let limit = random.int(3) == 0 ? 100_000 : 1 + random.int(30)
            index.maxSessions = limit
            // The same records as the plugin indexes them (types and times as stored).
            let pluginDirectory = scratchDirectory("compact-export-\(seed)")
            defer { try? FileManager.default.removeItem(atPath: pluginDirectory) }
            let plugin = try SessionIndexExport(directory: pluginDirectory, maxSessions: limit)
            for seq in UInt64(1)...UInt64(200 + random.int(800)) {
                let app = apps[random.int(apps.count)]
                // One session in seven of every type, more than its compact form counts.
                let many = seq % 7 == 0
                let session = many ? "many" : sessions[random.int(sessions.count)] + "\(random.int(6))"
                let type = types[random.int(many || random.int(4) == 0 ? types.count : 4)]
                let time = times[random.int(times.count)]
                let ts = time.isEmpty ? "" : #","ts":"\#(time)""#
                let line = #"{"app":"\#(app)","session":"\#(session)","type":"\#(type)"\#(ts)}"#
                Array(line.utf8).withUnsafeBufferPointer { index.apply(stored: $0, seq: seq) }
                Self.record(Array(line.utf8), seq: seq, into: plugin)
            }
            func export(_ index: SessionIndex, compact: Bool) throws -> [UInt8] {
                var out: [UInt8] = []
                try index.writeSnapshotJSON(compact: compact) { out += $0 }
                return out
            }
            let compact = try export(index, compact: true)
            let fromEntries = try export(index, compact: false)
            let byThePlugin = try export(plugin.index, compact: true)
            #expect(byThePlugin == compact, "seed \(seed): the plugin's index is not the reader's")
            #expect(
                compact == fromEntries,
                "seed \(seed): \(String(decoding: compact.prefix(600), as: UTF8.self)) against \(String(decoding: fromEntries.prefix(600), as: UTF8.self))"
            )
            #expect((try? JSONSerialization.jsonObject(with: Data(compact))) != nil, "seed \(seed)")
            // Read back, the export is the index's sessions, digests included; cut anywhere, or
            // with a byte changed to one JSON does not allow there, it is no export at all.
            let read = try #require(compact.withUnsafeBufferPointer { SessionIndex.readExport($0) }, "seed \(seed)")
            let all = read.sessions + (read.sessionsBeyondMax ?? [])
            #expect(all.map(\.entry) == index.allSessions && read.indexedThrough == index.indexedThrough)
            #expect(Set(all.map(\.key)) == Set((0..<index.count).map { index.entry(at: $0).key }))
            // A limit past the largest count (a damaged export) is no export, not a trap.
            let key = Array(#""maxSessions":"#.utf8)
            let digits = try #require(compact.indices.first { compact[$0...].starts(with: key) }) + key.count
            let after = compact[digits...].firstIndex { $0 < UInt8(ascii: "0") || $0 > UInt8(ascii: "9") } ?? digits
            let huge = Array(compact[..<digits]) + Array("18446744073709551615".utf8) + Array(compact[after...])
            #expect(huge.withUnsafeBufferPointer { SessionIndex.readExport($0) } == nil)
            for _ in 0..<20 {
                let cut = random.int(compact.count - 1)
                #expect(compact[..<cut].withUnsafeBufferPointer { SessionIndex.readExport($0) } == nil, "cut at \(cut)")
                var changed = compact
                changed[cut] = 0x01
                #expect(changed.withUnsafeBufferPointer { SessionIndex.readExport($0) } == nil, "changed at \(cut)")
            }
        }
    }

    /// Apps and types that Swift's `==` takes for one ("é" as one code point, and "e" with a
    /// combining accent) are as many as their bytes are, in the index, in its export and in a
    /// listing completed from the journal. The export once gave a session the app another
    /// session had spelled first, and the listing, finding the journal's bytes elsewhere, split
    /// that session in two.
    @Test func namesThatDifferOnlyInTheirBytesStayApart() throws {
        let state = scratchDirectory("bytes-export")
        defer { try? FileManager.default.removeItem(atPath: state) }
        let directory = SessionIndex.directory(stateDirectory: state)
        try FileManager.default.createDirectory(atPath: state + "/journal", withIntermediateDirectories: true)
        let composed = #"{"app":"\u00e9","session":"X","type":"when"}"#
        let decomposed = #"{"app":"e\u0301","session":"Y","type":"when"}"#
        let plugin = try SessionIndexExport(directory: directory)
        Self.record(Array(composed.utf8), seq: 1, into: plugin)
        Self.record(Array(decomposed.utf8), seq: 2, into: plugin)
        Self.record(Array(#"{"app":"a","session":"T","type":"\u00e9"}"#.utf8), seq: 3, into: plugin)
        Self.record(Array(#"{"app":"a","session":"T","type":"e\u0301"}"#.utf8), seq: 4, into: plugin)
        let types = try #require(plugin.index.sessions.first { $0.session == "T" }).counts
        #expect(types.keys.map { Array($0.utf8) } == [Array("e\u{301}".utf8), Array("\u{e9}".utf8)])
        try plugin.export()
        let export = try #require(FileManager.default.contents(atPath: directory + "/sessions.json")).map { $0 }
        // Bytes, not `String.contains`, which finds either spelling for the other.
        func holds(_ text: String) -> Bool {
            let needle = Array(text.utf8)
            return export.indices.contains { i in export[i...].starts(with: needle) }
        }
        let text = String(decoding: export, as: UTF8.self)
        #expect(holds(#""app":"e\#u{301}","#) && holds(#""app":"\#u{e9}","#), "\(text)")
        #expect(holds(#""counts":{"e\#u{301}":1,"\#u{e9}":1}"#), "\(text)")

        var reader = SessionIndex(directory: directory)
        Array(#"{"_seq":5,"app":"e\u0301","session":"Y","type":"when"}"#.utf8).withUnsafeBufferPointer {
            reader.apply(stored: $0, seq: 5)
        }
        let y = reader.sessions.filter { $0.session == "Y" }
        #expect(y.count == 1 && y.first?.records == 2, "\(y)")
        #expect(y.first.map { Array($0.app.utf8) } == Array("e\u{301}".utf8))
        // The export read back keeps both types (Foundation's decoder kept one).
        let t = try #require(reader.sessions.first { $0.session == "T" })
        #expect(t.counts.keys.map { Array($0.utf8) } == types.keys.map { Array($0.utf8) } && t.records == 2)
        // And `whenctl sessions --json` writes both (Foundation's encoder trapped, then kept one).
        let listed = try whenctl(["sessions", "--state-dir", state, "--json", "--limit", "10"])
        #expect(listed.status == 0, "\(listed.error)")
        let line = Array((listed.output.split(separator: "\n").first { $0.contains(#""session":"T""#) } ?? "").utf8)
        let counts = Array(#""counts":{"e\#u{301}":1,"\#u{e9}":1}"#.utf8)
        #expect(line.indices.contains { line[$0...].starts(with: counts) }, "\(listed.output)")
    }

    /// One stored record, as session-recorder's `handle` gives it to its index.
    static func record(_ line: [UInt8], seq: UInt64, into index: SessionIndexExport) {
        line.withUnsafeBufferPointer { bytes in
            var app: JSONValue?
            var session: JSONValue?
            var type: JSONValue?
            var ts: JSONValue?
            var scanner = JSONScanner(bytes)
            try? scanner.scanObject { m throws(WireError) in
                let value = JSONValue(raw: UnsafeBufferPointer(rebasing: bytes[m.value]))
                switch String(decoding: UnsafeBufferPointer(rebasing: bytes[m.key]), as: UTF8.self) {
                case "app": app = value
                case "session": session = value
                case "type": type = value
                case "ts": ts = value
                default: break
                }
            }
            guard let app, let session else { return }
            _ = index.record(
                seq: seq, session: SessionDigest(app: app, session: session), app: app, session: session,
                type: type, time: ts)
        }
    }
}
