import Testing
import WhendTrackingPlan
import WhendWire

/// A plan file as whend reads it: what it refuses (with the line), and what it says of events.
@Suite struct TrackingPlanTests {
    static let plan = """
        {
          "events": {
            "userTypesNewEmail": {
              "type": "object",
              "properties": {"userEmail": {"type": "string", "pattern": "^[^@]+@[^@]+$"}},
              "required": ["userEmail"],
              "additionalProperties": false
            },
            "cartChanged": {
              "type": "object",
              "properties": {"items": {"type": "array", "items": {"type": "object",
                "properties": {"price": {"type": "number", "minimum": 0}}}}}
            }
          },
          "screens": {"names": ["Home", "Settings"], "patterns": ["^Product/[0-9]+$"]},
          "apps": {"legacy": {"unplannedEvents": "allow", "screens": {"patterns": [".*"]}}}
        }
        """

    func check(_ line: String, plan text: String = Self.plan, app: String? = nil) throws -> PlanViolation? {
        let plan = try TrackingPlan.parse(Array(text.utf8))
        let bytes = Array(line.utf8)
        return try bytes.withUnsafeBufferPointer { buffer in
            guard case .event(let event) = try EventScanner.scan(buffer, helloAllowed: false) else {
                throw TestError.notAnEvent
            }
            let defaultApp = app.map { Array($0.utf8) }
            return defaultApp.withUnsafeBufferPointerIfAny {
                plan.check(
                    PlanSubject(type: event.type, fields: event.planFields, codableWhen: event.codableWhen), in: buffer,
                    defaultApp: $0)
            }
        }
    }

    enum TestError: Error { case notAnEvent }

    @Test func anEventThatKeepsToThePlanPasses() throws {
        #expect(
            try check(#"{"type":"when","name":"userTypesNewEmail","params":{"userEmail":"a@b.c"},"screen":"Home"}"#)
                == nil)
        #expect(try check(#"{"type":"when","when":{"cartChanged":{"items":[{"price":2}]}}}"#) == nil)
        #expect(try check(#"{"type":"screen","name":"Product/12"}"#) == nil)
        #expect(try check(#"{"type":"lifecycle","screen":"Settings","status":"didAppear"}"#) == nil)
    }

    @Test func aViolationNamesItsPathAndRule() throws {
        let pattern = try #require(
            try check(#"{"type":"when","name":"userTypesNewEmail","params":{"userEmail":"nobody"}}"#))
        #expect(
            pattern.rule == .pattern && pattern.path == "$.params.userEmail" && pattern.event == "userTypesNewEmail")
        let deep = try #require(
            try check(#"{"type":"when","when":{"cartChanged":{"items":[{"price":1},{"price":-1}]}}}"#))
        #expect(deep.rule == .minimum && deep.path == "$.params.items[1].price")
        let extra = try #require(
            try check(#"{"type":"when","name":"userTypesNewEmail","params":{"userEmail":"a@b","a b":1}}"#))
        #expect(extra.rule == .additionalProperties && extra.path == #"$.params["a b"]"#)
        let missing = try #require(try check(#"{"type":"when","name":"userTypesNewEmail"}"#))
        #expect(missing.rule == .required && missing.path == "$.params")
        let unplanned = try #require(try check(#"{"type":"when","name":"somethingElse"}"#))
        #expect(unplanned.rule == .event && unplanned.path == "$.name")
        let screen = try #require(try check(#"{"type":"navigation","action":"push","screen":"Nowhere"}"#))
        #expect(screen.rule == .screen && screen.path == "$.screen" && screen.event == "navigation")
        let screenEvent = try #require(try check(#"{"type":"screen","name":"Product/x"}"#))
        #expect(screenEvent.rule == .screen && screenEvent.path == "$.name")
    }

    @Test func anAppsSectionReplacesWhatItSets() throws {
        // The event's own app, then the connection's: legacy may send anything, anywhere.
        #expect(try check(#"{"type":"when","name":"somethingElse","app":"legacy","screen":"Nowhere"}"#) == nil)
        #expect(try check(#"{"type":"when","name":"somethingElse","screen":"Nowhere"}"#, app: "legacy") == nil)
        // Its events are the plan's: it inherits them.
        #expect(
            try check(#"{"type":"when","name":"userTypesNewEmail","params":{},"app":"legacy"}"#)?.rule == .required)
        #expect(try check(#"{"type":"when","name":"somethingElse","app":"other"}"#)?.rule == .event)
    }

    @Test func escapedFieldsAreReadDecoded() throws {
        #expect(
            try check(#"{"type":"when","name":"user\u0054ypesNewEmail","params":{"user\u0045mail":"a\u0040b"}}"#) == nil
        )
        #expect(try check(#"{"type":"screen","name":"H\u006fme"}"#) == nil)
    }

    /// A plan that does not parse is refused with its line and why.
    @Test(arguments: [
        ("{\n  \"events\": {\n    \"a\": {\"type\": \"strng\"}\n  }\n}", 3, "not a type"),
        (
            "{\n  \"events\": {\n    \"a\": {\"format\": \"email\"}\n  }\n}", 3,
            "\"format\" is not a keyword whend checks"
        ),
        ("{\n  \"events\": {\n    \"a\": {\"pattern\": \"\\\\d+\"}\n  }\n}", 3, "ECMA-262"),
        ("{\n  \"events\": {\n    \"a\": {\"pattern\": \"(a\"}\n  }\n}", 3, "a ( is not closed"),
        ("{\n  \"events\": {\n    \"a\": {\"enum\": [[1]]}\n  }\n}", 3, "compares strings, numbers"),
        ("{\n  \"events\": {\n    \"bad-name\": {}\n  }\n}", 3, "is not a When name"),
        ("{\n  \"events\": {},\n  \"screens\": [\"Home\"]\n}", 3, "screens:"),
        ("{\n  \"events\": {\n    \"a\": {\"type\": \"object\",\n}\n  }\n}", 4, "not JSON"),
        ("{\"evnts\": {}}", 1, "\"evnts\" is not part of a plan"),
    ])
    func aPlanThatDoesNotParseIsRefusedWithItsLine(text: String, line: Int, reason: String) {
        #expect {
            _ = try TrackingPlan.parse(Array(text.utf8))
        } throws: { error in
            guard let error = error as? PlanError else { return false }
            return error.line == line && error.reason.contains(reason)
        }
    }

    @Test func lengthsCountCharactersNotBytes() throws {
        let plan = #"{"events":{"e":{"type":"string","minLength":2,"maxLength":2}}}"#
        let compiled = try TrackingPlan.parse(Array(plan.utf8))
        func passes(_ json: String) -> Bool {
            Array(json.utf8).withUnsafeBufferPointer { compiled.check(params: $0, event: "e") } == nil
        }
        #expect(passes(#""é😀""#))
        #expect(passes(#""\ud83d\ude00a""#))
        #expect(!passes(#""\ud83d\ude00""#))
        #expect(!passes(#""abc""#))
    }
}

extension Optional where Wrapped == [UInt8] {
    func withUnsafeBufferPointerIfAny<R>(_ body: (UnsafeBufferPointer<UInt8>?) throws -> R) rethrows -> R {
        guard let self else { return try body(nil) }
        return try self.withUnsafeBufferPointer { try body($0) }
    }
}
