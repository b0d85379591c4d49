import Foundation
import Testing

/// The journal's sync thread behind the writer, or stuck (held by Tests/Fixtures/syncgate.c):
/// a power cut then, or a stop.
@Suite(.serialized) struct LaggingSyncTests {
    /// The syncs are held (Tests/Fixtures/syncgate.c) while the writer writes and seals several
    /// small segments, then the power goes. whend starts again over what survived, takes more
    /// events, and `whenctl verify` passes: `_seq` from 1 without a gap, every segment but the
    /// last sealed, no acked event lost.
    @Test func aPowerCutWhileSyncsLagRotationLeavesAJournalVerifyAccepts() throws {
        let fs = PowerCutFileSystem("pc-lagsync")
        try fs.mount()
        let daemon = try fs.daemon("pc-lagsync", settings: "durability = fsync\nsegment_max_bytes = 4096\n")
        let gate = try daemon.holdingJournalSyncs(in: fs.directory)
        try daemon.start()

        // One event larger than a segment: the writer syncs it itself, then seals the segment,
        // whose sync goes to the sync thread, which is held from then on.
        let first = try daemon.sendingSegmentSizedEvent()
        #expect(first.stored == 1)
        // Events enough for several segments, written and sealed while no sync completes.
        let events = (0..<60).map { i in
            #"{"type":"when","name":"w\#(i)","id":"w\#(i)","params":{"pad":"\#(incompressible(200))"}}"# + "\n"
        }
        // In groups of ten: each group is written whole, and the segment rotated after it.
        let connection = try AckedConnection(daemon.socketPath)
        for group in stride(from: 0, to: events.count, by: 10) {
            try connection.connection.send(events[group..<group + 10].joined())
            usleep(100_000)
        }
        #expect(eventually(10) { FileManager.default.fileExists(atPath: gate + ".waiting") }, "no sync was held")
        #expect(
            eventually(10) { storedIDs(daemon.journal, whileWritten: true).contains("w59") },
            "the events were not written")
        #expect(daemon.journal.segments().count >= 3, "\(daemon.journal.segments())")

        daemon.crashWithWorkers()
        fs.cut()
        try fs.mount()
        unlink(gate)
        daemon.environment = [:]
        try daemon.start()
        let after = try AckedConnection.sending(
            (0..<5).map { #"{"type":"when","name":"a\#($0)","id":"a\#($0)"}"# + "\n" }.joined(),
            to: daemon.socketPath, answered: 5)
        #expect(after.stored == 5, "errors \(after.errors)")
        #expect(daemon.stop() == 0)

        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output) \(verify.error)")
        let ids = storedIDs(daemon.journal)
        #expect(ids.first == "big" && ids.suffix(5) == ["a0", "a1", "a2", "a3", "a4"], "\(ids)")
        fs.cut()
    }

    /// A sync that never returns does not hold a stop past `shutdown_timeout`: whend says why,
    /// exits with status 1 (before: alive until the sync returned, 23 s in an attack), and the
    /// next start recovers the journal with every acked event.
    @Test func aStuckSyncDoesNotHoldTheStopPastItsTimeout() throws {
        let directory = scratchDirectory("stuck-sync-stop")
        let daemon = TestDaemon.live(
            "stuck-sync-stop",
            arguments: ["--builtin-pipelines", "false", "--config", directory + "/whend.conf"],
            stateDirectory: directory + "/state")
        try "durability = fsync\nsegment_max_bytes = 4096\nshutdown_timeout = 1\n".write(
            toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let gate = try daemon.holdingJournalSyncs(in: directory)
        try daemon.start()
        defer { unlink(gate) }
        // Synced by the writer itself, then sealed: the seal's sync is held from then on.
        let first = try daemon.sendingSegmentSizedEvent()
        #expect(first.stored == 1)
        #expect(eventually(10) { FileManager.default.fileExists(atPath: gate + ".waiting") }, "no sync was held")

        let process = try #require(daemon.process)
        let stopped = Date()
        kill(process.processIdentifier, SIGTERM)
        let ended = eventually(8) { !process.isRunning }
        #expect(ended, "still running 8 s after SIGTERM with shutdown_timeout = 1")
        if !ended { unlink(gate) }
        process.waitUntilExit()
        #expect(Date().timeIntervalSince(stopped) < 8)
        #expect(process.terminationStatus == 1)
        #expect(daemon.log.contains("did not finish within shutdown_timeout (1 s)"), "\(daemon.log.suffix(2000))")

        unlink(gate)
        daemon.environment = [:]
        try daemon.start()
        let after = try AckedConnection.sending(
            #"{"type":"when","name":"after","id":"after"}"# + "\n", to: daemon.socketPath, answered: 1)
        #expect(after.stored == 1)
        #expect(daemon.stop() == 0)
        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output) \(verify.error)")
        #expect(storedIDs(daemon.journal) == ["big", "after"])
    }

    /// whend is killed while its syncs lag (segments written and sealed, none synced), starts
    /// again and acknowledges new events, then the power goes. What the killed whend wrote is
    /// made durable by the next start before it acknowledges anything after it: after the cut,
    /// `verify` is clean, `_seq` without a gap, the new events kept (before: the old segments,
    /// never synced, were torn out of the middle of the journal, a gap for good with
    /// acknowledged events after it; an outside attack, with the de-duplication window off or
    /// past its reach).
    @Test func aStartSyncsWhatTheKilledWhendLeftUnsyncedBeforeAcknowledging() throws {
        let fs = PowerCutFileSystem("pc-killed-lag")
        try fs.mount()
        let daemon = try fs.daemon(
            "pc-killed-lag", settings: "durability = fsync\nsegment_max_bytes = 4096\ndedup_window = 0\n")
        let gate = try daemon.holdingJournalSyncs(in: fs.directory)
        try daemon.start()
        let first = try daemon.sendingSegmentSizedEvent()
        #expect(first.stored == 1)
        let connection = try AckedConnection(daemon.socketPath)
        for group in 0..<6 {
            let events = (0..<10).map { i in
                #"{"type":"when","name":"w","id":"w\#(group)-\#(i)","params":{"pad":"\#(incompressible(200))"}}"#
            }
            try connection.connection.send(events.map { $0 + "\n" }.joined())
            usleep(100_000)
        }
        #expect(eventually(10) { FileManager.default.fileExists(atPath: gate + ".waiting") }, "no sync was held")
        #expect(eventually(10) { storedIDs(daemon.journal, whileWritten: true).contains("w5-9") })
        #expect(daemon.journal.segments().count >= 3, "\(daemon.journal.segments())")

        // Killed (not a power cut: what it wrote stays in the page cache), and started again.
        daemon.crashWithWorkers()
        unlink(gate)
        daemon.environment = [:]
        try daemon.start()
        let after = try AckedConnection.sending(
            (0..<5).map { #"{"type":"when","name":"a","id":"a\#($0)"}"# + "\n" }.joined(), to: daemon.socketPath,
            answered: 5)
        #expect(after.stored == 5, "errors \(after.errors)")

        daemon.crashWithWorkers()
        fs.cut()
        try fs.mount()
        try daemon.start()
        #expect(daemon.stop() == 0)
        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output) \(verify.error)")
        let ids = storedIDs(daemon.journal)
        for id in ["big", "a0", "a1", "a2", "a3", "a4"] {
            #expect(ids.contains(id), "\(id) was acked and is lost: \(ids)")
        }
        fs.cut()
    }

    /// Records written under `durability = write` (never synced), then a reload to `fsync` and
    /// new events acknowledged: those are acknowledged as durable only once what was written
    /// before them is, so a power cut leaves no gap before them.
    @Test func aReloadToFsyncSyncsWhatWasWrittenBeforeAcknowledgingAfterIt() throws {
        let fs = PowerCutFileSystem("pc-reload-fsync")
        try fs.mount()
        let daemon = try fs.daemon("pc-reload-fsync", settings: "durability = write\nsegment_max_bytes = 4096\n")
        try daemon.start()
        let events = (0..<60).map { i in
            #"{"type":"when","name":"w","id":"w\#(i)","params":{"pad":"\#(incompressible(200))"}}"# + "\n"
        }
        // Ten at a time: each ten written whole, and the segment rotated after them.
        for group in stride(from: 0, to: events.count, by: 10) {
            let sent = try AckedConnection.sending(
                events[group..<group + 10].joined(), to: daemon.socketPath, answered: 10)
            #expect(sent.stored == 10)
        }
        #expect(daemon.journal.segments().count >= 3, "\(daemon.journal.segments())")

        try "durability = fsync\nsegment_max_bytes = 4096\n".write(
            toFile: fs.configurationFile, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "\(reload.output) \(reload.error)")
        let after = try AckedConnection.sending(
            (0..<5).map { #"{"type":"when","name":"a","id":"a\#($0)"}"# + "\n" }.joined(), to: daemon.socketPath,
            answered: 5)
        #expect(after.stored == 5, "errors \(after.errors)")

        let seen = try fs.cutPower(under: daemon)
        for id in ["a0", "a1", "a2", "a3", "a4"] {
            #expect(seen.contains(id), "\(id) was acked under fsync and is lost")
        }
        try daemon.start()
        #expect(daemon.stop() == 0)
        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output) \(verify.error)")
        fs.cut()
    }
}
