import Foundation
import Testing

/// The event lines whend refused lately, as `whenctl rejections` shows them: each with its
/// error, the start of the line and its sender; the newest 100, whatever clients send.
@Suite struct RejectionsTests {
    func rejections(_ daemon: TestDaemon) throws -> [[String: Any]] {
        let r = try daemon.whenctl(["rejections", "--json"])
        #expect(r.status == 0, "\(r.error)")
        let o = try JSONSerialization.jsonObject(with: Data(r.output.utf8)) as? [String: Any]
        return o?["rejections"] as? [[String: Any]] ?? []
    }

    @Test func refusedLinesAreKeptWithTheirErrorAndSender() throws {
        let daemon = TestDaemon("rejections", arguments: ["--max-event-bytes", "2048"])
        try daemon.start()
        defer { daemon.stop() }
        #expect(try rejections(daemon).isEmpty)
        let long = String(repeating: "y", count: 1500)
        let answers = try exchange(
            daemon.socketPath,
            [
                #"{"hello":{"protocol":1,"app":"com.example.mail","session":"s1","acks":true}}"#,
                #"{"type":"when"}"#,
                #"{"type":"when","name":"ok"}"#,
                #"{"type":"lifecycle","app":"com.example.other","screen":"Inbox","status":"sideways"}"#,
                #"{"type":"when","name":"\#(long)"}"#,
                String(repeating: "z", count: 3000),
            ])
        #expect(answers.errors.count == 4)
        let kept = try rejections(daemon)
        #expect(kept.map { $0["code"] as? String } == ["missing_field", "invalid_field", "invalid_field", "too_large"])
        #expect(kept[0]["line"] as? String == #"{"type":"when"}"#)
        #expect(kept[0]["app"] as? String == "com.example.mail", "the hello's app")
        #expect(kept[1]["app"] as? String == "com.example.other", "the line's own app")
        #expect(kept.allSatisfy { $0["pid"] as? Int == Int(getpid()) }, "the sender: this test")
        #expect((kept[2]["line"] as? String)?.utf8.count == 1024 && kept[2]["truncated"] as? Bool == true)
        #expect(kept[3]["line"] == nil, "a line over max_event_bytes is not kept")
        let message = kept[0]["message"] as? String ?? ""
        #expect(message.contains("name"), "\(message)")
        // The plain listing says the same, one refusal per entry.
        let text = try daemon.whenctl(["rejections"]).output
        #expect(text.contains("missing_field app=com.example.mail"))
    }

    @Test func onlyTheNewestHundredAreKept() throws {
        let daemon = TestDaemon("rejections-ring")
        try daemon.start()
        defer { daemon.stop() }
        let lines = (0..<250).map { #"{"type":"when","name":"n\#($0)","id":\#($0)}"# }
        _ = try exchange(daemon.socketPath, lines)
        let kept = try rejections(daemon)
        #expect(kept.count == 100)
        #expect(kept.first?["line"] as? String == lines[150] && kept.last?["line"] as? String == lines[249])
    }

    /// What a refusal's message quotes from the line (a key, here) is cut like the line: an
    /// entry stays within its bound whatever a client sends.
    @Test func aMessageQuotingAHugeKeyIsCut() throws {
        let daemon = TestDaemon("rejections-message")
        try daemon.start()
        defer { daemon.stop() }
        let key = "_" + String(repeating: "k", count: 20_000)
        let answers = try exchange(daemon.socketPath, [#"{"type":"when","name":"n","\#(key)":1}"#])
        #expect(answers.errors.map(\.code) == ["reserved_field"])
        #expect((answers.errors.first?.message.utf8.count ?? 0) > 20_000, "the sender is told in full")
        let kept = try rejections(daemon)
        #expect(kept.count == 1)
        #expect(((kept.first?["message"] as? String)?.utf8.count ?? .max) <= 1024)
    }
}
