import Foundation
import Testing
import WhendConfiguration
import WhendDaemon
import WhendJournal
import WhendPipelines
import WhendPluginHost

@Suite(.serialized) struct PipelineSpeedTests {
    /// The same journal gives byte-identical derived records through a live pipeline (worker,
    /// framed protocol, journal) and through `whenctl replay` in one go.
    @Test func aLivePipelineAndAReplayDeriveByteIdenticalRecords() throws {
        let daemon = TestDaemon("live-replay", arguments: ["--builtin-pipelines", "true"])
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

        try expectReplayDerivesWhatWasLive(daemon, atLeast: 100)
    }

    /// A worker counts an acknowledgement only from the daemon that started it: one tagged with
    /// an earlier generation (meant for a worker that died) never lets its cursor pass a record
    /// whose derived records are not stored.
    @Test func aWorkerIgnoresAnAcknowledgementOfAnEarlierGeneration() throws {
        let daemon = TestDaemon("generation")
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
        // The daemon's frames are on the worker's descriptors 3 (from it) and 4 (to it).
        worker.executableURL = URL(fileURLWithPath: "/bin/sh")
        worker.arguments = ["-c", #"exec "$0" --pipeline-worker 3>&1 4<&0 1>&2 0</dev/null"#, executable("whend")]
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
        /// Batches the worker sent after the first: on a loaded machine it may flush what the
        /// second record derived apart from the first's.
        var later: [UInt64] = []
        /// The cursor the worker reports after `seconds`.
        func cursor(after seconds: Double) throws -> UInt64 {
            let deadline = Date().addingTimeInterval(seconds)
            var last: UInt64 = 0
            while Date() < deadline {
                switch try next() {
                case .progress(let cursor, _, _, _): last = cursor
                case .derived(let b, _): later.append(b)
                default: break
                }
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
        // By its own generation: the cursor passes both records (as soon as the worker's next
        // report says so: a loaded machine may take more than a moment).
        send(.stored(generation: 7, batch: batch!))
        for b in later { send(.stored(generation: 7, batch: b)) }
        var reported: UInt64 = 0
        let deadline = Date().addingTimeInterval(20)
        while reported < 2 && Date() < deadline {
            switch try next() {
            case .progress(let cursor, _, _, _): reported = cursor
            case .derived(let b, _): send(.stored(generation: 7, batch: b))
            default: break
            }
        }
        #expect(reported == 2)
    }
}
