import Foundation
import Testing
import WhendTrackingPlan
import WhendWire

@testable import WhendTrackingPlan

/// What an outside attack on the plan found: patterns that cost whend its memory or every
/// connection's ingest, counts labelled by names clients choose, long number literals judged
/// as NaN, and generated names that all collided in the event table.
@Suite struct HostilePlanTests {
    let check = TrackingPlanTests().check

    @Test func patternsWhoseRepetitionsExpandPastTheBoundAreRefused() throws {
        for pattern in [#"(a{1,1000}){1,1000}"#, #"(.{1,1000}){1,100}$"#, #"x{5000}"#, #"((a{100}){100}){100}"#] {
            let plan = #"{"events":{"e":{"properties":{"p":{"type":"string","pattern":"\#(pattern)"}}}}}"#
            #expect(throws: PlanError.self, "\(pattern)") { try TrackingPlan.parse(Array(plan.utf8)) }
            let screens = #"{"events":{},"screens":{"patterns":["\#(pattern)"]}}"#
            #expect(throws: PlanError.self, "\(pattern)") { try TrackingPlan.parse(Array(screens.utf8)) }
        }
        // What real plans write stays well inside it.
        for pattern in [
            #"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"#, #"^[0-9]{1,255}$"#,
            #"^[^@]{1,64}@[^@]{1,255}$"#, #"^(ab){2,}$"#, #"^a*?b+$"#, #"(a*)*"#,
        ] {
            let plan = #"{"events":{"e":{"properties":{"p":{"type":"string","pattern":"\#(pattern)"}}}}}"#
            _ = try TrackingPlan.parse(Array(plan.utf8))
        }
        #expect(Pattern.expandedSize(of: "(a{1,1000}){1,1000}") == 1_000_000)
        #expect(Pattern.expandedSize(of: "^[0-9]{3}-[0-9]{4}$") == 8)
        // Capped, however deep: no overflow.
        #expect(Pattern.expandedSize(of: "(((((a{1000}){1000}){1000}){1000}){1000}){1000}") == 1 << 40)
    }

    /// What the C library reads otherwise than ECMA-262 is refused, so that a plan means one
    /// thing to its author and to whend: GNU's anchors `\<` `\>` `\`` `\'`, `{,n}`, and a
    /// repetition of a repetition (`^\<b$` matched "b" and not "<b").
    @Test func whatTheTwoDialectsReadOtherwiseIsRefused() throws {
        for pattern in [#"^\\<b$"#, #"\\>"#, #"\\`"#, #"\\'"#, #"a{,3}"#, #"a**"#, #"a{1}{2}"#, #"a+*"#] {
            let plan = #"{"events":{"e":{"properties":{"p":{"type":"string","pattern":"\#(pattern)"}}}}}"#
            #expect(throws: PlanError.self, "\(pattern)") { try TrackingPlan.parse(Array(plan.utf8)) }
        }
    }

    @Test func countsAreLabelledOnlyByNamesThePlanChose() throws {
        let plan = #"{"events":{"known":{}},"unplannedEvents":"allow","screens":{"names":["Inbox"]}}"#
        let unplanned = try #require(
            try check(#"{"type":"when","name":"anyName123","screen":"Nope"}"#, plan, nil))
        #expect(unplanned.rule == .screen && !unplanned.planned)
        let known = try #require(try check(#"{"type":"when","name":"known","screen":"Nope"}"#, plan, nil))
        #expect(known.planned && known.event == "known")
        let event = try #require(try check(#"{"type":"when","name":"other"}"#, #"{"events":{}}"#, nil))
        #expect(event.rule == .event && !event.planned)
    }

    @Test func longNumberLiteralsAreNumbers() throws {
        let plan = #"{"events":{"e":{"properties":{"x":{"type":"number","minimum":0},"i":{"type":"integer"}}}}}"#
        let pi = "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899"
        #expect(try check(#"{"type":"when","name":"e","params":{"x":\#(pi)}}"#, plan, nil) == nil)
        let one = "1." + String(repeating: "0", count: 70)
        #expect(try check(#"{"type":"when","name":"e","params":{"i":\#(one)}}"#, plan, nil) == nil)
        let big = "1" + String(repeating: "0", count: 299)
        #expect(try check(#"{"type":"when","name":"e","params":{"x":\#(big)}}"#, plan, nil) == nil)
        #expect(try check(#"{"type":"when","name":"e","params":{"x":-\#(pi)}}"#, plan, nil)?.rule == .minimum)
    }

    /// What `plan infer` proposes is a plan whend takes: more than 64 params always present,
    /// or a number too large for a double, once made a plan it refused or a check that failed.
    @Test func anInferredPlanIsOneWhendTakes() throws {
        var inference = PlanInference()
        let params = (0..<70).map { #""p\#($0)":\#($0)"# }.joined(separator: ",")
        for seq in 1...3 {
            let line = #"{"_seq":\#(seq),"type":"when","name":"wide","params":{\#(params),"huge":1e400},"app":"a"}"#
            Array(line.utf8).withUnsafeBufferPointer { inference.add(record: $0) }
        }
        let text = inference.plan()
        let plan = try TrackingPlan.parse(Array(text.utf8))
        #expect(text.contains(#""huge": {"type": "number"}"#), "\(text)")
        #expect(
            try check(#"{"type":"when","name":"wide","params":{\#(params),"huge":1e400}}"#, text, nil) == nil)
        _ = plan
    }

    /// What a plan cannot name is left unchecked, and said so: a screen or a param named with
    /// half a surrogate pair (no UTF-8 text holds one), and more params than a plan
    /// may list. `plan infer` proposed a plan that `plan check` refused, or that flagged the
    /// very records it came from.
    @Test func anInferredPlanPassesWhatNoPlanCanName() throws {
        var inference = PlanInference()
        let wide = (0..<5000).map { #""p\#($0)":\#($0)"# }.joined(separator: ",")
        let sent = [
            #"{"type":"screen","name":"\ud800"}"#,
            #"{"type":"when","name":"k","params":{"\udc00":1,"plain":"x"}}"#,
            #"{"type":"when","name":"wide","params":{\#(wide)}}"#,
            #"{"type":"when","name":"fine","params":{"a":1},"screen":"Inbox"}"#,
        ]
        for (seq, line) in sent.enumerated() {
            let stored = #"{"_seq":\#(seq + 1),"# + line.dropFirst()
            Array(stored.utf8).withUnsafeBufferPointer { inference.add(record: $0) }
        }
        let (text, notes) = inference.proposal()
        _ = try TrackingPlan.parse(Array(text.utf8))
        for line in sent { #expect(try check(line, text, nil) == nil, "\(line)\n\(text)") }
        #expect(notes.count == 3, "\(notes)")
        // What it can name it still checks.
        #expect(try check(#"{"type":"when","name":"fine","params":{"a":"x"}}"#, text, nil)?.rule == .type)
        #expect(try check(#"{"type":"when","name":"k","params":{"plain":1}}"#, text, nil)?.rule == .type)
        // Named in a violation as it was sent, not as three replacement characters.
        let strict = #"{"events":{"k":{"additionalProperties":false}}}"#
        #expect(try check(sent[1], strict, nil)?.path == #"$.params["\udc00"]"#)
    }

    /// What describes a schema is of the type the plan's own JSON Schema gives it, so that a
    /// plan whend runs keeps to the schema it publishes; a length bound past any string's is
    /// taken (the schema allows any integer).
    @Test func annotationsAreOfTheTypesThePublishedSchemaGives() throws {
        for (annotation, good) in [
            (#""title":1"#, false), (#""examples":1"#, false), (#""deprecated":"yes""#, false),
            (#""$comment":[]"#, false), (#""title":"t""#, true), (#""examples":[1]"#, true),
            (#""readOnly":true"#, true), (#""default":{"a":1}"#, true),
        ] {
            let plan = #"{"events":{"e":{"type":"object",\#(annotation)}}}"#
            if good {
                #expect(throws: Never.self, "\(plan)") { try TrackingPlan.parse(Array(plan.utf8)) }
            } else {
                #expect(throws: PlanError.self, "\(plan)") { try TrackingPlan.parse(Array(plan.utf8)) }
            }
        }
        let huge = #"{"events":{"e":{"properties":{"s":{"type":"string","maxLength":9223372036854775808}}}}}"#
        #expect(try check(#"{"type":"when","name":"e","params":{"s":"any"}}"#, huge, nil) == nil)
        // Notes on the plan, its apps and its screens are text too; numbers a double cannot hold
        // are refused, saying why.
        for plan in [
            #"{"$comment":1,"events":{}}"#, #"{"description":[1],"events":{}}"#, #"{"$schema":null,"events":{}}"#,
            #"{"events":{},"apps":{"a":{"description":null}}}"#, #"{"events":{},"screens":{"description":["a"]}}"#,
            #"{"events":{"e":{"properties":{"s":{"maxLength":1e400}}}}}"#,
        ] {
            #expect(throws: PlanError.self, "\(plan)") { try TrackingPlan.parse(Array(plan.utf8)) }
        }
        let described = #"{"$comment":"c","events":{},"screens":{"description":"ok","$comment":"c","names":["A"]}}"#
        #expect(throws: Never.self) { try TrackingPlan.parse(Array(described.utf8)) }
        do {
            _ = try TrackingPlan.parse(Array(#"{"events":{"e":{"minimum":1e400}}}"#.utf8))
            Issue.record("a minimum of 1e400 was taken")
        } catch {
            #expect(error.reason.contains("2^53"), "\(error)")
        }
    }

    /// An inferred plan that would be over what a plan file may hold leaves out the params of
    /// the events that take most room, and says so: it was written, 19 MB, and `plan check`
    /// then refused it.
    @Test func anInferredPlanFitsInAPlanFile() throws {
        var inference = PlanInference()
        let padding = String(repeating: "x", count: 200)
        let params = (0..<4096).map { #""k\#($0)\#(padding)":\#($0)"# }.joined(separator: ",")
        let sent = (0..<20).map { #"{"type":"when","name":"e\#($0)","params":{\#(params)}}"# }
        for (seq, line) in sent.enumerated() {
            let stored = #"{"_seq":\#(seq + 1),"# + line.dropFirst()
            Array(stored.utf8).withUnsafeBufferPointer { inference.add(record: $0) }
        }
        let (text, notes) = inference.proposal()
        #expect(text.utf8.count <= TrackingPlan.maximumSize)
        _ = try TrackingPlan.parse(Array(text.utf8))
        #expect(notes.count >= 1 && notes.allSatisfy { $0.contains("MiB a plan file may be") }, "\(notes)")
        for line in [sent[0], sent[19]] { #expect(try check(line, text, nil) == nil) }
    }

    @Test func namesAPlanGeneratesDoNotCollide() {
        let names = (0..<20_000).map { Array("userTaps\(String(100_000 + $0).dropFirst())OnButton".utf8) }
        #expect(Set(names.map(EventTable.hash)).count == names.count)
    }

    /// A key twice in one object means one thing to one JSON reader and another to the next: a
    /// plan says each once, wherever the object is. Names that Unicode deems equivalent but
    /// whose bytes differ are two names, to the plan as to whend's check.
    @Test func aPlanSaysEachKeyOnce() throws {
        for plan in [
            #"{"events":{},"events":{}}"#,
            #"{"events":{"e":{},"e":{}}}"#,
            #"{"events":{"e":{"properties":{"p":{},"p":{"type":"string"}}}}}"#,
            #"{"events":{"e":{"type":"object","type":"string"}}}"#,
            #"{"events":{},"apps":{"a":{},"a":{"events":{}}}}"#,
            #"{"events":{},"screens":{"names":["Inbox","Inbox"]}}"#,
            #"{"events":{},"screens":{"names":["Inbox"],"names":["Other"]}}"#,
            #"{"events":{"e":{"properties":{"\u0070":{},"p":{}}}}}"#,
        ] {
            #expect(throws: PlanError.self, "\(plan)") { try TrackingPlan.parse(Array(plan.utf8)) }
        }
        let precomposed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let plan = """
            {"events":{"e":{"properties":{"\(precomposed)":{"type":"string"},"\(decomposed)":{"type":"integer"}}}},
             "screens":{"names":["\(precomposed)"]}}
            """
        #expect(
            try check(#"{"type":"when","name":"e","params":{"\#(precomposed)":"x","\#(decomposed)":1}}"#, plan, nil)
                == nil)
        #expect(try check(#"{"type":"when","name":"e","params":{"\#(decomposed)":"x"}}"#, plan, nil)?.rule == .type)
        #expect(try check(#"{"type":"when","name":"e","screen":"\#(decomposed)"}"#, plan, nil)?.rule == .screen)
    }

    /// `plan infer` keeps apart what whend keeps apart: a param or a screen spelled in two
    /// ways Unicode deems equivalent is two, each with its own counts and types, and the plan
    /// it proposes takes the records it was made from.
    @Test func anInferredPlanKeepsEquivalentSpellingsApart() throws {
        var inference = PlanInference()
        let lines = [
            #"{"_seq":1,"type":"when","name":"e","screen":"caf\u00e9","params":{"caf\u00e9":"x"}}"#,
            #"{"_seq":2,"type":"when","name":"e","screen":"cafe\u0301","params":{"cafe\u0301":2}}"#,
        ]
        for line in lines { Array(line.utf8).withUnsafeBufferPointer { inference.add(record: $0) } }
        let text = inference.plan()
        #expect(text.contains(#""caf\#u{E9}": {"type": "string"}"#), "\(text)")
        #expect(text.contains(#""cafe\#u{301}": {"type": "integer"}"#), "\(text)")
        for line in lines {
            let sent = line.replacingOccurrences(of: #"^\{"_seq":[0-9]+,"#, with: "{", options: .regularExpression)
            #expect(try check(sent, text, nil) == nil, "\(sent)\n\(text)")
        }
        #expect(inference.statistics().components(separatedBy: "\n").filter { $0.contains("present") }.count == 2)
    }

    /// A validator compares integers exactly, whend as doubles: they agree below 2^53, where
    /// doubles hold every integer, and a plan's number beyond it is refused (a maximum of
    /// 9007199254740993 passed 9007199254740994, which rounds to the same double).
    @Test func numbersBeyondExactDoublesAreRefused() throws {
        for schema in [
            #"{"maximum":9007199254740993}"#, #"{"minimum":-9007199254740992}"#, #"{"enum":[1,9007199254740992]}"#,
            #"{"const":1e300}"#, #"{"maximum":9007199254740991.9}"#,
        ] {
            #expect(throws: PlanError.self, "\(schema)") {
                try TrackingPlan.parse(Array(#"{"events":{"e":{"properties":{"v":\#(schema)}}}}"#.utf8))
            }
        }
        let plan = #"{"events":{"e":{"properties":{"v":{"maximum":9007199254740991}}}}}"#
        #expect(try check(#"{"type":"when","name":"e","params":{"v":9007199254740991}}"#, plan, nil) == nil)
        #expect(try check(#"{"type":"when","name":"e","params":{"v":9007199254740993}}"#, plan, nil)?.rule == .maximum)
    }

    /// Found from outside: forms the C library reads otherwise than ECMA-262 and Python's re
    /// (lazy + and {m,n}, which it reads as optional; a repetition after ?; letter escapes; a
    /// lone ')'), and plans whose size costs whend memory or time in all (patterns expanding
    /// to 100,000 positions in all, enums and properties by the thousand).
    @Test func whatOneDialectReadsOtherwiseAndPlansTooLargeAreRefused() throws {
        for pattern in [
            #"^id-[0-9]+?$"#, #"^x{2}?$"#, #"^a?+$"#, #"a?*"#, #"(a)?{2}"#, #"\\Aab"#, #"a\\Z"#, #"\\a"#, #"\\z"#,
            #"^a)$"#, #"^a???$"#, #"a*??"#, #"b*??$"#,
        ] {
            let plan = #"{"events":{"e":{"properties":{"p":{"type":"string","pattern":"\#(pattern)"}}}}}"#
            #expect(throws: PlanError.self, "\(pattern)") { try TrackingPlan.parse(Array(plan.utf8)) }
        }
        for pattern in [#"^a*?$"#, #"^a??$"#, #"^\\.\\+\\??$"#, #"^(a)+$"#, #"^[+?]$"#] {
            let plan = #"{"events":{"e":{"properties":{"p":{"type":"string","pattern":"\#(pattern)"}}}}}"#
            _ = try TrackingPlan.parse(Array(plan.utf8))
        }
        let patterns = (0..<101).map { _ in #""[a-z]{1000}""# }.joined(separator: ",")
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{},"screens":{"patterns":[\#(patterns)]}}"#.utf8))
        }
        let values = (0...4096).map(String.init).joined(separator: ",")
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{"e":{"properties":{"p":{"enum":[\#(values)]}}}}}"#.utf8))
        }
        let properties = (0...4096).map { #""p\#($0)":{}"# }.joined(separator: ",")
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{"e":{"properties":{\#(properties)}}}}"#.utf8))
        }
    }

    /// Found from outside: a `\u` escape of half a surrogate pair decoded as U+FFFD, so an event
    /// sending "\ud800" passed an enum of "\udfff" (two strings to JSON Schema's validators);
    /// bytes of a plan that are not UTF-8 were read as U+FFFD; `"minLength": 1.0`, an integer
    /// to JSON Schema, was refused.
    @Test func halfSurrogatesAndNonCharactersAreNeverAnotherString() throws {
        let plan = #"{"events":{"e":{"properties":{"s":{"enum":["\ufffd","a"]},"t":{"pattern":"^.$"}}}}}"#
        let lone = try #require(try check(#"{"type":"when","name":"e","params":{"s":"\ud800"}}"#, plan, nil))
        #expect(lone.rule == .enum)
        #expect(try check(#"{"type":"when","name":"e","params":{"s":"\ufffd"}}"#, plan, nil) == nil)
        // One character, as Python's re and ECMA-262 read it.
        #expect(try check(#"{"type":"when","name":"e","params":{"t":"\udfff"}}"#, plan, nil) == nil)
        for half in [#"\ud800"#, #"\udfff"#, #"a\ud800b"#] {
            let halfPlan = #"{"events":{"e":{"properties":{"s":{"const":"\#(half)"}}}}}"#
            #expect(throws: PlanError.self, "\(half)") { try TrackingPlan.parse(Array(halfPlan.utf8)) }
            let halfKey = #"{"events":{"\#(half)":{}}}"#
            #expect(throws: PlanError.self, "\(half)") { try TrackingPlan.parse(Array(halfKey.utf8)) }
        }
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{"e":{"enum":[""#.utf8) + [0xFF] + Array(#""]}}}"#.utf8))
        }
        let lengths = #"{"events":{"e":{"properties":{"s":{"minLength":2.0,"maxLength":1e1}}}}}"#
        #expect(try check(#"{"type":"when","name":"e","params":{"s":"a"}}"#, lengths, nil)?.rule == .minLength)
        #expect(try check(#"{"type":"when","name":"e","params":{"s":"abc"}}"#, lengths, nil) == nil)
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{"e":{"minLength":1.5}}}"#.utf8))
        }
    }

    /// Each app's rules are found by hash, however many apps a plan names (it scanned them).
    @Test func anAppAmongManyGetsItsOwnRules() throws {
        let apps = (0..<20_000).map { #""app\#($0)":{"events":{"only\#($0)":{}}}"# }.joined(separator: ",")
        let plan = #"{"events":{},"apps":{\#(apps)}}"#
        for i in [0, 7_777, 19_999] {
            #expect(try check(#"{"type":"when","name":"only\#(i)"}"#, plan, "app\(i)") == nil)
            #expect(try check(#"{"type":"when","name":"only\#(i)"}"#, plan, "app\(i + 1)")?.rule == .event)
        }
        #expect(try check(#"{"type":"when","name":"only3"}"#, plan, "other")?.rule == .event)
    }

    /// Found from outside: a param written twice in one event counted as present twice ("200 %"),
    /// and each copy's type as one more record.
    @Test func aKeyWrittenTwiceIsPresentOnce() throws {
        var inference = PlanInference()
        for line in [
            #"{"_seq":1,"type":"when","name":"e","params":{"id":1,"id":"x"}}"#,
            #"{"_seq":2,"type":"when","name":"e","params":{"id":2}}"#,
        ] {
            Array(line.utf8).withUnsafeBufferPointer { inference.add(record: $0) }
        }
        let statistics = inference.statistics()
        #expect(statistics.contains("id: present 100 %; integer 100 %, string 50 %"), "\(statistics)")
        #expect(try check(#"{"type":"when","name":"e","params":{"id":1,"id":"x"}}"#, inference.plan(), nil) == nil)
    }

    /// Found on reading the automaton again: what costs steps and no position — empty choices,
    /// optional parts nested in optional parts — let a pattern inside the position bound need
    /// millions of steps (memory when compiled, time per character when searched), and groups
    /// nested a hundred thousand deep are read by recursion.
    @Test func patternsWhoseAutomatonWouldBeHugeOrDeepAreRefused() throws {
        let choices = "(" + String(repeating: "|", count: 10_000) + "){1000}"
        let optional = "(" + String(repeating: "(", count: 8) + "a" + String(repeating: ")?", count: 8) + "){1000}"
        let deep = String(repeating: "(", count: 100_000) + "a" + String(repeating: ")", count: 100_000)
        let deeper = String(repeating: "(", count: 101) + "a" + String(repeating: ")", count: 101)
        for source in [choices, optional, deep, deeper] {
            #expect(throws: PatternError.self, "\(source.prefix(40))") { try Pattern(source) }
        }
        var parser = PatternParser(scalars: "(|||){1000}".unicodeScalars.map(\.value))
        #expect(PatternAutomaton.size(of: try parser.parse()) == 6000)
        _ = try Pattern(String(repeating: "(", count: 100) + "a" + String(repeating: ")", count: 100))
        // Within each pattern's bound, and over the plan's in all.
        // About 1206 steps and 203 positions each: 340 of them are over 400,000 steps and under
        // 100,000 positions; 330 are under both.
        let big = (0..<340).map { #""^x\#($0)(((((a?)?)?)?)?){200}$""# }
        #expect(try Pattern("^(((((a?)?)?)?)?){200}$").size == 1203)
        let patterns = big.joined(separator: ",")
        #expect(throws: PlanError.self) {
            try TrackingPlan.parse(Array(#"{"events":{},"screens":{"patterns":[\#(patterns)]}}"#.utf8))
        }
        let fewer = big.prefix(330).joined(separator: ",")
        _ = try TrackingPlan.parse(Array(#"{"events":{},"screens":{"patterns":[\#(fewer)]}}"#.utf8))
    }
}
