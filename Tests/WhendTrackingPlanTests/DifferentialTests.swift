import Foundation
import SeededRandom
import TestScratch
import Testing
import WhendTrackingPlan

/// The plan's verdicts against an independent validator's: Python's `jsonschema` (PyPI, pinned
/// in the Makefile's test-deps), Draft 2020-12, on generated schemas and instances.
@Suite struct DifferentialTests {
    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path
    static let python = repositoryRoot + "/.build/test-venv/bin/python"

    /// What the reference says of each (schema, instance) line: "1" valid, "0" not.
    static let reference = """
        import json, sys
        from jsonschema import Draft202012Validator
        out = []
        for line in open(sys.argv[1], encoding="utf-8"):
            case = json.loads(line)
            Draft202012Validator.check_schema(case["schema"])
            out.append("1" if Draft202012Validator(case["schema"]).is_valid(case["instance"]) else "0")
        print("".join(out))
        """

    @Test(arguments: [UInt64(1), 2, 3])
    func verdictsMatchJSONSchema(seed: UInt64) throws {
        var generator = SchemaGenerator(seed: seed)
        var lines: [String] = []
        var ours: [Bool] = []
        var rules: Set<String> = []
        var keywords: Set<String> = []
        var cases: [(schema: String, instance: String)] = []
        for _ in 0..<300 {
            let schema = generator.schema()
            let schemaText = schema.text(&generator.random)
            collectKeywords(schema, into: &keywords)
            let plan = try TrackingPlan.parse(Array("{\"events\":{\"e\":\(schemaText)}}".utf8))
            for _ in 0..<10 {
                let instance = generator.instance(for: schema).text(&generator.random)
                let violation = Array(instance.utf8).withUnsafeBufferPointer { plan.check(params: $0, event: "e") }
                if let violation { rules.insert(violation.rule.rawValue) }
                ours.append(violation == nil)
                lines.append("{\"schema\":\(schemaText),\"instance\":\(instance)}")
                cases.append((schemaText, instance))
            }
        }
        let verdicts = try Self.runPython(Self.reference, input: lines.joined(separator: "\n") + "\n")
        try #require(verdicts.count == ours.count, "the reference answered \(verdicts.count) of \(ours.count)")
        var disagreements: [String] = []
        for (i, (reference, mine)) in zip(verdicts, ours).enumerated() where reference != mine {
            disagreements.append(
                "schema \(cases[i].schema) instance \(cases[i].instance): jsonschema \(reference ? "valid" : "invalid"), whend \(mine ? "valid" : "invalid")"
            )
        }
        #expect(disagreements.isEmpty, "\(disagreements.count) disagreements, the first: \(disagreements.prefix(5))")
        // Every keyword was generated, and every rule refused something.
        for keyword in [
            "type", "properties", "required", "additionalProperties", "enum", "const", "pattern", "minimum", "maximum",
            "minLength", "maxLength", "items",
        ] {
            #expect(keywords.contains(keyword), "no schema used \(keyword)")
        }
        for rule in [
            "type", "required", "additionalProperties", "enum", "const", "pattern", "minimum", "maximum", "minLength",
            "maxLength", "false",
        ] {
            #expect(rules.contains(rule), "no instance broke \(rule)")
        }
        #expect(ours.contains(true) && ours.contains(false))
    }

    private func collectKeywords(_ schema: GeneratedJSON, into keywords: inout Set<String>) {
        switch schema {
        case .object(let members):
            for (key, value) in members {
                keywords.insert(key)
                switch key {
                case "properties":
                    if case .object(let properties) = value {
                        for (_, sub) in properties { collectKeywords(sub, into: &keywords) }
                    }
                case "items", "additionalProperties": collectKeywords(value, into: &keywords)
                default: break
                }
            }
        default: break
        }
    }

    /// Runs `script` in the tests' venv over a file holding `input`; its "1"s and "0"s.
    static func runPython(_ script: String, input: String) throws -> [Bool] {
        let file = ScratchDirectory.make("differential") + "/cases.jsonl"
        try input.write(toFile: file, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.python)
        process.arguments = ["-c", script, file]
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let errorText = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "python (make test-deps installs the venv): \(errorText)")
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).map { $0 == "1" }
    }
}
