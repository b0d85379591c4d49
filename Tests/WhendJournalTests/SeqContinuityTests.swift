import Foundation
import SeededRandom
import Testing
import WhendRecord
import WhendWire

@testable import WhendJournal

extension JournalWriterTests {
    /// `_seq` names one record for ever: whatever retention deletes and however often whend
    /// stops or dies between commits, the next record stored takes the next number. Pipelines'
    /// cursors, subscribers resuming and `whenctl tail --from` all rely on it; before, once
    /// retention had deleted every record, a restart began again at 1.
    ///
    /// Seeded schedules of commits, time passing (rotation by age, then retention deletes every
    /// sealed segment, as all are older than its limit on this clock), clean restarts, and the
    /// state a kill leaves just after a new segment replaced the empty one that held the place.
    @Test(arguments: 0..<40) func everyRecordTakesTheNextSeqWhateverRetentionAndRestartsDo(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let directory = JournalDirectory(path: temporaryDirectory("seq-\(seed)"))
        var configuration = JournalConfiguration(directory: directory)
        configuration.segmentMaxAge = 60
        configuration.retentionMaxAge = 3600
        let clock = ManualWallClock()
        func open() throws -> JournalWriter {
            let writer = try JournalWriter(configuration: configuration, now: { clock.now })
            writer.start(heartbeatInterval: 0.01)
            return writer
        }
        var writer = try open()
        var stored: UInt64 = 0
        var schedule: [String] = []
        for step in 0..<24 {
            switch random.int(5) {
            case 0, 1:
                let n = 1 + random.int(3)
                schedule.append("store \(n)")
                let commit = submitAndWait(writer, batch((0..<n).map { (Self.screen, "\(seed)-\(step)-\($0)") }))
                stored += UInt64(n)
                try #require(commit == .stored(lastSeq: stored), "seed \(seed): \(schedule)")
            case 2:
                schedule.append("age")
                clock.advance(seconds: 61)
                let deadline = Date().addingTimeInterval(10)
                while !readAll(directory).lines.isEmpty, Date() < deadline { usleep(2000) }
                try #require(readAll(directory).lines.isEmpty, "seed \(seed): retention did not run: \(schedule)")
            case 3:
                schedule.append("restart")
                writer.shutdown()
                writer = try open()
            default:
                schedule.append("killed while replacing")
                writer.shutdown()
                // A kill between the rename of the new segment over the empty one and its first
                // record leaves an empty, unsealed file of that name.
                if let last = directory.segments().last,
                    SegmentWriter.isEmptySealed(last.path, firstSeq: last.firstSeq)
                {
                    try #require(truncate(last.path, 0) == 0)
                }
                writer = try open()
            }
        }
        let commit = submitAndWait(writer, batch([(Self.screen, "\(seed)-last")]))
        #expect(commit == .stored(lastSeq: stored + 1), "seed \(seed): \(schedule)")
        writer.shutdown()
        let report = JournalVerifier(directory: directory).verify()
        #expect(report.isClean, "seed \(seed): \(report.problems) after \(schedule)")
    }
}
