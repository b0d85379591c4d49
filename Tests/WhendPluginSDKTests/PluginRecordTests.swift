import Foundation
import Testing

@testable import WhendPluginSDK

private func withRecord<R>(_ text: String, seq: UInt64 = 1, _ body: (PluginRecord) throws -> R) rethrows -> R {
    try Array(text.utf8).withUnsafeBufferPointer { try body(PluginRecord(bytes: $0, seq: seq)) }
}

@Suite struct PluginRecordTests {
    @Test func everyWellKnownFieldIsFoundWhereverItStands() {
        var object: [String] = []
        for (i, field) in RecordField.allCases.enumerated() { object.append(#""\#(field.key)":"v\#(i)""#) }
        let text = "{" + object.reversed().joined(separator: ",") + "}"
        withRecord(text) { r in
            for (i, field) in RecordField.allCases.enumerated() {
                #expect(r.string(field) == "v\(i)", "\(field)")
            }
        }
    }

    @Test func nestedValuesStringsWithBracesAndEscapedKeysDoNotMislead() {
        let text =
            #"{"_seq":9,"params":{"type":"inner","a":[1,{"b":"}]\"{"}]},"note":"\"type\":\"fake\"","typ\u0065":"lifecycle","em\u0061il":"x@y","type":"second","flag":true,"n":-1.5e3,"screen":"Caf\u00e9"}"#
        withRecord(text) { r in
            // The escaped spelling is the key `type`, and the first occurrence wins.
            #expect(r.has(.type, "lifecycle"))
            #expect(r[.params]?.kind == .object)
            #expect(r.field("email")?.string == "x@y")
            #expect(r.field("flag")?.bool == true)
            #expect(r.field("n")?.double == -1500)
            #expect(r[.seq]?.uint64 == 9)
            #expect(r.string(.screen) == "Café")
            #expect(r[.screen]?.isString("Café") == true)
            #expect(r.field("missing") == nil)
        }
    }

    @Test func theSessionIDCacheAnswersAsTheDigestDoesWhateverTheOrder() {
        // Runs of one session, then changes of app alone, of session alone, a field missing,
        // an escaped spelling of the same session: each must be the record's own identity.
        let records = [
            #"{"app":"a","session":"s1"}"#, #"{"app":"a","session":"s1"}"#, #"{"app":"b","session":"s1"}"#,
            #"{"app":"b","session":"s2"}"#, #"{"session":"s2"}"#, #"{"app":"b"}"#, #"{}"#,
            #"{"app":"a","session":"s\u0031"}"#, #"{"app":"a","session":"s1"}"#, #"{"app":"ab","session":"1"}"#,
        ]
        var cache = SessionIDCache()
        for text in records + records.reversed() {
            withRecord(text) { r in #expect(cache.id(of: r) == SessionID(r), "\(text)") }
        }
    }

    @Test func aRecordCutAtEveryByteNeitherCrashesNorInventsAField() {
        let text = #"{"type":"navigation","action":"push","params":{"a":"b\"c","d":[1,2,{"e":null}]},"screen":"X"}"#
        let bytes = Array(text.utf8)
        for end in 0...bytes.count {
            Array(bytes[0..<end]).withUnsafeBufferPointer { b in
                let r = PluginRecord(bytes: b, seq: 0)
                // Only whole members are read: the screen only once `"X"` and what follows it are in.
                if let screen = r[.screen] { #expect(end >= bytes.count - 1 && screen.isString("X")) }
                _ = r.field("d")
            }
        }
    }

    @Test func timesAreReadAsSecondsWithAndWithoutOffsets() {
        withRecord(#"{"ts":"2026-11-21T13:44:59.5Z","_rt":"2026-11-21T13:45:00Z"}"#) { r in
            #expect(r.seconds == 1_795_268_699.5)
        }
        withRecord(#"{"_rt":"2026-11-21T14:45:00+01:00"}"#) { r in #expect(r.seconds == 1_795_268_700) }
    }

    @Test func theWriterKeepsKeyOrderEscapesStringsAndWritesNumbersExactly() throws {
        var out = JSONObjectWriter()
        out.string("z", "quote \" backslash \\ newline \n tab \t bell \u{07} é")
        out.number("a", 2.089)
        out.number("b", 0.05)
        out.number("c", 2.0)
        out.number("d", -0.5)
        out.number("e", UInt64.max)
        out.number("f", -42)
        out.bool("g", false)
        out.null("h")
        out.raw("i", Array(#"{"x":[1]}"#.utf8))
        let text = String(decoding: out.bytes, as: UTF8.self)
        #expect(
            text
                == #"{"z":"quote \" backslash \\ newline \n tab \t bell \u0007 é","a":2.089,"b":0.05,"c":2,"d":-0.5,"e":18446744073709551615,"f":-42,"g":false,"h":null,"i":{"x":[1]}}"#
        )
        let object = try #require(try JSONSerialization.jsonObject(with: Data(out.bytes)) as? [String: Any])
        #expect(object["z"] as? String == "quote \" backslash \\ newline \n tab \t bell \u{07} é")
        #expect(JSONObjectWriter().bytes == Array("{}".utf8))
    }

    @Test func sessionsAreOneWhateverTheSpellingAndTwoAcrossApps() {
        let a = withRecord(#"{"app":"com.a","session":"s1"}"#) { SessionID($0) }
        let b = withRecord(#"{"app":"com.\u0061","session":"s1"}"#) { SessionID($0) }
        let c = withRecord(#"{"app":"com.b","session":"s1"}"#) { SessionID($0) }
        let d = withRecord(#"{"app":"com.as","session":"1"}"#) { SessionID($0) }
        #expect(a == b)
        #expect(a != c)
        #expect(a != d)
    }

    /// For any order of sessions seen, the bounded sessions hold exactly what a plain model
    /// holds: at most the limit, the least recently seen tenth forgotten past it, and each kept
    /// session's own state (with a state that owns storage, as plugins' states do).
    @Test(arguments: 0..<40)
    func boundedSessionsKeepWhatAModelKeeps(seed: UInt64) {
        var random = seed &* 0x9E37_79B9_7F4A_7C15 &+ 1
        func next(_ n: Int) -> Int {
            random = random &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((random >> 33) % UInt64(n))
        }
        let limit = 1 + next(60)
        var sessions = BoundedSessions<[String]>(limit: limit)
        var model: [Int: (state: [String], seen: UInt64)] = [:]
        let ids = (0..<(limit * 3)).map { i in withRecord(#"{"app":"a","session":"\#(i)"}"#) { SessionID($0) } }
        for step in 0..<600 {
            let i = next(ids.count)
            let seq = UInt64(step + 1)
            sessions.with(ids[i], seq: seq, make: { [] }) { $0.append("\(seq)") }
            if model[i] == nil, model.count == limit {
                let cut = model.values.map(\.seen).sorted()[min(limit / 10, model.count - 1)]
                model = model.filter { $0.value.seen > cut }
            }
            model[i, default: ([], 0)].state.append("\(seq)")
            model[i]!.seen = seq
            #expect(sessions.count == model.count, "seed \(seed), step \(step)")
            for (j, kept) in model {
                guard let slot = sessions.slots[ids[j]] else {
                    Issue.record("seed \(seed), step \(step): session \(j) was forgotten")
                    continue
                }
                #expect(sessions.entries[slot].state == kept.state, "seed \(seed), step \(step), session \(j)")
                #expect(sessions.entries[slot].seen == kept.seen)
            }
        }
    }

    /// Fields found as they are asked for, in any order, are the fields one full pass finds,
    /// whatever the record (duplicates, escapes, nesting, cut short).
    @Test func fieldsFoundOnDemandAreThoseOfAFullPass() {
        let text =
            #"{"_seq":4,"type":"lifecycle","params":{"type":"x","s":"}\"{"},"screen":"A","ty\u0070e":"dup","status":"didAppear","app":"a","session":"s","ts":"2026-11-21T13:44:59Z","_rt":"2026-11-21T13:45:00Z","_pid":1}"#
        let bytes = Array(text.utf8)
        let index = UnsafeMutablePointer<RecordFieldIndex>.allocate(capacity: 1)
        index.initialize(to: RecordFieldIndex())
        defer { index.deallocate() }
        var orders = [RecordField.allCases, RecordField.allCases.reversed()]
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20 { orders.append(RecordField.allCases.shuffled(using: &generator)) }
        for end in [bytes.count] + Array(stride(from: 0, to: bytes.count, by: 7)) {
            Array(bytes[0..<end]).withUnsafeBufferPointer { b in
                let eager = PluginRecord(bytes: b, seq: 4)
                for order in orders {
                    let lazy = PluginRecord(bytes: b, seq: 4, index: index)
                    for field in order {
                        #expect(
                            lazy[field]?.raw.elementsEqual(eager[field]?.raw ?? .init(start: nil, count: 0))
                                ?? (eager[field] == nil), "\(field) cut at \(end)")
                    }
                }
            }
        }
    }

    /// A stored record is derived exactly when `_origin` leads its trusted fields, and the lazy
    /// index says so without reading past the app's fields.
    @Test func derivedRecordsAreToldByTheirFirstTrustedField() {
        let index = UnsafeMutablePointer<RecordFieldIndex>.allocate(capacity: 1)
        index.initialize(to: RecordFieldIndex())
        defer { index.deallocate() }
        let cases = [
            (
                #"{"_seq":9,"type":"screen","name":"A","_origin":"screen-tracking","_pipeline":"screens","_cause":3,"_rt":"x"}"#,
                true
            ),
            (#"{"_seq":9,"type":"screen","name":"A","_rt":"2026-11-21T13:45:00Z","_pid":1,"_comm":"app"}"#, false),
            (#"{"_seq":9,"type":"screen","name":"_origin","_rt":"x"}"#, false),
        ]
        for (text, derived) in cases {
            Array(text.utf8).withUnsafeBufferPointer { b in
                let lazy = PluginRecord(bytes: b, seq: 9, index: index)
                #expect(lazy.isDerived == derived, "\(text)")
                #expect(lazy.has(.type, "screen") && lazy.string(.name) != nil)
                #expect(PluginRecord(bytes: b, seq: 9).isDerived == derived)
            }
        }
    }

    /// The end of a record as whend stores it tells a derived record from an app's in a few
    /// bytes; any other end (or an app's field that looks like a tail) is left to the scan, and
    /// both always agree with it.
    @Test func derivedRecordsAreToldByTheirTailAsByAScan() {
        let rt = #""_rt":"2026-11-21T13:45:00.123456Z""#
        let cases: [(String, Bool?)] = [
            (
                #"{"_seq":9,"type":"screen","_origin":"screen-tracking","_pipeline":"screens","_cause":3,"# + rt + "}",
                true
            ),
            (#"{"_seq":9,"type":"lifecycle","# + rt + #","_pid":1,"_uid":0,"_gid":0,"_comm":"app"}"#, false),
            (#"{"_seq":9,"type":"when","# + rt + #","_pid":1,"_uid":0,"_gid":0}"#, false),
            // A process name that spells a derived record's tail, escaped as stored.
            (
                #"{"_seq":9,"type":"when","# + rt
                    + #","_pid":1,"_uid":0,"_gid":0,"_comm":"a\",\"_cause\":1,\"_rt\":\"2026-11-21T13:45:00Z"}"#,
                false
            ),
            (#"{"_seq":9,"type":"when","# + rt + #","_pid":1,"_uid":0,"_gid":0,"_comm":"x\\"}"#, false),
            // Nested look-alikes, and ends whend does not write: the scan decides.
            (#"{"_seq":9,"type":"when","params":{"_cause":1,"_rt":"2026-11-21T13:45:00Z"}}"#, nil),
            (#"{"_seq":9,"type":"when","params":{"k":1,"_gid":2}}"#, nil),
            (#"{"_seq":9,"type":"when","params":{"_comm":"x"},"# + rt + "}", nil),
            (#"{"_seq":9,"type":"when"}"#, nil),
        ]
        for (text, tail) in cases {
            Array(text.utf8).withUnsafeBufferPointer { b in
                #expect(derivedByLayoutTail(b) == tail, "\(text)")
                var index = RecordFieldIndex()
                let scanned = index.isDerived(in: b)
                #expect(tail == nil || tail == scanned, "\(text)")
                #expect(PluginRecord(bytes: b, seq: 9).isDerived == scanned)
            }
        }
    }
}
