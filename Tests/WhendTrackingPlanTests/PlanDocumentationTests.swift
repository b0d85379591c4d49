import Foundation
import Testing
import WhendTrackingPlan

/// The plan file as docs/tracking-plan.md shows it: whend reads its example, and the JSON
/// Schema published for plan files (docs/tracking-plan.schema.json) is a valid 2020-12 schema
/// that the example keeps to and that refuses what whend refuses.
@Suite struct PlanDocumentationTests {
    static let docs = DifferentialTests.repositoryRoot + "/docs"

    static func example() throws -> String {
        let text = try String(contentsOfFile: docs + "/tracking-plan.md", encoding: .utf8)
        guard let start = text.range(of: "```json\n"),
            let end = text.range(of: "\n```", range: start.upperBound..<text.endIndex)
        else { throw CocoaError(.fileReadCorruptFile) }
        return String(text[start.upperBound..<end.lowerBound])
    }

    @Test func theDocumentedExampleIsAPlanWhendReadsAndTheSchemaAccepts() throws {
        let example = try Self.example()
        let plan = try TrackingPlan.parse(Array(example.utf8))
        #expect(plan.eventCount == 2)
        let refused = #"{"events":{"a":{"type":"strng"}}}"#
        #expect(throws: PlanError.self) { try TrackingPlan.parse(Array(refused.utf8)) }
        let verdicts = try validate([example, refused, #"{"evnts":{}}"#])
        #expect(verdicts == [true, false, false])
    }

    /// What the published schema says of each plan text: valid or not, per Python's jsonschema.
    private func validate(_ plans: [String]) throws -> [Bool] {
        let script = """
            import json, sys
            from jsonschema import Draft202012Validator
            schema = json.load(open(sys.argv[1], encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
            validator = Draft202012Validator(schema)
            print("".join("1" if validator.is_valid(json.loads(line)) else "0" for line in open(sys.argv[2], encoding="utf-8")))
            """
        let file = NSTemporaryDirectory() + "plans-\(getpid()).jsonl"
        let lines = try plans.map { text -> String in
            let object = try JSONSerialization.jsonObject(with: Data(text.utf8))
            return String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
        }
        try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: DifferentialTests.python)
        process.arguments = ["-c", script, Self.docs + "/tracking-plan.schema.json", file]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "jsonschema refused the published schema or a plan")
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).map { $0 == "1" }
    }
}
