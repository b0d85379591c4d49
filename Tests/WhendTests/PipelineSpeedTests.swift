import Foundation
import Testing
import WhendDaemon
import WhendJournal

/// What a plugin wrote of a derived record: the members before the trusted fields whend adds
/// (`_origin` first among them), and the `_cause` it came from.
private func pluginPart(_ line: [UInt8]) -> (cause: Int, bytes: [UInt8])? {
    let text = String(decoding: line, as: UTF8.self)
    guard let origin = text.range(of: #","_origin":"#),
        let cause = text.range(of: #""_cause":"#).flatMap({ Int(text[$0.upperBound...].prefix { $0.isNumber }) })
    else { return nil }
    // A stored line starts `{"_seq":N,`; a replayed one `{`.
    var start = text.index(after: text.startIndex)
    if text.hasPrefix(#"{"_seq":"#), let comma = text.firstIndex(of: ",") { start = text.index(after: comma) }
    return (cause, Array(text[start..<origin.lowerBound].utf8))
}

@Suite(.serialized) struct PipelineSpeedTests {
    /// The same journal gives byte-identical derived records through a live pipeline (worker,
    /// framed protocol, journal) and through `whenctl replay` in one go.
    @Test func aLivePipelineAndAReplayDeriveByteIdenticalRecords() throws {
        let daemon = DaemonProcess("live-replay", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        let demo = try runCommand(
            executable("whend-demo"),
            ["--socket", daemon.socketPath, "--sessions", "24", "--rate", "0", "--seed", "7", "--quiet"])
        #expect(demo.status == 0, "\(demo.error)")
        // Every pipeline at the journal's end, twice in a row (derived records are records too).
        var settled = 0
        #expect(
            eventually(60) {
                guard let status = try? daemon.status(), let pipelines = status["pipelines"] as? [[String: Any]],
                    pipelines.count == 4
                else { return false }
                settled = pipelines.allSatisfy { ($0["lag"] as? Int) == 0 } ? settled + 1 : 0
                return settled >= 2
            })
        #expect(daemon.stop() == 0)

        var live: [(cause: Int, bytes: [UInt8])] = []
        JournalReader(directory: daemon.journal).read { record, _ in
            let line = Array(record.line)
            if String(decoding: line, as: UTF8.self).contains(#""_origin":"screen-tracking""#),
                let part = pluginPart(line)
            {
                live.append(part)
            }
            return true
        } onProblem: {
            Issue.record("journal problem: \($0)")
        }
        let replay = try whenctl([
            "replay", "--state-dir", daemon.stateDirectory, "--pipeline", "screens", "--state-out",
            scratchDirectory("live-replay-out"),
        ])
        #expect(replay.status == 0, "\(replay.error)")
        let replayed = replay.output.split(separator: "\n").compactMap { pluginPart(Array($0.utf8)) }
        #expect(live.count > 100, "\(live.count) derived records")
        #expect(replayed.count == live.count)
        for (a, b) in zip(live, replayed) where a.cause != b.cause || a.bytes != b.bytes {
            Issue.record(
                "live _cause \(a.cause): \(String(decoding: a.bytes, as: UTF8.self))\nreplay _cause \(b.cause): \(String(decoding: b.bytes, as: UTF8.self))"
            )
            break
        }
    }

    /// A worker counts an acknowledgement only from the daemon that started it: one tagged with
    /// an earlier generation (meant for a worker that died) never lets its cursor pass a record
    /// whose derived records are not stored.
    @Test func aWorkerIgnoresAnAcknowledgementOfAnEarlierGeneration() throws {
        let daemon = DaemonProcess("generation")
        try daemon.start()
        try sendSession(
            daemon, app: "com.example.marvel", session: "g",
            [
                #"{"type":"navigation","action":"root","screen":"CharacterList"}"#,
                #"{"type":"navigation","action":"push","screen":"CharacterDetail"}"#,
            ])
        #expect(daemon.stop() == 0)
        let directory = scratchDirectory("generation-worker")
        let spec: [String: Any] = [
            "name": "screens", "stages": [["plugin": "screen-tracking", "configuration": "{}"]],
            "journalDirectory": daemon.journal.path, "directory": directory + "/pipelines/screens",
            "pluginStateRoot": directory + "/plugins",
            "pluginDirectories": [(executable("whend") as NSString).deletingLastPathComponent], "retryLimit": 0,
            "snapshotInterval": 0, "snapshotRebuild": 0,
        ]
        let worker = Process()
        worker.executableURL = URL(fileURLWithPath: executable("whend"))
        worker.arguments = ["--pipeline-worker"]
        let input = Pipe()
        let output = Pipe()
        worker.standardInput = input
        worker.standardOutput = output
        try worker.run()
        defer {
            worker.terminate()
            worker.waitUntilExit()
        }
        func send(_ message: SupervisorMessage) {
            input.fileHandleForWriting.write(Data(WorkerFrame.encode(message)))
        }
        var frames = WorkerFrameReader()
        /// The worker's next message, within 10 s.
        func next() throws -> WorkerMessage {
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline {
                if let payload = try frames.next() { return try WorkerFrame.decodeWorkerMessage(payload) }
                let data = output.fileHandleForReading.availableData
                guard !data.isEmpty else { break }
                data.withUnsafeBytes { frames.append($0) }
            }
            throw TestFailure(description: "no message from the worker")
        }
        /// The cursor the worker reports after `seconds`.
        func cursor(after seconds: Double) throws -> UInt64 {
            let deadline = Date().addingTimeInterval(seconds)
            var last: UInt64 = 0
            while Date() < deadline {
                if case .progress(let cursor, _, _, _) = try next() { last = cursor }
            }
            return last
        }
        send(.start(generation: 7, spec: Array(try JSONSerialization.data(withJSONObject: spec))))
        var batch: UInt64?
        var causes: [UInt64] = []
        while batch == nil {
            if case .derived(let b, let records) = try next() {
                batch = b
                causes = records.map(\.cause)
            }
        }
        #expect(causes.first == 1)
        // Not acknowledged: the cursor stays before the first record that derived something.
        #expect(try cursor(after: 0.6) == 0)
        // Acknowledged by the generation before: still nothing stored as far as it knows.
        send(.stored(generation: 6, batch: batch!))
        #expect(try cursor(after: 0.6) == 0)
        // By its own generation: the cursor passes both records.
        send(.stored(generation: 7, batch: batch!))
        #expect(try cursor(after: 0.6) == 2)
    }
}
