import Foundation
import Testing
import WhendJournal
import WhendPipelines
import WhendSystem
import WhendWire

/// The boundary between whend and a pipeline's worker, tried from the plugin's side: a real C
/// plugin (Tests/Fixtures/chatty.c) that prints to its standard output, derives more than a
/// frame holds, or writes a forged frame, in a real worker of a real whend.
@Suite(.serialized) struct WorkerBoundaryTests {
    func chattyDaemon(_ name: String, configuration: String = "{}", settings: String = "") throws -> TestDaemon {
        let daemon = try fixturePipelineDaemon(
            name, plugin: "chatty", pipeline: "chat", settings: "plugin.chatty = \(configuration)\n\(settings)",
            .live)  // what the worker logs is on whend's standard error
        try FileManager.default.createDirectory(
            atPath: daemon.stateDirectory + "/plugins/chatty", withIntermediateDirectories: true)
        return daemon
    }

    /// Sends `events`, each acknowledged, and waits until the chat pipeline has read through
    /// `cursor`: the events and what they derived.
    func send(
        _ events: [String], to daemon: TestDaemon, chatReaches cursor: Int,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let acks = try exchange(daemon.socketPath, [helloWithAcks] + events).acks
        #expect(acks.last == events.count, sourceLocation: sourceLocation)
        #expect(
            try daemon.waitForPipeline("chat", cursor: cursor, seconds: 30), "\(daemon.log.suffix(3000))",
            sourceLocation: sourceLocation)
    }

    /// `when` events named `names`, with ids `prefix`1, `prefix`2…: what the chatty plugin is
    /// told to do, one record each.
    func whens(_ names: [String], ids prefix: String) -> [String] {
        names.enumerated().map { #"{"type":"when","name":"\#($0.element)","id":"\#(prefix)\#($0.offset + 1)"}"# }
    }

    /// The `_cause` of each record the chatty plugin derived, in the journal's order.
    func chattyCauses(_ daemon: TestDaemon) -> [Int] {
        daemon.records().filter { $0["_origin"] as? String == "chatty" }.map { $0["_cause"] as? Int ?? 0 }
    }

    /// A plugin that prints on every record corrupts no frame: every record is handled once,
    /// what it derived is stored, the worker never restarts, and the prints are in whend's log.
    @Test func aPluginPrintingToItsStandardOutputCorruptsNoFrame() throws {
        let daemon = try chattyDaemon("w-printf")
        try daemon.start()
        let events = (1...200).map { i in
            i % 10 == 0
                ? #"{"type":"when","name":"derive","id":"p\#(i)"}"# : #"{"type":"when","name":"tap","id":"p\#(i)"}"#
        }
        // The 200 events and the 20 records derived from them.
        try send(events, to: daemon, chatReaches: 220)
        let pipeline = try daemon.pipeline("chat")
        #expect(pipeline?["restarts"] as? Int == 0, "\(daemon.log.suffix(2000))")
        #expect(daemon.waitForLog("chatty: handled _seq 220"))
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == Array(stride(from: 10, through: 200, by: 10)))
    }

    /// Offline too, a plugin's prints stay out of the records: `whenctl replay` prints on its
    /// standard output only what the plugin derived, one JSON object a line, and the plugin's
    /// prints go to its standard error.
    @Test func aPluginPrintingToItsStandardOutputStaysOutOfReplaysRecords() throws {
        let daemon = TestDaemon.live("w-replay-printf")
        try daemon.start()
        let events = (1...50).map { i in
            i % 10 == 0
                ? #"{"type":"when","name":"derive","id":"r\#(i)"}"# : #"{"type":"when","name":"tap","id":"r\#(i)"}"#
        }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 50)
        #expect(daemon.stop() == 0)
        let plugins = scratchDirectory("w-replay-printf-plugins")
        let library = try buildTestPlugin("chatty", into: plugins, name: "chatty")
        let replay = try whenctl(["replay", "--state-dir", daemon.stateDirectory, "--plugin", library])
        #expect(replay.status == 0, "\(replay.error)")
        let lines = replay.output.split(separator: "\n")
        #expect(lines.count == 5, "\(replay.output.prefix(500))")
        for line in lines {
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            #expect(object?["_origin"] as? String == "chatty", "not a derived record: \(line)")
        }
        #expect(replay.error.contains("chatty: handled _seq 50"), "\(replay.error.suffix(500))")
    }

    /// A record that derives more than a frame holds goes to the dead letters with the reason,
    /// none of what it derived is stored, and the pipeline goes on without a restart.
    @Test func aRecordDerivingMoreThanAFrameHoldsGoesToTheDeadLetters() throws {
        let daemon = try chattyDaemon("w-huge", configuration: #"{"quiet": true}"#)
        try daemon.start()
        let events = whens(["derive", "huge", "derive"], ids: "h")
        // The three events and what the two "derive" derived.
        try send(events, to: daemon, chatReaches: 5)
        let pipeline = try daemon.pipeline("chat")
        #expect(pipeline?["restarts"] as? Int == 0, "\(daemon.log.suffix(3000))")
        #expect(pipeline?["dead_letters"] as? Int == 1)
        let dead =
            (try? String(contentsOfFile: daemon.stateDirectory + "/pipelines/chat/dead-letter.jsonl", encoding: .utf8))
            ?? ""
        #expect(
            dead.contains(#""_seq":2"#) && dead.contains("more than the 67108864 a frame to whend holds"), "\(dead)")
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 3])
    }

    /// A derived record within a frame alone, but not with the records derived before it that
    /// wait to go, is stored all the same: those go first, in a frame of their own.
    @Test func aRecordThatFitsAFrameAloneIsStored() throws {
        let daemon = try chattyDaemon("w-split", configuration: #"{"quiet": true, "huge_bytes": 67108764}"#)
        try daemon.start()
        let events = whens(["derive", "huge", "derive"], ids: "s")
        try send(events, to: daemon, chatReaches: 6)
        let pipeline = try daemon.pipeline("chat")
        #expect(pipeline?["restarts"] as? Int == 0 && pipeline?["dead_letters"] as? Int == 0)
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 2, 3])
    }

    /// A frame whose declared count of records its bytes cannot hold is refused before anything
    /// is reserved for it: the worker is killed, with the reason in the log, and restarted;
    /// whend itself neither dies nor grows by gigabytes (it reserved 3.7 GB for it).
    @Test func aForgedFrameKillsTheWorkerNotTheDaemon() throws {
        let daemon = try chattyDaemon("w-forge", configuration: #"{"quiet": true, "forge_pipe": true}"#)
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"tap"}"#]).acks == [1])
        #expect(try daemon.waitForPipeline("chat", cursor: 1, seconds: 20))
        let pid = daemon.process!.processIdentifier
        let before = try #require(peakVirtualMemory(pid))
        let events = [#"{"type":"when","name":"forge"}"#, #"{"type":"when","name":"derive"}"#]
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 2)
        #expect(daemon.waitForLog("the worker's message cannot be read", seconds: 30), "\(daemon.log.suffix(3000))")
        // Restarted, it goes on (the plugin forges once).
        #expect(try daemon.waitForPipeline("chat", cursor: 4, seconds: 30), "\(daemon.log.suffix(3000))")
        let after = try #require(peakVirtualMemory(pid))
        #expect(after - before < 1 << 30, "whend's peak virtual memory grew from \(before) to \(after) bytes")
        #expect(try daemon.pipeline("chat")?["restarts"] as? Int == 1)
        #expect(daemon.stop() == 0)
    }

    /// Counters past what whend counts in (2^64 - 1 failures) in a worker's progress: whend
    /// goes on, and so does the pipeline. (whend trapped converting them, and died.)
    @Test func aProgressFrameWithAbsurdCountersDoesNotStopTheDaemon() throws {
        let daemon = try chattyDaemon("w-progress", configuration: #"{"quiet": true, "forge_pipe": true}"#)
        try daemon.start()
        let events = [#"{"type":"when","name":"counters"}"#, #"{"type":"when","name":"tap"}"#]
        try send(events, to: daemon, chatReaches: 2)
        #expect(daemon.process?.isRunning == true, "\(daemon.log.suffix(2000))")
        #expect(daemon.stop() == 0)
    }

    /// One well-formed derived frame a plugin writes to the worker's pipe itself, of cause
    /// 2^64 - 2 and the origin of another plugin: not stored, and the worker that sent it is
    /// killed with the reason in the log. Every later record derives as before, live and after a
    /// restart of whend. (whend stored it, and took every later derived record of the pipeline
    /// for one already appended: none was stored again.)
    @Test func aForgedDerivedRecordIsRefusedAndLaterOnesAreStored() throws {
        let daemon = try chattyDaemon("w-forge-cause", configuration: #"{"quiet": true, "forge_pipe": true}"#)
        try daemon.start()
        let events = whens(["derive", "forge_cause", "derive", "derive"], ids: "f")
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 4)
        #expect(
            daemon.waitForLog("its worker sent a derived record it cannot have derived", seconds: 20),
            "\(daemon.log.suffix(3000))")
        // The four events and the three records derived from the "derive" ones.
        #expect(try daemon.waitForPipeline("chat", cursor: 7, seconds: 30), "\(daemon.log.suffix(3000))")
        #expect(daemon.stop() == 0)
        try daemon.start()
        #expect(
            try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"derive","id":"f5"}"#]).acks == [1])
        #expect(try daemon.waitForPipeline("chat", cursor: 9, seconds: 30), "\(daemon.log.suffix(3000))")
        #expect(daemon.stop() == 0)
        let records = daemon.records()
        #expect(!records.contains { $0["_origin"] as? String == "screen-tracking" })
        let derived = records.filter { $0["_origin"] as? String == "chatty" }
        #expect(derived.map { $0["_cause"] as? Int ?? 0 } == [1, 3, 4, 8], "\(daemon.log.suffix(3000))")
    }

    /// A forged derived record already in the journal (stored before whend checked what workers
    /// send), of cause 2^64 - 2: at start, whend does not take it for what the pipeline derived,
    /// and the records after it derive as before. (It believed the cause, and took every later
    /// derived record for one already appended.)
    @Test func aForgedCauseInTheJournalIsNotBelievedAtStart() throws {
        let daemon = try chattyDaemon("w-forged-journal", configuration: #"{"quiet": true}"#)
        let rt = #""_rt":"2026-11-24T10:00:00.000000Z"}"#
        let bodies = [
            #""type":"when","name":"derive","#,
            #""type":"when","name":"derived","params":{"from":"chatty"},"_origin":"chatty","_pipeline":"chat","_cause":1,"#,
            #""type":"screen","name":"FORGED","_origin":"screen-tracking","_pipeline":"chat","_cause":18446744073709551614,"#,
            #""type":"when","name":"derive","#,
        ].map { $0 + rt }
        var batch = JournalBatch()
        for body in bodies {
            batch.bodies += Array(body.utf8)
            batch.ends.append(batch.bodies.count)
        }
        try DurableFile.createDirectory(daemon.journal.path)
        let writer = try JournalWriter(configuration: JournalConfiguration(directory: daemon.journal))
        writer.start()
        let done = DispatchSemaphore(value: 0)
        writer.submit(batch) { _ in done.signal() }
        done.wait()
        writer.shutdown()
        try daemon.start()
        #expect(
            daemon.waitForLog("claims to be derived from _seq 18446744073709551614", seconds: 20),
            "\(daemon.log.suffix(3000))")
        // The four records and what the last one derives.
        #expect(try daemon.waitForPipeline("chat", cursor: 5, seconds: 30), "\(daemon.log.suffix(3000))")
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"derive"}"#]).acks == [1])
        #expect(try daemon.waitForPipeline("chat", cursor: 7, seconds: 30), "\(daemon.log.suffix(3000))")
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 4, 6], "\(daemon.log.suffix(3000))")
    }

    /// A plugin that writes to descriptor 3 and closes 3 and 4 (where the worker's frames were)
    /// disturbs nothing: the worker keeps its pipes elsewhere, never restarts, and every record
    /// derives what it should. (The worker was killed for the garbage, and again each time it
    /// came back to the record: the pipeline stalled for good.)
    @Test func aPluginUsingDescriptorsThreeAndFourStallsNothing() throws {
        let daemon = try chattyDaemon("w-stray", configuration: #"{"quiet": true}"#)
        try daemon.start()
        let events = whens(["derive", "stray", "derive", "derive"], ids: "d")
        try send(events, to: daemon, chatReaches: 7)
        #expect(try daemon.pipeline("chat")?["restarts"] as? Int == 0, "\(daemon.log.suffix(3000))")
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 3, 4])
    }

    /// A record on which the worker dies every time (the plugin aborts) goes to the dead letters
    /// after `pipeline_retry_limit` deaths, with the reason, and the pipeline goes on. (It
    /// restarted on that record for ever, and nothing after it was handled.)
    @Test func aRecordTheWorkerKeepsDyingOnGoesToTheDeadLetters() throws {
        let daemon = try chattyDaemon(
            "w-crashloop", configuration: #"{"quiet": true}"#, settings: "pipeline_retry_limit = 3")
        try daemon.start()
        let events = whens(["derive", "crash", "derive"], ids: "c")
        try send(events, to: daemon, chatReaches: 5)
        let pipeline = try daemon.pipeline("chat")
        #expect(pipeline?["restarts"] as? Int == 3, "\(daemon.log.suffix(3000))")
        #expect(pipeline?["dead_letters"] as? Int == 1, "\(daemon.log.suffix(3000))")
        let dead =
            (try? String(contentsOfFile: daemon.stateDirectory + "/pipelines/chat/dead-letter.jsonl", encoding: .utf8))
            ?? ""
        #expect(dead.contains(#""_seq":2"#) && dead.contains("the worker died 3 times handling it"), "\(dead)")
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 3])
    }

    /// What a plugin derived in an attempt that failed is not stored: a record that fails twice
    /// and then passes derives once, as it would without the failures, and a replay stores
    /// nothing of a record that failed. (Live, each failed attempt's record was stored: three
    /// where one is derived; the replay printed the failed record's.)
    @Test func recordsDerivedInAFailedAttemptAreNotStored() throws {
        let daemon = try chattyDaemon("w-emitfail", configuration: #"{"quiet": true}"#)
        try daemon.start()
        let events = whens(["derive", "emitfail", "derive"], ids: "e")
        try send(events, to: daemon, chatReaches: 6)
        #expect(try daemon.pipeline("chat")?["failures"] as? Int == 2)
        #expect(daemon.stop() == 0)
        #expect(chattyCauses(daemon) == [1, 2, 3])
        let attempted = daemon.records().filter {
            $0["_origin"] as? String == "chatty" && $0["name"] as? String == "attempted"
        }
        #expect(attempted.count == 1)
        // Offline, once and without retries: the record fails, and derives nothing.
        let plugins = scratchDirectory("w-emitfail-plugins")
        let library = try buildTestPlugin("chatty", into: plugins, name: "chatty")
        let replay = try whenctl([
            "replay", "--state-dir", daemon.stateDirectory, "--plugin", library, "--plugin-config", #"{"quiet": true}"#,
        ])
        #expect(replay.status == 1, "\(replay.error)")
        #expect(replay.error.contains("1 failed"), "\(replay.error)")
        #expect(!replay.output.contains("attempted"), "\(replay.output)")
    }
}

/// A process's peak virtual memory (VmPeak), in bytes.
func peakVirtualMemory(_ pid: pid_t) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmPeak:") })
    else { return nil }
    return line.split(separator: " ").dropFirst().first.flatMap { Int($0) }.map { $0 * 1024 }
}
