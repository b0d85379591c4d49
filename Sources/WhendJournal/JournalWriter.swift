import Foundation
import WhendSystem
import WhendWire

/// The one place that orders records: it gives each its `_seq`, commits everything that arrived
/// while the previous commit was in flight as one group, and only then reports the batches done.
///
/// It runs on a thread of its own so that nothing blocks an event loop, and hands each group it
/// wrote to a second thread (`CommitSyncer`) that syncs and acknowledges: the writer sequences,
/// compresses and writes the next groups while the last ones sync. Submitters never wait on
/// it; they hear back through each batch's completion, called in order on the sync thread (or
/// on the writer's, when it synced a group itself because nothing else was waiting).
///
/// Thread safety: `queue`, `pendingBytesStorage`, `thread.isStopping`, `stats` and the accepted configuration are guarded by
/// `condition`; every other
/// stored property is touched only by the writer thread once `start()` has been called.
package final class JournalWriter: EventJournal, @unchecked Sendable {
    package typealias Completion = @Sendable (JournalCommit) -> Void
    /// Told of every successful commit on the writer thread: records stored, bytes written
    /// (uncompressed) and how long the write and its sync took, in seconds.
    package typealias CommitObserver = @Sendable (_ records: Int, _ bytes: Int, _ seconds: Double) -> Void

    /// The settings the writer thread works by; only it reads them after `start()`.
    var configurationInUse: JournalConfiguration
    /// The settings last accepted by `reconfigure`, picked up by the writer between commits.
    private var acceptedConfiguration: JournalConfiguration
    private var reconfigured = false
    private var commitObserver: CommitObserver?
    /// Where the last `_seq` stored (acknowledged) is told to the pipeline processes, under
    /// `condition` (`share(storedThrough:)`).
    var storedThrough: SharedWord?

    let condition = NSCondition()
    private var queue: [(JournalBatch, Completion)] = []
    /// Bytes of record bodies submitted and not yet committed (queued or in the commit).
    private var pendingBytesStorage = 0
    var stats: JournalStatistics
    private let thread = StoppableThread()

    var nextSeq: UInt64
    let dedup: DedupWindow
    var active: SegmentWriter?
    /// A segment whose last write failed: it must be recovered before anything else is written.
    var broken: SegmentFile?
    /// A sealed segment whose sync failed after it was sealed: its records are rewritten into a
    /// file that is synced whole before anything else is written (the pages the failed sync
    /// did not write may be kept only in memory, and a later sync can report success for them).
    var unsyncedSealed: SegmentFile?
    let compressor: ZstdCompressor
    private var scratch: [UInt8] = []
    /// What of `scratch` an idle writer keeps.
    static let idleScratchBytes = 1 << 20
    var lastRetention = Date.distantPast
    /// Through which `_seq` everything is durable, as the next start reads it.
    let syncedThrough: SyncedThrough
    var lastMaintenance = Date.distantPast
    let log: @Sendable (String) -> Void
    /// The time rotation by age and retention go by: the system's, or a test's own.
    let now: @Sendable () -> Date
    /// The readers retention waits for: each one's name and durable cursor (the last `_seq` it
    /// has finished), asked for when retention runs.
    package typealias RetentionReaders = @Sendable () -> [(name: String, cursor: UInt64)]
    /// Told when retention deletes records a reader had not read: the reader, and the first
    /// and last `_seq` it loses.
    package typealias RetentionLoss = @Sendable (_ reader: String, _ first: UInt64, _ last: UInt64) -> Void
    var retentionReaders: RetentionReaders?
    var retentionLoss: RetentionLoss?
    /// When retention last said it was keeping segments for a reader (said at most hourly).
    var lastKeptNotice = Date.distantPast

    /// Called from the writer's loop at least every `heartbeatInterval` while it is healthy: the
    /// service manager's watchdog is fed from here, so that a writer stuck in a write or a sync
    /// stops the pings.
    private var heartbeat: (@Sendable () -> Void)?
    private var heartbeatInterval: TimeInterval = 1
    /// Syncs and acknowledges what this thread wrote; started with the writer thread.
    var syncer: CommitSyncer?
    /// A failed sync the writer has not taken up yet: the segment, and the first `_seq` in it
    /// that was not acknowledged. Guarded by `condition`.
    var syncFailure: (segment: SegmentWriter, fromSeq: UInt64)?
    /// The first `_seq` a failed sync left not durable, until the writer has made it durable
    /// again (`repairIfBroken`): a resend of a record from there on is not acknowledged as
    /// stored, since its first copy may be lost at a power cut. Guarded by `condition`.
    var notDurableFrom: UInt64?

    /// Opens the journal: recovers the unsealed segments at its end, makes the segments the
    /// de-duplication window covers durable, and rebuilds the window from the latest records.
    /// Its cost is bounded by one segment and the window, not by the journal's size.
    ///
    /// - Parameters:
    ///   - log: where to report what recovery and retention did.
    ///   - now: the wall clock that segments' ages are measured on (the system's by default).
    /// - Throws: `JournalIOError` when the directory cannot be created or the tail recovered.
    package init(
        configuration: JournalConfiguration, log: @escaping @Sendable (String) -> Void = { _ in },
        now: @escaping @Sendable () -> Date = { Date() }
    ) throws {
        self.now = now
        self.configurationInUse = configuration
        self.acceptedConfiguration = configuration
        self.log = log
        let directory = configuration.directory
        try directory.create()
        if let leftovers = try? FileManager.default.contentsOfDirectory(atPath: directory.path) {
            for name in leftovers where name.hasSuffix(".recovering") || name.hasSuffix(SegmentWriter.replacingSuffix) {
                unlink(directory.path + "/" + name)
            }
        }
        let dedup = DedupWindow(window: configuration.dedupWindow)
        // What the last whend may not have synced (`SyncedThrough`: from the segment of the last
        // record known durable, whose seal may not be) is made durable first, before recovery
        // rewrites anything: a resealed last segment made durable before the unsynced ones
        // before it left them unsealed and torn in the middle of the journal at a power cut.
        let mark = SyncedThrough.read(directory)
        let doubtfulFrom = max(1, mark ?? 1)
        if let last = directory.segments().last {
            if doubtfulFrom < last.firstSeq {
                let why =
                    mark.map { "the last whend stopped before syncing past \($0)" } ?? "no mark of what was synced"
                log("syncing the journal from _seq \(doubtfulFrom) on: \(why)")
            }
            try Self.makeDurable(directory, recordsFrom: doubtfulFrom, log: log)
        }
        let lastSeq = try SegmentRecovery.recoverEnd(of: directory, resealingFrom: doubtfulFrom, log: log)
        let window = UInt64(max(0, configuration.dedupWindow))
        if lastSeq > 0 {
            // What the window covers too (a resend acknowledged as a duplicate is only as durable
            // as its first copy), and everything when the mark is past the journal's end (not this
            // journal's). From the doubtful segment on, synced above or rewritten by recovery.
            let windowFrom = window == 0 ? lastSeq : lastSeq > window ? lastSeq - window + 1 : 1
            let from = (mark ?? 0) > lastSeq ? 1 : windowFrom
            if from < doubtfulFrom { try Self.makeDurable(directory, recordsFrom: from, log: log) }
        }
        self.syncedThrough = SyncedThrough(directory, durableThrough: lastSeq)
        if window > 0, lastSeq > 0 {
            let from = lastSeq > window ? lastSeq - window + 1 : 1
            JournalReader(directory: directory).read(fromSeq: from) { record, _ in
                // Derived records are not in the window live either: a client's event that
                // happens to carry what one holds is no resend of it.
                if let fields = try? record.fields(), !fields.isDerived, let key = fields.dedupKey,
                    let seq = fields.seq
                {
                    dedup.insert(key, seq: seq)
                }
                return true
            } onProblem: { problem in
                log("while rebuilding the de-duplication window: \(problem)")
            }
        }
        if lastSeq > 0, directory.segments().isEmpty {
            // Retention deleted every record, and a crash took the empty segment that said
            // where `_seq` goes on as it was being replaced: say it again.
            try SegmentWriter.writeEmpty(directory: directory, firstSeq: lastSeq + 1)
        }
        self.dedup = dedup
        self.nextSeq = lastSeq + 1
        self.compressor = ZstdCompressor(level: configuration.compressionLevel)
        self.stats = JournalStatistics(lastSeq: lastSeq)
    }

    /// Starts the writer thread.
    /// - Parameters:
    ///   - heartbeatInterval: the longest time between two calls of `heartbeat`.
    ///   - heartbeat: called from the writer thread between commits, never during one.
    ///   - onCommit: told of every successful commit, on the writer thread.
    package func start(
        heartbeatInterval: TimeInterval = 1, heartbeat: (@Sendable () -> Void)? = nil,
        onCommit: CommitObserver? = nil
    ) {
        self.heartbeat = heartbeat
        self.commitObserver = onCommit
        self.heartbeatInterval = max(0.01, min(1, heartbeatInterval))
        startThread()
    }

    private func startThread() {
        syncer = CommitSyncer { [self] group, outcome in
            acknowledge(group, outcome)
        } onSyncFailure: { [self] segment, fromSeq, message in
            log("syncing \(segment.file.path) failed: \(message); records from _seq \(fromSeq) on are not acknowledged")
            condition.lock()
            syncFailure = (segment, fromSeq)
            notDurableFrom = min(notDurableFrom ?? fromSeq, fromSeq)
            stats.failing = message
            condition.unlock()
        }
        thread.start(name: "whend-journal") { [self] in run() }
    }

    /// Queues a batch. Its completion runs on the writer or the sync thread once the batch's
    /// group commit is done (or failed). After `shutdown()` began, batches fail with a message
    /// saying so.
    package func submit(_ batch: JournalBatch, completion: @escaping Completion) {
        condition.lock()
        if thread.isStopping {
            condition.unlock()
            completion(.failed(.shuttingDown))
            return
        }
        queue.append((batch, completion))
        pendingBytesStorage += batch.bodies.count
        condition.signal()
        condition.unlock()
    }

    /// The journal's settings as last accepted (the writer applies them between commits).
    package var configuration: JournalConfiguration {
        condition.lock()
        defer { condition.unlock() }
        return acceptedConfiguration
    }

    /// Changes durability, rotation and retention while the journal runs; the writer takes them
    /// up before its next commit. The directory, the de-duplication window and the compression
    /// level are fixed for the writer's life: a change to them is ignored here (the daemon says
    /// they need a restart).
    package func reconfigure(_ new: JournalConfiguration) {
        condition.lock()
        var applied = acceptedConfiguration
        applied.durability = new.durability
        applied.segmentMaxBytes = new.segmentMaxBytes
        applied.segmentMaxAge = new.segmentMaxAge
        applied.retentionMaxBytes = new.retentionMaxBytes
        applied.retentionMaxAge = new.retentionMaxAge
        acceptedConfiguration = applied
        reconfigured = true
        condition.signal()
        condition.unlock()
    }

    /// Bytes of records submitted and not yet committed: what the daemon bounds its memory by.
    package var pendingBytes: Int {
        condition.lock()
        defer { condition.unlock() }
        return pendingBytesStorage
    }

    /// Commits everything queued, seals the active segment and stops the thread.
    package func shutdown() { thread.stop(condition) }

    // MARK: - The writer thread

    private func run() {
        while true {
            condition.lock()
            if queue.isEmpty && !thread.isStopping {
                _ = condition.wait(until: Date().addingTimeInterval(heartbeatInterval))
            }
            let batches = queue
            queue.removeAll(keepingCapacity: true)
            let stop = thread.isStopping
            let takeUp = reconfigured
            if takeUp {
                configurationInUse = acceptedConfiguration
                reconfigured = false
            }
            condition.unlock()
            // Retention may now be tighter: apply it at once rather than within the minute.
            if takeUp { lastRetention = .distantPast }

            // A sync that hangs stops the pings as a write that hangs does.
            if syncer?.isStuck(longerThan: heartbeatInterval) != true { heartbeat?() }
            if !batches.isEmpty {
                commit(batches)
                if configurationInUse.durability == .none, queueIsEmpty() { flushQuietly() }
            } else if stop {
                break
            } else {
                syncedThrough.flush()
                // Idle for a heartbeat: the group a burst built (20 MiB after 1M events, 12 of
                // them resident) is not kept for the next burst; it grows again if one comes.
                if scratch.capacity > Self.idleScratchBytes { scratch = [] }
            }
            // Rotation by age and retention run whatever the load, at most once a second.
            if now().timeIntervalSince(lastMaintenance) >= 1 { maintain() }
        }
        if let active {
            do {
                try seal(active)
                log("sealed \(active.file.path) at _seq \(active.lastSeq)")
            } catch {
                log("could not seal \(active.file.path): \(error); it will be recovered at the next start")
            }
        }
        active = nil
        syncer?.shutdown()
        syncedThrough.flush()
    }

    private func queueIsEmpty() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return queue.isEmpty
    }

    private func commit(_ batches: [(JournalBatch, Completion)]) {
        takeUpSyncFailure()
        if let failure = repairIfBroken() {
            syncer!.hand(group(of: batches, .failed(failure), firstSeq: nextSeq))
            return
        }
        scratch.removeAll(keepingCapacity: true)
        let first = nextSeq
        var seq = first
        var duplicates: UInt64 = 0
        var originalsThrough: UInt64 = 0
        var minReceived = Int64.max
        var maxReceived = Int64.min
        for (batch, _) in batches {
            minReceived = min(minReceived, batch.minReceivedMicros)
            maxReceived = max(maxReceived, batch.maxReceivedMicros)
            var nextKey = 0
            // Each key's slot is asked for a few records before it is looked up: the lookups
            // are random places in megabytes, and waiting on each in turn was most of this loop.
            for k in batch.keys.prefix(DedupWindow.lookAhead) { dedup.prefetch(k.key) }
            batch.bodies.withUnsafeBufferPointer { bodies in
                var start = 0
                for i in 0..<batch.ends.count {
                    let end = batch.ends[i]
                    defer { start = end }
                    if nextKey < batch.keys.count, batch.keys[nextKey].index == i {
                        let key = batch.keys[nextKey].key
                        if nextKey + DedupWindow.lookAhead < batch.keys.count {
                            dedup.prefetch(batch.keys[nextKey + DedupWindow.lookAhead].key)
                        }
                        nextKey += 1
                        if let original = dedup.firstCopy(of: key, storingAt: seq) {
                            duplicates += 1
                            originalsThrough = max(originalsThrough, original)
                            continue
                        }
                    }
                    appendRecordPrefix(seq)
                    scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bodies[start..<end]))
                    scratch.append(0x0A)
                    seq += 1
                }
            }
        }
        let last = seq - 1
        let started = DispatchTime.now().uptimeNanoseconds
        if seq > first {
            // Before the write: a reader may see the records as soon as they are in the file.
            condition.lock()
            stats.writtenThrough = last
            condition.unlock()
        }
        do {
            if seq > first {
                let segment = try activeSegment()
                try scratch.withUnsafeBytes { lines in
                    try segment.append(
                        lines: lines, firstSeq: first, lastSeq: last, minReceived: minReceived,
                        maxReceived: maxReceived,
                        flush: configurationInUse.durability != .none)
                }
                nextSeq = seq
                dedup.evict(lastSeq: last)
            }
        } catch {
            dedup.dropFrom(seq: first)
            broken = active?.file
            active = nil
            let failure = CommitFailure.cannotStore("\(error)")
            log(failure.description)
            condition.lock()
            stats.failing = "\(error)"
            stats.writtenThrough = first - 1
            condition.unlock()
            syncer!.hand(group(of: batches, .failed(failure), firstSeq: first))
            return
        }
        var written = group(of: batches, .stored(lastSeq: nextSeq - 1), firstSeq: first)
        written.records = seq - first
        written.duplicates = duplicates
        written.writtenBytes = scratch.count
        written.startedNanos = started
        if configurationInUse.durability == .fsync {
            // A resend's first copies may still be syncing, or their sync may have failed: the
            // group then waits for a sync of the segment they are in, and fails with it. (In a
            // segment sealed since, their fate is the seal's: `notDurableFrom`.)
            written.originalsThrough = originalsThrough
            if seq > first || duplicates > 0 { written.segment = active }
        }
        // With nothing else to write, the sync is made here: under light load an ack then waits
        // for no other thread's wake-up. Under load the sync thread takes it, and the writer
        // goes on with the next group.
        if !(queueIsEmpty() && syncer!.settleInPlaceIfIdle(written)) { syncer!.hand(written) }
        if let segment = active, segment.size >= configurationInUse.segmentMaxBytes { rotate() }
    }

    /// `batches` as one group for the sync thread: their completions and the bytes they held.
    private func group(
        of batches: [(JournalBatch, Completion)], _ outcome: JournalCommit, firstSeq: UInt64
    ) -> WrittenGroup {
        WrittenGroup(
            completions: batches.map(\.1), submittedBytes: batches.reduce(0) { $0 + $1.0.bodies.count },
            outcome: outcome, firstSeq: firstSeq)
    }

    /// On the thread that settled the group: its fate is known; count it and tell its submitters.
    private func acknowledge(_ group: WrittenGroup, _ outcome: JournalCommit) {
        var outcome = outcome
        condition.lock()
        if case .stored = outcome, group.originalsThrough > 0, let lost = notDurableFrom,
            group.originalsThrough >= lost
        {
            outcome = .failed(.resentCopiesNotDurable)
        }
        pendingBytesStorage -= group.submittedBytes
        // A sealing (no batches) counts for nothing but its sync.
        if case .stored(let lastSeq) = outcome, !group.completions.isEmpty {
            stats.lastSeq = max(stats.lastSeq, lastSeq)
            storedThrough?.store(stats.lastSeq)
            stats.recordsStored += group.records
            stats.duplicatesSkipped += group.duplicates
            stats.commits += 1
            stats.bytesWritten += UInt64(group.writtenBytes)
            stats.failing = nil
        }
        condition.unlock()
        // A sync of a segment's file covers all it holds, whatever durability wrote it.
        if case .stored(let lastSeq) = outcome, let segment = group.segment {
            syncedThrough.synced(from: segment.file.firstSeq, through: lastSeq)
        }
        if case .stored = outcome, group.records > 0, let commitObserver {
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - group.startedNanos) / 1e9
            commitObserver(Int(group.records), group.writtenBytes, seconds)
        }
        for completion in group.completions { completion(outcome) }
    }

    /// A sync failed. The active (or already broken) segment is recovered before the next write,
    /// and `_seq` rewinds to the first record that was not acknowledged (recovery gives back the
    /// de-duplication keys of what it finds); a segment sealed since keeps its records, and is
    /// rewritten whole before the next write.
    private func takeUpSyncFailure() {
        condition.lock()
        let report = syncFailure
        syncFailure = nil
        condition.unlock()
        guard let (segment, fromSeq) = report else { return }
        if active === segment {
            active = nil
            broken = segment.file
        } else if broken?.path != segment.file.path {
            // Sealed since: every record it holds stays (and so do their keys), made durable by
            // a rewrite before the next write.
            unsyncedSealed = segment.file
            return
        }
        dedup.dropFrom(seq: fromSeq)
        nextSeq = min(nextSeq, fromSeq)
        condition.lock()
        stats.writtenThrough = nextSeq - 1
        condition.unlock()
    }

    private func appendRecordPrefix(_ seq: UInt64) {
        // `{"_seq":` then the decimal digits, without going through String.
        scratch.append(contentsOf: [0x7B, 0x22, 0x5F, 0x73, 0x65, 0x71, 0x22, 0x3A])
        var digits:
            (
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8
            ) =
                (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = seq
        var count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            repeat {
                d[19 - count] = UInt8(0x30 + n % 10)
                n /= 10
                count += 1
            } while n > 0
            scratch.append(contentsOf: d[(20 - count)..<20])
        }
        scratch.append(0x2C)
    }

}
