import Foundation
import Testing
import WhendJournal
import WhendWire

@Suite(.serialized) struct FaultTests {
    @Test(.enabled(if: canMountTmpfs(), "needs to mount a small tmpfs (root in a sandbox that allows it)"))
    func aReadOnlyJournalAnswersUnavailableAndRecoversWhenWritableAgain() throws {
        let stateDirectory = scratchDirectory("ro-mnt")
        #expect(mount(stateDirectory, size: "4m"))
        defer { unmount(stateDirectory) }
        let daemon = TestDaemon("readonly", stateDirectory: stateDirectory)
        try daemon.start()
        // The filesystem turns read-only under the running daemon.
        #expect((try runCommand("/bin/mount", ["-o", "remount,ro", stateDirectory])).status == 0)
        let refused = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A","id":"a"}"#])
        #expect(refused.errors.map(\.code) == ["unavailable"])
        #expect(refused.errors.first?.message.contains("read-only") == true)
        #expect(refused.acks.last == 1)  // answered, not stored
        #expect((try runCommand("/bin/mount", ["-o", "remount,rw", stateDirectory])).status == 0)
        let stored = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"B","id":"b"}"#])
        #expect(stored.errors.isEmpty, "\(stored.errors)")
        daemon.stop()
        #expect(daemon.records().compactMap { $0["id"] as? String } == ["b"])
        #expect(daemon.records().first?["_seq"] as? Int == 1)
    }

    @Test func aSealedSegmentCorruptedInTheMiddleIsNamedSkippedAndWritingGoesOn() throws {
        let daemon = TestDaemon("corrupt", arguments: ["--segment-max-bytes", "4096"])
        try daemon.start()
        try sendNoisyParts(daemon, 0..<6)
        let segments = daemon.journal.segments()
        try #require(segments.count >= 3)
        let victim = segments[1]
        let victimRecords = Int(try #require(SegmentIndex.read(fromFileAt: victim.path)).recordCount)
        // Damage it while whend runs, then keep writing.
        var bytes = Array(try Data(contentsOf: URL(fileURLWithPath: victim.path)))
        for i in (bytes.count / 2)..<(bytes.count / 2 + 16) { bytes[i] ^= 0x5A }
        try Data(bytes).write(to: URL(fileURLWithPath: victim.path))
        // Enough to rotate at least once more (about 45 of these fit in a 4 KiB segment).
        try sendNoisyParts(daemon, 6..<10)
        #expect(daemon.journal.segments().count > segments.count)

        let verify = try runCommand(executable("whenctl"), ["verify", "--json", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 1)
        let report = try #require(try JSONSerialization.jsonObject(with: Data(verify.output.utf8)) as? [String: Any])
        let problems = try #require(report["problems"] as? [[String: Any]])
        #expect(!problems.isEmpty && problems.allSatisfy { $0["file"] as? String == victim.path })

        let cat = try runCommand(executable("whenctl"), ["cat", "--state-dir", daemon.stateDirectory])
        #expect(cat.status == 1)
        #expect(cat.error.contains("warning") && cat.error.contains(victim.path))
        #expect(cat.output.split(separator: "\n").count >= 300 - victimRecords)
        // A restart over the damaged journal carries on too.
        daemon.stop()
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"Z"}"#]).acks.last == 1)
        daemon.stop()
        let last = try runCommand(
            executable("whenctl"), ["cat", "--from", "301", "--state-dir", daemon.stateDirectory])
        #expect(last.output.contains("\"_seq\":301"))
    }
}
