import Foundation
import Testing

/// The pipelines read the journal's files, where a record is as soon as it is written, before
/// its sync: they must handle nothing whend has not stored. A power cut takes what was written
/// and not synced; a cursor saved past it then claimed records the journal no longer held (a
/// power-cut round of `make test` found analytics' cursor at 5,133 over a journal of 5,132),
/// and the pipeline would have skipped the record that took `_seq` 5,133 next.
struct StoredBoundTests {
    /// With the journal's syncs held (Tests/Fixtures/syncgate.c), events are written and none is
    /// stored: no pipeline's cursor passes the last record stored, however long they wait; once
    /// the syncs go on, every pipeline handles every event.
    @Test func noPipelineHandlesARecordWhendHasNotStored() throws {
        let (daemon, _) = try builtinPipelineDaemon(
            "stored-bound", keeping: "screens",
            settings: ["durability = fsync", "segment_max_bytes = 4096", "pipeline.everything = analytics"])
        let gate = try daemon.holdingJournalSyncs(in: daemon.directory)
        try daemon.start()
        defer { unlink(gate) }

        // One event larger than a segment: the writer syncs it itself, then seals the segment,
        // whose sync goes to the sync thread, which is held from then on.
        let first = try daemon.sendingSegmentSizedEvent()
        #expect(first.stored == 1)
        let events = (0..<40).map { i in
            [
                #"{"type":"navigation","action":"push","screen":"S\#(i)","id":"n\#(i)"}"#,
                #"{"type":"when","name":"w\#(i)","id":"w\#(i)"}"#,
            ]
        }.flatMap { $0 }
        let connection = try AckedConnection(daemon.socketPath)
        try connection.connection.send(events.map { $0 + "\n" }.joined())
        #expect(eventually(10) { FileManager.default.fileExists(atPath: gate + ".waiting") }, "no sync was held")
        #expect(
            eventually(10) { storedIDs(daemon.journal, whileWritten: true).contains("w39") },
            "the events were not written")
        // Time for the pipelines to read them, handle them and save their cursors (every 0.1 s),
        // were they to.
        usleep(1_500_000)
        try connection.read(until: events.count, seconds: 0.2)
        #expect(connection.stored == 0, "acknowledged before their sync")
        func cursors() -> [UInt64?] {
            ["screens", "everything"].map { name in
                (try? String(contentsOfFile: daemon.stateDirectory + "/pipelines/\(name)/cursor", encoding: .utf8))
                    .flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            }
        }
        #expect(cursors().allSatisfy { ($0 ?? .max) <= 1 }, "handled records not stored: \(cursors())")

        unlink(gate)
        try connection.read(until: events.count, seconds: 10)
        #expect(connection.stored == events.count)
        #expect(eventually(20) { cursors().allSatisfy { ($0 ?? 0) > UInt64(events.count) } }, "\(cursors())")
        #expect(daemon.stop() == 0)
    }
}
