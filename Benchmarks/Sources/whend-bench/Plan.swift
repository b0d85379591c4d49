import BenchSupport
import Foundation

// The tracking plan's cost at ingest: whend with a plan of 100 `When` names (the corpus's nine,
// with the schemas their params keep to, and 91 more the corpus never sends) and its screens,
// beside whend without a plan, on the same corpus, round by round. The bar: ≥ 0.9 × without.

/// The plan: every event of the corpus keeps to it, so both runs store every event.
func benchmarkPlan() -> String {
    let corpusEvents = [
        #""userScrollsCharacterList": {"type": "object", "properties": {"offset": {"type": "integer", "minimum": 0}}, "required": ["offset"], "additionalProperties": false}"#,
        #""userTapsCharacter": {"type": "object", "properties": {"characterId": {"type": "integer"}}, "required": ["characterId"], "additionalProperties": false}"#,
        #""userTapsFavourite": {"type": "object", "properties": {"characterId": {"type": "integer"}, "on": {"type": "boolean"}}, "required": ["characterId", "on"], "additionalProperties": false}"#,
        #""userTypesNewEmail": {"type": "object", "properties": {"userEmail": {"type": "string", "pattern": "^[^@]+@[^@]+$", "maxLength": 254}}, "required": ["userEmail"], "additionalProperties": false}"#,
        #""userTapsChangeEmailButton": {"type": "object", "additionalProperties": false}"#,
        #""userAcceptsTerms": {"type": "object", "properties": {"version": {"type": "string", "enum": ["2025-11", "2026-03"]}}, "required": ["version"]}"#,
        #""userEntersPostcode": {"type": "object", "properties": {"postcode": {"type": "string", "minLength": 5, "maxLength": 8}}, "required": ["postcode"]}"#,
        #""userSelectsPractice": {"type": "object", "properties": {"practiceId": {"type": "string", "pattern": "^P[0-9]+$"}, "distanceKm": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["practiceId", "distanceKm"]}"#,
        #""userTapsGetStarted": {"type": "object", "additionalProperties": false}"#,
    ]
    let others = (corpusEvents.count..<100).map {
        #""plannedEvent\#($0)": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}"#
    }
    let screens = [
        "ChangeEmail", "CharacterDetail", "CharacterList", "ChoosePractice", "Consent", "Done", "PersonalDetails",
        "Welcome",
    ]
    return "{\n\"events\": {\n" + (corpusEvents + others).joined(separator: ",\n") + "\n},\n\"screens\": {\"names\": ["
        + screens.map { "\"\($0)\"" }.joined(separator: ", ") + "]}\n}\n"
}

/// One row: whend with the plan beside whend without it, each the median of its rounds.
struct PlanRow {
    var without: Run
    var with: Run
    var acks: Bool
}

/// Rounds of whend without and with the plan, interleaved (so that whatever else the machine
/// does falls on both alike): without acks on 1 and 4 connections, with acks and fsync on 4.
@MainActor func measurePlan() throws -> [PlanRow] {
    let planPath = work + "/plan.json"
    try benchmarkPlan().write(toFile: planPath, atomically: true, encoding: .utf8)
    let kinds: [(connections: Int, acks: Bool)] = [(1, false), (4, false), (4, true)]
    var without = Array(repeating: [Run](), count: kinds.count)
    var with = without
    for round in 1...rounds {
        for (k, kind) in kinds.enumerated() {
            let what = "\(kind.acks ? "acks" : "no acks"), \(kind.connections) connection(s)"
            say("round \(round)/\(rounds): whend, \(what), without a plan…")
            without[k].append(try runWhend(connections: kind.connections, acks: kind.acks, durability: "fsync"))
            say("round \(round)/\(rounds): whend, \(what), with a plan of 100 events…")
            with[k].append(
                try runWhend(
                    connections: kind.connections, acks: kind.acks, durability: "fsync",
                    extra: ["--tracking-plan", planPath, "--tracking-plan-mode", "enforce"]))
        }
    }
    return kinds.indices.map { PlanRow(without: median(without[$0]), with: median(with[$0]), acks: kinds[$0].acks) }
}

func printPlan(_ rows: [PlanRow]) {
    print(
        pad("run", 26) + lpad("conns", 6) + lpad("without ev/s", 14) + lpad("with plan ev/s", 16)
            + lpad("× without", 11)
            + lpad("CPU µs/ev", 11) + lpad("with plan", 11) + "  bar ≥ 0.9")
    for row in rows {
        let ratio = row.with.eventsPerSecond / row.without.eventsPerSecond
        print(
            pad(row.without.name, 26) + lpad("\(row.without.connections)", 6)
                + lpad(fmt(row.without.eventsPerSecond), 14)
                + lpad(fmt(row.with.eventsPerSecond), 16) + lpad(fmt(ratio, 2), 11)
                + lpad(fmt(row.without.cpuMicrosPerEvent, 2), 11) + lpad(fmt(row.with.cpuMicrosPerEvent, 2), 11)
                + (ratio >= 0.9 ? "  reached" : "  NOT reached"))
    }
}
