import Foundation
import WhendJournal

/// A journal in memory for the tests of the ingest path: it numbers and keeps what it is given,
/// and commits when the test says (`start()`, then `commit()`, or at once once `start()` said
/// `.automatic`), so that back-pressure, acks and drains are seen step by step, without a disk
/// or a writer thread's timing in between.
final class InMemoryJournal: EventJournal, @unchecked Sendable {
    // Unchecked: every stored property is guarded by `lock`.
    enum Commits {
        /// Each batch is stored as it is submitted.
        case automatic
        /// Batches wait until `commit()`.
        case manual
    }

    private let lock = NSLock()
    /// Submitters hear back here, in order, never on the thread that submitted or committed (as
    /// from the real journal's own threads).
    private let completions = DispatchQueue(label: "in-memory-journal")
    private var commits: Commits
    private var waiting: [(JournalBatch, @Sendable (JournalCommit) -> Void)] = []
    private var stored: [[UInt8]] = []
    private var failure: CommitFailure?

    init(_ commits: Commits = .automatic) {
        self.commits = commits
    }

    func submit(_ batch: JournalBatch, completion: @escaping @Sendable (JournalCommit) -> Void) {
        let storeNow = lock.withLock {
            waiting.append((batch, completion))
            return commits == .automatic
        }
        if storeNow { commit() }
    }

    /// Stores every batch waiting, in order, and tells each submitter.
    func commit() {
        let (done, failure) = lock.withLock {
            defer { waiting = [] }
            return (waiting, self.failure)
        }
        for (batch, completion) in done {
            if let failure {
                completions.async { completion(.failed(failure)) }
                continue
            }
            let lastSeq: UInt64 = lock.withLock {
                var start = 0
                for end in batch.ends {
                    stored.append(Array(batch.bodies[start..<end]))
                    start = end
                }
                return UInt64(stored.count)
            }
            completions.async { completion(.stored(lastSeq: lastSeq)) }
        }
    }

    /// From now on batches are stored as they come; those waiting are stored now.
    func start() {
        lock.withLock { commits = .automatic }
        commit()
    }

    /// Every commit from now on fails with `failure` (nil: they succeed again).
    func fail(with failure: CommitFailure?) {
        lock.withLock { self.failure = failure }
    }

    var pendingBytes: Int { lock.withLock { waiting.reduce(0) { $0 + $1.0.bodies.count } } }

    var statistics: JournalStatistics {
        lock.withLock {
            var statistics = JournalStatistics(lastSeq: UInt64(stored.count))
            statistics.recordsStored = UInt64(stored.count)
            statistics.bytesWritten = UInt64(stored.reduce(0) { $0 + $1.count })
            statistics.failing = failure.map { "\($0)" }
            return statistics
        }
    }

    /// The bodies stored, in `_seq` order (each is what follows `{"_seq":N,`).
    var bodies: [String] { lock.withLock { stored.map { String(decoding: $0, as: UTF8.self) } } }
}
