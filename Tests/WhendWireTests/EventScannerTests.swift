import Foundation
import Testing
import WhendRecord
import WhendWire

/// Scans `line` as a non-first line, returning the error code or nil if accepted.
func code(_ line: String, first: Bool = false) -> WireErrorCode? {
    let bytes = Array(line.utf8)
    return bytes.withUnsafeBufferPointer { buffer -> WireErrorCode? in
        do {
            _ = try EventScanner.scan(buffer, helloAllowed: first)
            return nil
        } catch let error as WireError {
            return error.code
        } catch {
            return nil
        }
    }
}

func scanned(_ bytes: [UInt8], first: Bool = false) throws(WireError) -> ScannedLine {
    do {
        return try bytes.withUnsafeBufferPointer { try EventScanner.scan($0, helloAllowed: first) }
    } catch let error as WireError {
        throw error
    } catch {
        fatalError("unreachable: the scanner throws WireError only")
    }
}

/// The stored body for an event line, as the daemon would write it (trusted fields included).
func body(_ line: String, hello: Hello = Hello(), comm: String = "app-bin") throws -> (String, DedupKey?) {
    let bytes = Array(line.utf8)
    guard case .event(let event) = try scanned(bytes) else { throw WireError(.invalidJSON, "not an event") }
    var encoder = RecordEncoder(credentials: PeerCredentials(pid: 42, uid: 1000, gid: 100, comm: comm), hello: hello)
    var out: [UInt8] = []
    let key = bytes.withUnsafeBufferPointer { encoder.appendBody(of: event, line: $0, to: &out) }
    return ("{\"_seq\":1," + String(decoding: out, as: UTF8.self), key)
}

func object(_ json: String) throws -> [String: Any] {
    try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
}

@Suite struct EventScannerTests {
    @Test func acceptsEveryEventType() {
        #expect(
            code(#"{"type":"lifecycle","screen":"Home","status":"willAppear","isBeingPresentedInitially":true}"#) == nil
        )
        #expect(code(#"{"type":"when","name":"userTapsChangeEmailButton"}"#) == nil)
        #expect(code(#"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"a@example.com"}}}"#) == nil)
        #expect(code(#"{"type":"navigation","action":"push","screen":"Detail","params":{"id":1}}"#) == nil)
        #expect(code(#"{"type":"navigation","action":"dismiss"}"#) == nil)
        #expect(code(#"{"type":"screen","name":"Home"}"#) == nil)
        #expect(code(#"{"type":"error","message":"boom","fatal":true,"stack":["a","b"]}"#) == nil)
        #expect(code(#"{ "type" : "when" , "name" : "x", "extra": [1, 2.5e3, null, {"k": "v"}] }"#) == nil)
    }

    @Test func framingLevelCodes() {
        #expect(code("not json") == .invalidJSON)
        #expect(code(#"{"type":"when","name":"x""#) == .invalidJSON)
        #expect(code(#"{"type":"when","name":"x"} trailing"#) == .invalidJSON)
        #expect(code(#"{"type":"when","name":"x\q"}"#) == .invalidJSON)
        #expect(code(#"[1,2]"#) == .notAnObject)
        #expect(code(#""just a string""#) == .notAnObject)
        #expect(code("   ") == nil)  // blank: ignored
        let invalidUTF8: [UInt8] = Array(#"{"type":"when","name":"x","p":""#.utf8) + [0xC3, 0x28] + Array(#""}"#.utf8)
        do { _ = try scanned(invalidUTF8) } catch { #expect(error.code == .invalidUTF8) }
        // Overlong encoding and surrogates are not UTF-8 either.
        for bad: [UInt8] in [[0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80]] {
            let line = Array(#"{"type":"screen","name":""#.utf8) + bad + Array(#""}"#.utf8)
            do { _ = try scanned(line); Issue.record("accepted \(bad)") } catch { #expect(error.code == .invalidUTF8) }
        }
    }

    @Test func deepNestingIsAnErrorNotACrash() {
        let deep =
            #"{"type":"when","name":"x","context":"# + String(repeating: "[", count: 20_000)
            + String(repeating: "]", count: 20_000) + "}"
        #expect(code(deep) == .invalidJSON)
    }

    @Test func fieldRules() {
        #expect(code(#"{"name":"x"}"#) == .missingField)
        #expect(code(#"{"type":7}"#) == .invalidField)
        #expect(code(#"{"type":"click"}"#) == .unknownType)
        #expect(code(#"{"type":"lifecycle","status":"didAppear"}"#) == .missingField)
        #expect(code(#"{"type":"lifecycle","screen":"A","status":"gone"}"#) == .invalidField)
        #expect(
            code(#"{"type":"lifecycle","screen":"A","status":"didDisappear","isBeingPresentedInitially":true}"#)
                == .invalidField)
        #expect(
            code(#"{"type":"lifecycle","screen":"A","status":"willAppear","isBeingRemovedIndefinitely":true}"#)
                == .invalidField)
        #expect(
            code(#"{"type":"lifecycle","screen":"A","status":"willAppear","isBeingRemovedIndefinitely":false}"#) == nil)
        #expect(code(#"{"type":"lifecycle","screen":"","status":"willAppear"}"#) == .invalidField)
        #expect(code(#"{"type":"when"}"#) == .missingField)
        #expect(code(#"{"type":"when","name":"9lives"}"#) == .invalidField)
        #expect(code(#"{"type":"when","name":"x","when":{"y":{}}}"#) == .invalidField)
        #expect(code(#"{"type":"when","when":{"a":{},"b":{}}}"#) == .invalidField)
        #expect(code(#"{"type":"when","when":{"a":1}}"#) == .invalidField)
        #expect(code(#"{"type":"when","name":"x","params":[1]}"#) == .invalidField)
        #expect(code(#"{"type":"navigation","action":"push"}"#) == .missingField)
        #expect(code(#"{"type":"navigation","action":"fly","screen":"A"}"#) == .invalidField)
        #expect(code(#"{"type":"screen"}"#) == .missingField)
        #expect(code(#"{"type":"error"}"#) == .missingField)
        #expect(code(#"{"type":"error","message":"m","stack":[1]}"#) == .invalidField)
        #expect(code(#"{"type":"error","message":"m","fatal":"yes"}"#) == .invalidField)
        #expect(code(#"{"type":"screen","name":"A","app":""}"#) == .invalidField)
        #expect(
            code(#"{"type":"screen","name":"A","session":"\#(String(repeating: "s", count: 129))"}"#) == .invalidField)
        #expect(code(#"{"type":"screen","name":"A","id":"\#(String(repeating: "i", count: 128))"}"#) == nil)
        #expect(code(#"{"type":"screen","name":"A","ts":"yesterday"}"#) == .invalidField)
        #expect(code(#"{"type":"screen","name":"A","ts":"2026-11-21T13:35:00.5+01:00"}"#) == nil)
        #expect(code(#"{"type":"screen","name":"A","context":"x"}"#) == .invalidField)
        #expect(code(#"{"type":"screen","name":"A","name":"B"}"#) == .invalidField)  // duplicate key
    }

    @Test func reservedFieldsCannotBeForged() {
        #expect(code(#"{"type":"screen","name":"A","_seq":1}"#) == .reservedField)
        #expect(code(#"{"type":"screen","name":"A","_pid":1}"#) == .reservedField)
        // An escaped underscore is still an underscore.
        #expect(code(#"{"type":"screen","name":"A","\u005fuid":0}"#) == .reservedField)
        // Nested keys are the client's own business.
        #expect(code(#"{"type":"screen","name":"A","context":{"_private":1}}"#) == nil)
    }

    @Test func hello() throws {
        guard
            case .hello(let hello) = try scanned(
                Array(#"{"hello":{"protocol":1,"app":"com.x","session":"s","acks":true}}"#.utf8), first: true)
        else {
            Issue.record("not a hello")
            return
        }
        #expect(hello == Hello(app: Array("com.x".utf8), session: Array("s".utf8), acks: true))
        #expect(code(#"{"hello":{"protocol":1}}"#, first: false) == .misplacedHello)
        #expect(code(#"{"hello":{"protocol":2}}"#, first: true) == .unsupportedProtocol)
        // An object with hello and another key is an event, not a hello.
        #expect(code(#"{"hello":{},"type":"screen","name":"A"}"#, first: true) == nil)
    }

    @Test func codableFormIsStoredAsNameAndParams() throws {
        let (stored, _) = try body(#"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"a@example.com"}}}"#)
        let record = try object(stored)
        #expect(record["name"] as? String == "userTypesNewEmail")
        #expect((record["params"] as? [String: String]) == ["userEmail": "a@example.com"])
        #expect(record["when"] == nil)
        let (plain, _) = try body(#"{"type":"when","name":"userTapsChangeEmailButton"}"#)
        #expect((try object(plain)["params"] as? [String: Any])?.isEmpty == true)
    }

    @Test func defaultsAndTrustedFields() throws {
        let (stored, key) = try body(#"{"type":"screen","name":"A","id":"e1"}"#, comm: "mail-app")
        let record = try object(stored)
        #expect(record["app"] as? String == "mail-app")
        #expect(record["session"] == nil)
        #expect(record["_pid"] as? Int == 42)
        #expect(record["_uid"] as? Int == 1000)
        #expect(record["_gid"] as? Int == 100)
        #expect(record["_comm"] as? String == "mail-app")
        let rt = try #require(record["_rt"] as? String)
        #expect(rt.count == 27 && rt.hasSuffix("Z"))
        #expect(key == DedupKey(app: Array("mail-app".utf8), session: nil, id: Array("e1".utf8)))

        let hello = Hello(app: Array("com.x".utf8), session: Array("s9".utf8), acks: true)
        let (withHello, helloKey) = try body(#"{"type":"screen","name":"A","id":"e1"}"#, hello: hello)
        let r2 = try object(withHello)
        #expect(r2["app"] as? String == "com.x")
        #expect(r2["session"] as? String == "s9")
        #expect(helloKey == DedupKey(app: Array("com.x".utf8), session: Array("s9".utf8), id: Array("e1".utf8)))
        // The event's own app wins over the hello's.
        let (own, _) = try body(#"{"type":"screen","name":"A","app":"mine"}"#, hello: hello)
        #expect(try object(own)["app"] as? String == "mine")
    }

    @Test func storedRecordScan() throws {
        let (stored, _) = try body(#"{"type":"when","name":"x","app":"a\"b","session":"s","id":"7"}"#)
        let record = try Array(stored.utf8).withUnsafeBufferPointer { try StoredRecord.scan($0) }
        #expect(record.seq == 1)
        #expect(record.type == "when")
        #expect(record.app == Array("a\"b".utf8))
        #expect(record.session == Array("s".utf8))
        #expect(record.receivedMicros != nil)
    }

    @Test func rfc3339() {
        #expect(RFC3339.parse(Array("1970-01-01T00:00:01.5Z".utf8))?.microseconds == 1_500_000)
        #expect(RFC3339.parse(Array("1970-01-01T01:00:00+01:00".utf8))?.microseconds == 0)
        #expect(RFC3339.parse(Array("2026-11-21T13:44:59.546458Z".utf8))?.microseconds == 1_795_268_699_546_458)
        #expect(RFC3339.parse(Array("2026-11-21T13:44:59Z trailing".utf8)) == nil)
        #expect(!isRFC3339(Array("2026-13-01T00:00:00Z".utf8)))
    }
}

@Suite struct LineFramerTests {
    func pieces(_ chunks: [String], max: Int = 10) -> [String] {
        var framer = LineFramer(maxLineBytes: max)
        var out: [String] = []
        for chunk in chunks {
            Array(chunk.utf8).withUnsafeBufferPointer { buffer in
                framer.feed(buffer) { piece in
                    switch piece {
                    case .line(let l): out.append(String(decoding: l, as: UTF8.self))
                    case .tooLarge(let n): out.append("<too large \(n)>")
                    }
                }
            }
        }
        framer.finish { piece in
            if case .line(let l) = piece { out.append("final:" + String(decoding: l, as: UTF8.self)) }
        }
        return out
    }

    @Test func splitsAcrossChunks() {
        #expect(pieces(["ab", "c\nde", "f\n"]) == ["abc", "def"])
        #expect(pieces(["0123456789\r\n"]) == ["0123456789\r"])  // \r does not count
    }

    @Test func oversizedLineIsSkippedAndTheStreamGoesOn() {
        #expect(pieces(["0123456789A\nok\n"]) == ["<too large 11>", "ok"])
        #expect(pieces(["01234", "56789", "ABCDE", "FG\nok\n"]) == ["<too large 17>", "ok"])
    }

    @Test func finalLineWithoutNewline() {
        #expect(pieces(["a\nlast"]) == ["a", "final:last"])
    }
}

@Suite struct JSONScannerTests {
    /// The scanner skips eight bytes at a time; a quote, a backslash or a control character at
    /// any position of any window must still be seen.
    @Test func specialBytesAreFoundAtEveryPosition() {
        for length in 0..<40 {
            for position in 0..<max(1, length) {
                for special: [UInt8] in [[0x5C, 0x22], [0x5C, 0x6E], [0x01], [0x1F], [0xC3, 0xA9]] {
                    var inner = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    if length > 0 { inner.replaceSubrange(position..<position + 1, with: special) }
                    let line = Array(#"{"type":"screen","name":""#.utf8) + inner + Array(#""}"#.utf8)
                    let accepted = line.withUnsafeBufferPointer {
                        (try? EventScanner.scan($0, helloAllowed: false)) != nil
                    }
                    let isControl = special.count == 1
                    // An empty name is refused for its length; a raw control byte as invalid JSON.
                    #expect(
                        accepted == (length > 0 && !isControl), "length \(length), position \(position), \(special)")
                }
            }
        }
        // An unescaped quote ends the string early: what follows is not JSON.
        let early = Array(#"{"type":"screen","name":"abcdefghij"klmnop"}"#.utf8)
        #expect(early.withUnsafeBufferPointer { (try? EventScanner.scan($0, helloAllowed: false)) == nil })
    }
}

@Suite struct LeadingBlankTests {
    /// Blanks before the object are allowed; the stored record must still be the event's own
    /// fields, byte for byte.
    @Test func leadingBlanksDoNotShiftWhatIsStored() throws {
        let (stored, key) = try body("  \t {\"type\":\"screen\",\"name\":\"Home\",\"id\":\"e\\u0031\",\"app\":\"a\"}\r")
        let record = try object(stored)
        #expect(record["type"] as? String == "screen")
        #expect(record["name"] as? String == "Home")
        #expect(record["id"] as? String == "e1")
        #expect(key == DedupKey(app: Array("a".utf8), session: nil, id: Array("e1".utf8)))
    }
}

@Suite struct SipHashTests {
    /// The reference vector of SipHash-1-3-128 would need the reference key schedule; what whend
    /// relies on is that a digest does not depend on how the bytes were split, nor on the process.
    @Test func theDigestDependsOnTheBytesOnlyNotOnHowTheyWereWritten() {
        let bytes = (0..<100).map { UInt8($0 * 7 & 0xFF) }
        var whole = SipHash128()
        whole.write(bytes)
        for split in 0...bytes.count {
            var parts = SipHash128()
            parts.write(Array(bytes[..<split]))
            parts.write(Array(bytes[split...]))
            #expect(parts.finalize() == whole.finalize(), "split at \(split)")
        }
        var other = SipHash128()
        other.write(Array(bytes.dropLast()) + [bytes.last! ^ 1])
        #expect(other.finalize() != whole.finalize())
        // Fixed across processes and builds: a saved digest must still find its session.
        let pinned = whole.finalize()
        #expect("\(String(pinned.0, radix: 16)) \(String(pinned.1, radix: 16))" == "e5e2bbd1f1caaf5 a1778c7c67180e56")
    }
}

@Suite struct DerivedRecordBuilderTests {
    private func stored(_ output: String, pipeline: String? = nil) throws -> String {
        try stored(Array(output.utf8), pipeline: pipeline)
    }

    private func stored(_ output: [UInt8], pipeline: String? = nil) throws -> String {
        var builder = DerivedRecordBuilder(pipeline: pipeline)
        var out: [UInt8] = [UInt8(ascii: "{")]
        try output.withUnsafeBufferPointer { (json) throws(WireError) in
            try builder.appendBody(
                json, origin: "p", cause: 7, receivedAt: Array("2026-01-01T00:00:00Z".utf8), to: &out)
        }
        return String(decoding: out, as: UTF8.self)
    }

    @Test func aPluginsRecordIsStoredCompactWithoutItsUnderscoreMembersAndWithWhendsOwn() throws {
        let trusted = #""_origin":"p","_cause":7,"_rt":"2026-01-01T00:00:00Z"}"#
        // Compact runs, spaces around colons and commas, a trusted member first, between and
        // last, nested values with spaces: the same bytes whichever way a plugin writes.
        let cases = [
            (#"{"type":"x","a":1,"b":[1, 2],"c":"d"}"#, #"{"type":"x","a":1,"b":[1,2],"c":"d","#),
            (
                #"{ "type" : "x" , "a":1,"_seq":5,"b":{"k": 2},"c" :"d","_rt":"no" }"#,
                #"{"type":"x","a":1,"b":{"k":2},"c":"d","#
            ),
            (#"{"_origin":"me","type":"x","a":1}"#, #"{"type":"x","a":1,"#),
            (#"{"a":1,"type":"x","_pid":1}"#, #"{"a":1,"type":"x","#),
            ("{\"a\":1,\n\"type\":\"x\",\"z\":null}", #"{"a":1,"type":"x","z":null,"#),
        ]
        for (output, kept) in cases { #expect(try stored(output) == kept + trusted, "\(output)") }
        #expect(try stored(#"{"type":"x"}"#, pipeline: "q").hasPrefix(#"{"type":"x","_origin":"p","_pipeline":"q","#))
    }

    @Test func aRecordWithoutATypeOrNotJSONIsRefused() {
        for bad in [#"{"a":1}"#, #"{"type":1}"#, #"{"type":"x""#, #"{"type":"x"} x"#] {
            #expect(throws: WireError.self, "\(bad)") { try stored(bad) }
        }
        #expect(throws: WireError.self) { try stored(Array(#"{"type":""#.utf8) + [0xFF, 0x22, 0x7D]) }
    }
}
