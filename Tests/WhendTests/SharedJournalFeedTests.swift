import Foundation
import SeededRandom
import Synchronization
import Testing
import WhendJournal
import WhendPipelines
import WhendSystem

/// The shared host's one reading of the journal (`SharedJournalFeed`), on a real journal that a
/// real writer writes meanwhile, with pipelines as threads that read through it.
@Suite(.serialized) struct SharedJournalFeedTests {
    /// What one pipeline was shown, from where it started.
    struct Session {
        var from: UInt64
        var records: [(seq: UInt64, line: [UInt8])] = []
    }

    /// A journal with segments and frames small enough that a run crosses many of them.
    func journal(_ name: String) throws -> (JournalDirectory, JournalWriter) {
        let directory = JournalDirectory(path: scratchDirectory(name) + "/journal")
        try DurableFile.createDirectory(directory.path)
        var configuration = JournalConfiguration(directory: directory)
        configuration.segmentMaxBytes = 96 << 10
        configuration.frameBytes = 8 << 10
        let writer = try JournalWriter(configuration: configuration)
        writer.start()
        return (directory, writer)
    }

    func write(_ writer: JournalWriter, _ count: Int, _ random: inout SplitMix64) {
        var batch = JournalBatch()
        for _ in 0..<count {
            let pad = String(repeating: "x", count: Int.random(in: 0...300, using: &random))
            let body =
                #""type":"when","name":"n\#(UInt32.random(in: 0...999, using: &random))","app":"a","pad":"\#(pad)","_rt":"2026-11-27T03:00:00.000000Z","_pid":1,"_uid":0,"_gid":0,"_comm":"t"}"#
            batch.bodies += Array(body.utf8)
            batch.ends.append(batch.bodies.count)
        }
        batch.minReceivedMicros = 0
        batch.maxReceivedMicros = 0
        let done = DispatchSemaphore(value: 0)
        writer.submit(batch) { _ in done.signal() }
        done.wait()
    }

    /// What a reader of its own shows from `from` on, as many records as `count`.
    func ownReading(_ directory: JournalDirectory, from: UInt64, count: Int) -> [(UInt64, [UInt8])] {
        var records: [(UInt64, [UInt8])] = []
        guard count > 0 else { return records }
        JournalReader(directory: directory).read(fromSeq: from) { record, _ in
            records.append((record.seq ?? 0, Array(record.line)))
            return records.count < count
        } onProblem: {
            Issue.record("\($0)")
        }
        return records
    }

    /// For any schedule — pipelines starting anywhere (behind the others, at the head, past
    /// it), each at its own pace, some stalling long enough to lose their place, stopping and
    /// starting again, while the journal is written — each pipeline is shown exactly what a
    /// reader of its own would show it from where it started: every `_seq`, in order, the
    /// same bytes, nothing skipped or given twice.
    @Test(arguments: [1, 2, 3, 4] as [UInt64]) func everyPipelineSeesWhatItsOwnReaderWould(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let (directory, writer) = try journal("feed-\(seed)")
        write(writer, 2000, &random)
        let written = Atomic<UInt64>(2000)
        let writing = Atomic<Bool>(true)
        let stop = Atomic<Bool>(false)
        // Small batches and a small window: the leader waits for room, and evicts.
        let feed = SharedJournalFeed(directory: directory, batchBytes: 16 << 10, windowBytes: 96 << 10) {
            stop.load(ordering: .relaxed)
        }
        let pipelines = 4
        let sessions = Mutex<[[Session]]>(Array(repeating: [], count: pipelines))
        let finished = DispatchGroup()
        for pipeline in 0..<pipelines {
            finished.enter()
            Thread {
                defer { finished.leave() }
                var own = SplitMix64(state: seed &* 1000 &+ UInt64(pipeline))
                var round = 0
                while round < 6 {
                    round += 1
                    let last = written.load(ordering: .relaxed)
                    let from = UInt64.random(in: 1...(last + 20), using: &own)
                    let limit = Int.random(in: 1...4000, using: &own)
                    // Slow pipelines sleep now and then; some stall past the feed's patience.
                    let pace = Int.random(in: 0...3, using: &own)
                    var session = Session(from: from)
                    var stepRandom = SplitMix64(state: own.next())
                    feed.read(
                        fromSeq: from,
                        body: { record in
                            session.records.append((record.seq ?? 0, Array(record.line)))
                            if pace > 0, Int.random(in: 0..<(200 * pace), using: &stepRandom) == 0 {
                                usleep(pace == 3 ? 250_000 : 2_000)
                            }
                            return session.records.count < limit
                        },
                        onCaughtUp: { writing.load(ordering: .relaxed) },
                        onProblem: { Issue.record("\($0)") })
                    sessions.withLock { $0[pipeline].append(session) }
                }
            }.start()
        }
        for _ in 0..<30 {
            let count = Int.random(in: 1...300, using: &random)
            write(writer, count, &random)
            written.add(UInt64(count), ordering: .relaxed)
            usleep(UInt32.random(in: 0...40_000, using: &random))
        }
        writing.store(false, ordering: .relaxed)
        #expect(finished.wait(timeout: .now() + 120) == .success, "a pipeline never finished")
        stop.store(true, ordering: .relaxed)
        writer.shutdown()
        var shown = 0
        for (pipeline, list) in sessions.withLock({ $0 }).enumerated() {
            for session in list {
                let expected = ownReading(directory, from: session.from, count: session.records.count)
                shown += session.records.count
                let differs = zip(session.records, expected).enumerated().first {
                    $1.0.seq != $1.1.0 || $1.0.line != $1.1.1
                }?.offset
                #expect(
                    differs == nil && expected.count == session.records.count,
                    """
                    pipeline \(pipeline) from _seq \(session.from): record \(differs ?? expected.count) is \
                    _seq \(differs.map { session.records[$0].seq } ?? 0), its own reader shows \
                    \(differs.map { expected[$0].0 } ?? 0) (\(session.records.count) shown, \(expected.count) in the journal)
                    """
                )
            }
        }
        #expect(shown > 0)
        #expect(feed.recordsShared.load(ordering: .relaxed) + feed.recordsReadAlone.load(ordering: .relaxed) == shown)
    }

    /// Pipelines that start together at one pace read the journal once between them: nearly
    /// every record reaches them from the leader's batches, not from readers of their own.
    @Test func pipelinesAtOnePaceShareOneReading() throws {
        var random = SplitMix64(state: 7)
        let (directory, writer) = try journal("feed-shared")
        for _ in 0..<20 { write(writer, 1000, &random) }
        writer.shutdown()
        let stop = Atomic<Bool>(false)
        let feed = SharedJournalFeed(directory: directory) { stop.load(ordering: .relaxed) }
        let finished = DispatchGroup()
        for _ in 0..<4 {
            finished.enter()
            Thread {
                defer { finished.leave() }
                var seen = 0
                feed.read(
                    fromSeq: 1,
                    body: { _ in
                        seen += 1
                        return seen < 20_000
                    }, onCaughtUp: { false }, onProblem: { Issue.record("\($0)") })
            }.start()
        }
        #expect(finished.wait(timeout: .now() + 60) == .success)
        stop.store(true, ordering: .relaxed)
        let shared = feed.recordsShared.load(ordering: .relaxed)
        let alone = feed.recordsReadAlone.load(ordering: .relaxed)
        #expect(shared + alone == 80_000)
        #expect(alone < 8_000, "\(alone) of 80,000 records read alone")
        print("shared reading: \(shared) of 80,000 records from the leader's batches, \(alone) read alone")
    }
}
