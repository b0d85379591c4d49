import Foundation
import Testing
import WhendJournal

@Suite(.serialized) struct ReplayExportTests {
    private let journey = [
        #"{"type":"navigation","action":"root","screen":"CharacterList"}"#,
        #"{"type":"when","name":"userTapsCharacter","params":{"characterId":7}}"#,
        #"{"type":"navigation","action":"push","screen":"CharacterDetail"}"#,
        #"{"type":"error","message":"comics failed","fatal":true}"#,
        #"{"type":"navigation","action":"pop"}"#,
    ]

    /// `whenctl replay` of `source`'s journal to a new daemon called `name`, started for it, at
    /// 50 times the original pace; the replay must succeed. Returns the daemon and what whenctl
    /// said.
    private func replay(
        _ source: TestDaemon, toNewDaemon name: String, sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> (TestDaemon, (status: Int32, output: String, error: String)) {
        let target = TestDaemon(name)
        try target.start()
        let r = try whenctl([
            "replay", "--state-dir", source.stateDirectory, "--to-socket", target.socketPath, "--speed", "50",
        ])
        #expect(r.status == 0, "\(r.error)", sourceLocation: sourceLocation)
        return (target, r)
    }

    @Test func replayingAPipelineTwiceGivesByteIdenticalOutputAndTouchesNothingLive() throws {
        let daemon = TestDaemon("replay-det")
        try daemon.start()
        for i in 0..<20 { try sendSession(daemon, app: "com.example.marvel", session: "s\(i)", journey) }
        daemon.stop()
        let scratch = scratchDirectory("replay-out")
        var outputs: [String] = []
        for run in 0..<2 {
            let r = try whenctl([
                "replay", "--state-dir", daemon.stateDirectory, "--pipeline", "screens", "--state-out",
                scratch + "/run\(run)",
            ])
            #expect(r.status == 0, "\(r.error)")
            #expect(r.error.contains("100 records through pipeline screens"))
            outputs.append(r.output)
        }
        #expect(outputs[0] == outputs[1])
        let derived = outputs[0].split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        let views = derived.filter { $0["type"] as? String == "screen" }
        #expect(views.count == 60)  // three per session: the list revealed by the pop included
        #expect(views.allSatisfy { $0["_origin"] as? String == "screen-tracking" && $0["_cause"] is Int })
        // The range filters: one session, by _seq.
        let one = try whenctl([
            "replay", "--state-dir", daemon.stateDirectory, "--pipeline", "screens", "--session", "s3", "--from", "1",
            "--to", "100", "--state-out", scratch + "/one",
        ])
        #expect(one.output.split(separator: "\n").filter { $0.contains(#""type":"screen""#) }.count == 3)
        // Nothing live was touched: no pipeline cursor, no plugin state under the daemon's state.
        #expect(!FileManager.default.fileExists(atPath: daemon.stateDirectory + "/pipelines"))
        #expect(!FileManager.default.fileExists(atPath: daemon.stateDirectory + "/plugins"))
        // A crash report per session from the same records, through --plugin.
        let crashes = try whenctl([
            "replay", "--state-dir", daemon.stateDirectory, "--plugin", executable("libcrash-reports.so"),
            "--state-out", scratch + "/crashes",
        ])
        #expect(crashes.status == 0, "\(crashes.error)")
        let reports = try FileManager.default.contentsOfDirectory(atPath: scratch + "/crashes/crash-reports/reports")
        #expect(reports.count == 20)
    }

    @Test func resendingToAnotherDaemonKeepsEverySessionsOrder() throws {
        let source = TestDaemon("replay-src")
        try source.start()
        // Two sessions interleaved on two connections at once.
        let threads = (0..<2).map { n in
            Thread {
                let lines = (0..<300).map {
                    #"{"type":"when","name":"step","params":{"n":\#($0)},"id":"\#(n)-\#($0)"}"#
                }
                _ = try? exchange(
                    source.socketPath, [#"{"hello":{"protocol":1,"app":"a","session":"s\#(n)","acks":true}}"#] + lines)
            }
        }
        threads.forEach { $0.start() }
        let deadline = Date().addingTimeInterval(20)
        while source.records().count < 600 && Date() < deadline { usleep(50_000) }
        source.stop()
        let (target, r) = try replay(source, toNewDaemon: "replay-dst")
        #expect(r.error.contains("600 records sent") && r.error.contains("600 acknowledged"))
        target.stop()
        let replayed = target.records()
        #expect(replayed.count == 600)
        for n in 0..<2 {
            let steps = replayed.filter { $0["session"] as? String == "s\(n)" }.compactMap {
                ($0["params"] as? [String: Any])?["n"] as? Int
            }
            #expect(steps == Array(0..<300))
        }
        // Fresh trusted fields: the receiving daemon's, naming the sender that re-sent them.
        #expect(replayed.allSatisfy { $0["_comm"] as? String == "whenctl" })
    }

    /// An app's events that Foundation's parser refuses (an unpaired surrogate's escape, a
    /// number past a Double) are re-sent like any other, their members as stored and in their
    /// order: whenctl once counted them skipped, and re-encoded the rest with sorted keys.
    @Test func eventsFoundationCannotReadAreResentAsStored() throws {
        let source = TestDaemon("replay-odd")
        try source.start()
        try sendSession(
            source, app: "a", session: #"s\udc00"#,
            [
                #"{"type":"when","name":"odd","params":{"lone":"\ud800","huge":1e999}}"#,
                #"{"type":"when","name":"plain","params":{"z":1,"a":2}}"#,
            ])
        source.stop()
        let (target, r) = try replay(source, toNewDaemon: "replay-odd-dst")
        #expect(r.error.contains("2 records sent") && r.error.contains("2 acknowledged"), "\(r.error)")
        target.stop()
        // Each record's members between `_seq` and the trusted ones whend adds (`_rt` first).
        func appParts(_ daemon: TestDaemon) -> [String] {
            var parts: [String] = []
            JournalReader(directory: daemon.journal).read { record, _ in
                let line = String(decoding: record.line, as: UTF8.self)
                let body = line.drop { $0 != "," }.dropFirst()
                parts.append(String(body[..<(body.range(of: #","_rt":"#)?.lowerBound ?? body.endIndex)]))
                return true
            } onProblem: {
                Issue.record("journal problem: \($0)")
            }
            return parts
        }
        let sent = appParts(source)
        #expect(sent.count == 2 && sent.first?.contains(#""params":{"lone":"\ud800","huge":1e999}"#) == true)
        #expect(appParts(target) == sent)
    }

    @Test func anExportedSessionCompilesAndNamesEveryWhenInOrder() throws {
        let daemon = TestDaemon("export")
        try daemon.start()
        try sendSession(
            daemon, app: "com.example.mail", session: "e-42",
            [
                #"{"type":"navigation","action":"present","screen":"ChangeEmail"}"#,
                #"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"a \"quoted\" \\ line\nbreak é"}}}"#,
                #"{"type":"when","when":{"userPicksSuggestion":{"_0":"b@example.com","_1":2}}}"#,
                #"{"type":"when","when":{"userSetsAddress":{"address":{"street":"1 Main St","floor":null,"tags":["home",true,2.5]}}}}"#,
                #"{"type":"when","when":{"userChoosesDelivery":{"option":{"express":{"days":1}}}}}"#,
                #"{"type":"when","when":{"userTapsChangeEmailButton":{}}}"#,
            ])
        daemon.stop()
        let scratch = scratchDirectory("export-out")
        let support = """
            import WhenClient

            struct Address: Codable { var street: String; var floor: Int?; var tags: [AnyCodableTag] }
            enum AnyCodableTag: Codable, ExpressibleByStringLiteral, ExpressibleByBooleanLiteral, ExpressibleByFloatLiteral {
                case text(String), flag(Bool), number(Double)
                init(stringLiteral value: String) { self = .text(value) }
                init(booleanLiteral value: Bool) { self = .flag(value) }
                init(floatLiteral value: Double) { self = .number(value) }
            }
            enum Delivery: Codable { case express(days: Int), standard }
            final class ChangeEmailViewModel: SingleEntryPoint {
                enum When: Codable {
                    case userTypesNewEmail(userEmail: String)
                    case userPicksSuggestion(String, Int)
                    case userSetsAddress(address: Address)
                    case userChoosesDelivery(option: Delivery)
                    case userTapsChangeEmailButton
                }
                var email = ""
                func handle(_ when: When) {}
            }

            """
        try support.write(toFile: scratch + "/Support.swift", atomically: true, encoding: .utf8)
        let modules = (executable("whend") as NSString).deletingLastPathComponent + "/Modules"
        for format in ["swift-testing", "xctest"] {
            let r = try whenctl([
                "export", "--state-dir", daemon.stateDirectory, "--session", "e-42", "--format", format, "--subject",
                "ChangeEmailViewModel",
            ])
            #expect(r.status == 0, "\(r.error)")
            let whens = r.output.split(separator: "\n").filter { $0.contains(".WHEN(") }.map {
                String($0.split(separator: "(")[1].dropFirst())
            }
            #expect(
                whens == [
                    "userTypesNewEmail", "userPicksSuggestion", "userSetsAddress", "userChoosesDelivery",
                    "userTapsChangeEmailButton)",
                ], "\(r.output)")
            #expect(r.output.contains("// screen: ChangeEmail"))
            #expect(r.output.contains(#".userPicksSuggestion("b@example.com", 2)"#))
            let file = scratch + "/Exported-\(format).swift"
            try r.output.write(toFile: file, atomically: true, encoding: .utf8)
            let compiled = try runCommand(
                "/usr/bin/env", ["swiftc", "-typecheck", "-I", modules, file, scratch + "/Support.swift"])
            #expect(compiled.status == 0, "\(format): \(compiled.error)\n\(r.output)")
        }
        let ndjson = try whenctl([
            "export", "--state-dir", daemon.stateDirectory, "--session", "e-42", "--format", "ndjson",
        ])
        #expect(ndjson.output.split(separator: "\n").count == 6)
    }

    @Test func flowCountsTheScreenTransitions() throws {
        let daemon = TestDaemon("flow")
        try daemon.start()
        for i in 0..<3 {
            try sendSession(
                daemon, app: "com.example.marvel", session: "f\(i)",
                [
                    #"{"type":"screen","name":"CharacterList"}"#, #"{"type":"screen","name":"CharacterDetail"}"#,
                    #"{"type":"screen","name":"CharacterList"}"#,
                ])
        }
        daemon.stop()
        let text = try whenctl(["flow", "--state-dir", daemon.stateDirectory])
        #expect(text.output.contains("CharacterList → CharacterDetail  3"), "\(text.output)")
        #expect(
            text.output.contains("(start) → CharacterList") && text.output.contains("CharacterDetail → CharacterList"))
        let dot = try whenctl(["flow", "--state-dir", daemon.stateDirectory, "--format", "dot"])
        #expect(
            dot.output.hasPrefix("digraph flow {")
                && dot.output.contains(#""CharacterList" -> "CharacterDetail" [label="3""#))
        let svg = try whenctl(["flow", "--state-dir", daemon.stateDirectory, "--format", "svg"])
        let hasDot = FileManager.default.isExecutableFile(atPath: "/usr/bin/dot")
        #expect(hasDot ? svg.output.contains("<svg") : svg.error.contains("apt-get install graphviz"))
    }
}
