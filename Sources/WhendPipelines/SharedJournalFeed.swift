import DequeModule
import Foundation
import Synchronization
import WhendJournal

/// One reading of the journal for every pipeline of the shared host: a leader reads each
/// segment frame once (decompresses it, splits its lines, reads their `_seq`) into batches,
/// and the pipelines near the journal's head take their records from those batches instead of
/// each reading the journal again. A pipeline behind the batches, or ahead of them, reads the
/// journal itself, as every pipeline did, and joins them once its next record is theirs.
/// Either way a pipeline sees what its own reader would show it: every record from its
/// position on, in order, the same bytes (`SharedJournalFeedTests`).
///
/// The leader reads only while a pipeline waits for what it reads, and keeps at most
/// `windowBytes` of batches, the oldest still wanted by the slowest pipeline that takes them:
/// the faster pipelines wait for it, and so share one reading, as long as it moves. One that
/// has not moved for `stallSeconds` (a plugin retrying with backoff, a record that takes long)
/// loses its place when the leader needs room, and reads the journal itself from then on.
package final class SharedJournalFeed: @unchecked Sendable {
    // Unchecked: everything mutable is under `condition`, but `Reader.next` (atomic) and the
    // batches, which are written by the leader before they are published and never after.

    /// Records the leader read, one segment's, in order: the lines' bytes end to end. Written
    /// whole before it is published, and never after: readers take it without a lock.
    final class Batch: Sendable {
        struct Entry {
            /// Where its line ends in `bytes`.
            let end: Int
            let seq: UInt64
            let frameOffset: Int64
        }

        let segment: String
        /// Every `_seq` from this one through `lastSeq` is here or not in the journal.
        let fromSeq: UInt64
        let lastSeq: UInt64
        let bytes: [UInt8]
        let entries: [Entry]
        /// Damage the leader met before this batch's first record.
        let problems: [JournalProblem]

        fileprivate init(_ builder: Builder) {
            segment = builder.segment
            fromSeq = builder.fromSeq
            lastSeq = builder.lastSeq
            bytes = builder.bytes
            entries = builder.entries
            problems = builder.problems
        }
    }

    /// A batch as the leader fills it.
    fileprivate struct Builder {
        let segment: String
        let fromSeq: UInt64
        var lastSeq: UInt64
        var bytes: [UInt8] = []
        var entries: [Batch.Entry] = []
        var problems: [JournalProblem]

        init(segment: String, fromSeq: UInt64, problems: [JournalProblem], capacity: Int) {
            self.segment = segment
            self.fromSeq = fromSeq
            lastSeq = fromSeq &- 1
            self.problems = problems
            // Filled without growing (each growth copied it, on pages new to the process).
            bytes.reserveCapacity(capacity + (64 << 10))
            entries.reserveCapacity(capacity / 128)
        }

        mutating func append(_ record: JournalRecord, seq: UInt64) {
            bytes.append(contentsOf: record.line)
            entries.append(Batch.Entry(end: bytes.count, seq: seq, frameOffset: record.frameOffset))
            lastSeq = seq
        }
    }

    /// A pipeline reading through the feed.
    final class Reader: @unchecked Sendable {
        /// The `_seq` it wants next (whether it reads the batches or the journal).
        let next: Atomic<UInt64>
        /// Whether it takes the batches now; under the feed's `condition`.
        fileprivate var joined = false
        /// When it last took a batch or a record of the journal, in milliseconds of
        /// `coarseMonotonicSeconds`.
        fileprivate let movedAt = Atomic<Int>(0)

        fileprivate func moved() { movedAt.store(Int(coarseMonotonicSeconds() * 1000), ordering: .relaxed) }
        /// It was told it caught up since it last took a batch; under the feed's `condition`.
        fileprivate var toldCaughtUp = false
        /// The head at which it last woke the leader; under the feed's `condition`.
        fileprivate var wokeLeaderAt: UInt64 = .max

        init(next: UInt64) { self.next = Atomic(next) }
    }

    /// A batch is published once this many bytes of records are in it.
    let batchBytes: Int
    /// The batches kept at most, in bytes of records.
    let windowBytes: Int
    /// Records readers took from the batches, and records they read from the journal
    /// themselves: what the one reading saved, and what it did not.
    package let recordsShared = Atomic<Int>(0)
    package let recordsReadAlone = Atomic<Int>(0)
    /// A pipeline that took no batch for this long loses its place when the leader needs room.
    static let stallSeconds = 0.1

    package let directory: JournalDirectory
    private let condition = NSCondition()
    private var window: Deque<Batch> = []
    private var windowBytesHeld = 0
    /// The last `_seq` the published batches cover.
    private var head: UInt64 = 0
    private var leader: Thread?
    private var leaderEnded = false
    /// The leader has read everything there is, for now.
    private var leaderCaughtUp = false
    private var readers: [ObjectIdentifier: Reader] = [:]
    /// What the batches cover, for a reader of the journal to ask without the lock: from
    /// `coverFrom` through `head`; `coverFrom` > `head` + 1 while there is no leader.
    private let coverFrom = Atomic<UInt64>(.max)
    private let coverThrough = Atomic<UInt64>(0)
    /// The process stops: the leader reads no more.
    private let stopping: @Sendable () -> Bool

    package init(
        directory: JournalDirectory, batchBytes: Int = 256 << 10, windowBytes: Int = 16 << 20,
        stopping: @escaping @Sendable () -> Bool
    ) {
        self.directory = directory
        self.batchBytes = batchBytes
        self.windowBytes = windowBytes
        self.stopping = stopping
    }

    // MARK: - A pipeline's side

    /// Calls `body` for every record with `_seq ≥ fromSeq`, in order, following the journal, as
    /// `JournalReader.read(fromSeq:follow:true…)` does, until `body` or `onCaughtUp` returns
    /// false. `onCaughtUp`: nothing more to read for now (called at least every `pollInterval`
    /// while that lasts).
    package func read(
        fromSeq: UInt64, body: (JournalRecord) -> Bool, onCaughtUp: () -> Bool,
        onProblem: (JournalProblem) -> Void
    ) {
        let reader = Reader(next: fromSeq)
        register(reader)
        defer { unregister(reader) }
        while true {
            switch take(reader) {
            case .batch(let batch, let first):
                if first == 0 { for problem in batch.problems { onProblem(problem) } }
                if !consume(batch, from: first, reader: reader, body: body) { return }
            case .waitedAtHead:
                if !onCaughtUp() { return }
            case .readJournal:
                switch readJournal(reader, body: body, onCaughtUp: onCaughtUp, onProblem: onProblem) {
                case .stopped: return
                case .joinable: continue
                }
            }
        }
    }

    private enum Take {
        case batch(Batch, first: Int)
        /// At the head with nothing new within `pollInterval`.
        case waitedAtHead
        case readJournal
    }

    static let pollInterval = 0.1

    /// The batch that holds the reader's next record, if the batches have it; at their head,
    /// waits a while for the next one, or says at once that the leader has read everything.
    private func take(_ reader: Reader) -> Take {
        condition.lock()
        defer { condition.unlock() }
        let next = reader.next.load(ordering: .relaxed)
        let deadline = Date().addingTimeInterval(Self.pollInterval)
        while true {
            let from = window.first?.fromSeq ?? (head &+ 1)
            guard leader != nil, !leaderEnded, from <= next, next <= head &+ 1 else {
                reader.joined = false
                return .readJournal
            }
            reader.joined = true
            reader.moved()
            // What every reader has passed goes now, not at the leader's next batch: caught
            // up, they held the last 16 MiB for as long as nothing new came.
            dropTaken()
            if next <= head, let index = batchIndex(holding: next) {
                reader.toldCaughtUp = false
                let batch = window[index]
                // The first record at `next` or after (none before it is in the journal).
                var low = 0
                var high = batch.entries.count
                while low < high {
                    let mid = (low + high) / 2
                    if batch.entries[mid].seq < next { low = mid + 1 } else { high = mid }
                }
                return .batch(batch, first: low)
            }
            // At the head. Told at once when the leader has read all there is, as a reader of
            // the journal is at its end; then every `pollInterval` while nothing comes.
            if leaderCaughtUp && !reader.toldCaughtUp {
                reader.toldCaughtUp = true
                return .waitedAtHead
            }
            // The leader reads on for it: woken once per head, not at every wake of this
            // reader (readers at the head woke each other, round and round, till their deadline).
            if reader.wokeLeaderAt != head {
                reader.wokeLeaderAt = head
                condition.broadcast()
            }
            guard condition.wait(until: deadline) else { return .waitedAtHead }
        }
    }

    private func batchIndex(holding seq: UInt64) -> Int? {
        var low = 0
        var high = window.count
        while low < high {
            let mid = (low + high) / 2
            if window[mid].lastSeq < seq { low = mid + 1 } else { high = mid }
        }
        return low < window.count && window[low].fromSeq <= seq ? low : nil
    }

    /// The batch's records from `first` on; false to stop reading.
    private func consume(_ batch: Batch, from first: Int, reader: Reader, body: (JournalRecord) -> Bool) -> Bool {
        let segment = batch.segment
        // Through pointers: the arrays of a batch read in a loop around a call the compiler
        // cannot see into were retained and released at every record.
        let done = batch.bytes.withUnsafeBufferPointer { bytes in
            batch.entries.withUnsafeBufferPointer { entries -> Int? in
                var start = first == 0 ? 0 : entries[first - 1].end
                for i in first..<entries.count {
                    let entry = entries[i]
                    let record = JournalRecord(
                        line: UnsafeBufferPointer(rebasing: bytes[start..<entry.end]), seq: entry.seq,
                        segment: segment, frameOffset: entry.frameOffset)
                    start = entry.end
                    guard body(record) else { return i }
                }
                return nil
            }
        }
        if let stopped = done {
            reader.next.store(batch.entries[stopped].seq, ordering: .relaxed)
            recordsShared.add(stopped - first + 1, ordering: .relaxed)
            return false
        }
        reader.next.store(batch.lastSeq &+ 1, ordering: .relaxed)
        recordsShared.add(batch.entries.count - first, ordering: .relaxed)
        return true
    }

    private enum OwnReading { case stopped, joinable }

    /// Reads the journal itself from the reader's next record until the batches hold the next
    /// one (or it is at their head).
    private func readJournal(
        _ reader: Reader, body: (JournalRecord) -> Bool, onCaughtUp: () -> Bool, onProblem: (JournalProblem) -> Void
    ) -> OwnReading {
        var outcome = OwnReading.stopped
        func joinable() -> Bool {
            let next = reader.next.load(ordering: .relaxed)
            return coverFrom.load(ordering: .acquiring) <= next && next <= coverThrough.load(ordering: .acquiring) &+ 1
        }
        JournalReader(directory: directory).read(
            fromSeq: reader.next.load(ordering: .relaxed), follow: true,
            body: { record, _ in
                recordsReadAlone.add(1, ordering: .relaxed)
                reader.moved()
                guard body(record) else { return false }
                if let seq = record.seq { reader.next.store(seq &+ 1, ordering: .relaxed) }
                if joinable() {
                    outcome = .joinable
                    return false
                }
                return true
            },
            onCaughtUp: {
                if joinable() {
                    outcome = .joinable
                    return false
                }
                // Ahead of the leader: it reads on towards this reader.
                condition.withLock { condition.broadcast() }
                return onCaughtUp()
            },
            onProblem: onProblem)
        return outcome
    }

    private func register(_ reader: Reader) {
        reader.moved()
        condition.withLock {
            readers[ObjectIdentifier(reader)] = reader
            guard leader == nil || leaderEnded, !stopping() else { return }
            // The first pipeline's position is where the one reading starts.
            let start = reader.next.load(ordering: .relaxed)
            window.removeAll()
            windowBytesHeld = 0
            head = start &- 1
            leaderEnded = false
            leaderCaughtUp = false
            publishCover()
            let thread = Thread { [self] in lead(from: start) }
            thread.name = "whend-journal"
            leader = thread
            thread.start()
        }
    }

    private func unregister(_ reader: Reader) {
        condition.withLock {
            readers[ObjectIdentifier(reader)] = nil
            condition.broadcast()
        }
    }

    private func publishCover() {
        coverFrom.store(leaderEnded ? .max : (window.first?.fromSeq ?? (head &+ 1)), ordering: .releasing)
        coverThrough.store(head, ordering: .releasing)
    }

    // MARK: - The leader

    private func lead(from start: UInt64) {
        var current: Builder?
        // Damage met: told with the next records, to the readers that take them from the start.
        var problems: [JournalProblem] = []
        var nextFrom = start
        func publish() -> Bool {
            guard let builder = current else { return !stopping() }
            current = nil
            return append(Batch(builder))
        }
        JournalReader(directory: directory).read(
            fromSeq: start, follow: true,
            body: { record, _ in
                // A line without `_seq`: no pipeline handles it. One before what was read: the
                // file was replaced and holds it again.
                guard let seq = record.seq, seq >= nextFrom else { return true }
                if let builder = current, builder.segment != record.segment || builder.bytes.count >= batchBytes {
                    guard publish() else { return false }
                }
                if current == nil {
                    current = Builder(
                        segment: record.segment, fromSeq: nextFrom, problems: problems, capacity: batchBytes)
                    problems = []
                }
                current!.append(record, seq: seq)
                nextFrom = seq &+ 1
                return true
            },
            onCaughtUp: {
                guard publish() else { return false }
                condition.withLock {
                    leaderCaughtUp = true
                    condition.broadcast()
                }
                return !stopping()
            },
            onProblem: { problem in
                guard publish() else { return }
                problems.append(problem)
            })
        condition.withLock {
            leaderEnded = true
            publishCover()
            condition.broadcast()
        }
    }

    /// Publishes `batch` once a reader wants it and there is room; false when the process stops.
    private func append(_ batch: Batch) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard waitForDemandLocked() else { return false }
        dropTaken()
        while windowBytesHeld > 0 && windowBytesHeld + batch.bytes.count > windowBytes {
            // The slowest reader holds the oldest batch: the others wait for it while it moves.
            let now = Int(coarseMonotonicSeconds() * 1000)
            let oldest = window.first!
            let holders = readers.values.filter { holds($0, oldest) }
            if holders.allSatisfy({ now - $0.movedAt.load(ordering: .relaxed) >= Int(Self.stallSeconds * 1000) }) {
                for holder in holders { holder.joined = false }
                evictOldest()
                continue
            }
            if stopping() { return false }
            _ = condition.wait(until: Date().addingTimeInterval(Self.stallSeconds / 4))
            dropTaken()
        }
        window.append(batch)
        windowBytesHeld += batch.bytes.count
        head = batch.lastSeq
        leaderCaughtUp = false
        publishCover()
        condition.broadcast()
        return true
    }

    /// Drops the oldest batches no reader holds.
    private func dropTaken() {
        while let oldest = window.first, !readers.values.contains(where: { holds($0, oldest) }) { evictOldest() }
        publishCover()
    }

    /// Whether `reader` still needs `batch`: it takes the batches and has not passed it, or it
    /// reads the journal itself close enough behind to join at it (a pipeline that started a
    /// little after the others: it joins them rather than read alone for good). One far
    /// behind (a pipeline catching up) holds nothing: the others do not wait for it.
    private func holds(_ reader: Reader, _ batch: Batch) -> Bool {
        let next = reader.next.load(ordering: .relaxed)
        guard next <= batch.lastSeq else { return false }
        if reader.joined { return true }
        let from = window.first?.fromSeq ?? batch.fromSeq
        return next &+ max(head &- from &+ 1, Self.joinDistance) >= from
    }

    /// How far behind the batches a reader of the journal holds them, in records, at least.
    static let joinDistance: UInt64 = 1 << 16

    private func evictOldest() {
        let oldest = window.removeFirst()
        windowBytesHeld -= oldest.bytes.count
        publishCover()
    }

    /// Waits until a reader is at the batches' head or past it (it wants what is read next);
    /// false when the process stops.
    private func waitForDemandLocked() -> Bool {
        while !stopping() {
            if readers.values.contains(where: { $0.next.load(ordering: .relaxed) > head }) { return true }
            _ = condition.wait(until: Date().addingTimeInterval(Self.pollInterval))
        }
        return false
    }
}
