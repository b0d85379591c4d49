import Foundation

/// A group of records the writer thread has sequenced, compressed and written, on its way to
/// its acknowledgement.
struct WrittenGroup {
    /// The batches' completions, in the order the batches were submitted.
    var completions: [JournalWriter.Completion]
    /// The submitted body bytes of those batches (what `pendingBytes` counted for them).
    var submittedBytes: Int
    /// The segment to sync before the group is acknowledged; nil when the durability setting
    /// asks for no sync, or nothing was written.
    var segment: SegmentWriter? = nil
    /// What the writer made of the group: stored (yet to be synced, if `segment` is set) or
    /// failed already.
    var outcome: JournalCommit
    /// The first `_seq` the group took, and how many records and duplicates it had.
    var firstSeq: UInt64
    var records: UInt64 = 0
    var duplicates: UInt64 = 0
    /// The latest first copy of the group's duplicates (0: none): under `durability = fsync`
    /// the group is acknowledged as stored only if that copy is durable.
    var originalsThrough: UInt64 = 0
    /// Uncompressed bytes written, and when the write began (for the commit observer).
    var writtenBytes = 0
    var startedNanos: UInt64 = 0
}

/// The second half of a commit, on a thread of its own: syncs what the writer thread wrote,
/// then acknowledges the groups in the order they were written.
///
/// The writer never waits for `fdatasync`: while one sync runs, it goes on sequencing,
/// compressing and writing the next groups, and the next sync covers all of them at once. Every
/// group passes through here, synced or not, so that acknowledgements keep the order of the
/// writes whatever the durability setting does meanwhile.
///
/// When a sync fails, nothing written to that segment since its last good sync is
/// acknowledged — a later sync of the same file can report success for pages the failed one
/// lost — and the writer is told (`onSyncFailure`) so that, before it writes on, it rewrites
/// what the segment shows into a file synced whole and carries `_seq` on from there.
final class CommitSyncer: @unchecked Sendable {
    // Unchecked: `queue`, `thread.isStopping`, `settling` and `syncStartedNanos` are guarded by
    // `condition`; `failed` is touched only while settling, by one thread at a time (the sync
    // thread, or the writer in place while the sync thread has nothing).
    private let condition = NSCondition()
    private var queue: [WrittenGroup] = []
    private var syncStartedNanos: UInt64?
    /// Whether the sync thread is settling groups now: the writer then hands its group over
    /// instead of settling it in place, so that groups are settled one at a time, in order.
    private var settling = false
    private let thread = StoppableThread()
    /// Segments whose sync failed, by identity: their later groups fail without a sync. Held
    /// strongly, so that no new segment can take the identity of a failed one; the last 16 are
    /// enough, since the writer moves to a new segment before it writes after a failure.
    private var failed: [SegmentWriter] = []

    private let onDone: (WrittenGroup, JournalCommit) -> Void
    private let onSyncFailure: (_ segment: SegmentWriter, _ fromSeq: UInt64, _ message: String) -> Void

    /// - Parameters:
    ///   - onDone: called for each group, in order, with its fate: on the sync thread, or on
    ///     the writer's when it settled the group in place.
    ///   - onSyncFailure: called on the same thread when syncing `segment` failed: every record
    ///     from `fromSeq` on in that segment is unacknowledged.
    init(
        onDone: @escaping (WrittenGroup, JournalCommit) -> Void,
        onSyncFailure: @escaping (_ segment: SegmentWriter, _ fromSeq: UInt64, _ message: String) -> Void
    ) {
        self.onDone = onDone
        self.onSyncFailure = onSyncFailure
        thread.start(name: "whend-journal-sync") { [self] in run() }
    }

    /// Queues a written group; it is acknowledged after every group queued before it.
    func hand(_ group: WrittenGroup) {
        condition.lock()
        queue.append(group)
        condition.signal()
        condition.unlock()
    }

    /// Settles `group` on the calling thread if nothing is queued or being settled, so that
    /// under light load an acknowledgement does not wait for another thread to wake up; false
    /// (and nothing done) otherwise, and the group is to be handed over instead. Only the
    /// thread that hands groups may call it: nothing can be queued while it settles.
    func settleInPlaceIfIdle(_ group: WrittenGroup) -> Bool {
        condition.lock()
        let idle = queue.isEmpty && !settling
        condition.unlock()
        if idle { settle([group]) }
        return idle
    }

    /// Whether a sync has been running for longer than `seconds`: the writer stops feeding the
    /// watchdog then, as it would if it were stuck in the sync itself.
    func isStuck(longerThan seconds: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard let started = syncStartedNanos else { return false }
        return Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9 > seconds
    }

    /// Acknowledges everything queued, then stops the thread.
    func shutdown() { thread.stop(condition) }

    private func run() {
        while true {
            condition.lock()
            while queue.isEmpty && !thread.isStopping { condition.wait() }
            let groups = queue
            queue.removeAll(keepingCapacity: true)
            let stop = thread.isStopping && groups.isEmpty
            settling = !groups.isEmpty
            condition.unlock()
            if stop { break }
            settle(groups)
            condition.lock()
            settling = false
            condition.unlock()
        }
    }

    /// Syncs each segment the groups were written to, once, then acknowledges them in order.
    private func settle(_ groups: [WrittenGroup]) {
        var synced: [(segment: SegmentWriter, failure: String?)] = []
        for group in groups {
            guard let segment = group.segment, case .stored = group.outcome,
                !synced.contains(where: { $0.segment === segment })
            else { continue }
            if failed.contains(where: { $0 === segment }) {
                synced.append((segment, "an earlier sync of \(segment.file.path) failed"))
                continue
            }
            setSyncStarted(DispatchTime.now().uptimeNanoseconds)
            do {
                try segment.sync()
                synced.append((segment, nil))
            } catch {
                synced.append((segment, "\(error)"))
                failed.append(segment)
                if failed.count > 16 { failed.removeFirst() }
                let fromSeq = groups.first { $0.segment === segment }!.firstSeq
                onSyncFailure(segment, fromSeq, "\(error)")
            }
            setSyncStarted(nil)
        }
        for group in groups {
            var outcome = group.outcome
            if let segment = group.segment, case .stored = outcome,
                let failure = synced.first(where: { $0.segment === segment })?.failure
            {
                outcome = .failed(.cannotStore("\(failure)"))
            }
            onDone(group, outcome)
        }
    }

    private func setSyncStarted(_ nanos: UInt64?) {
        condition.lock()
        syncStartedNanos = nanos
        condition.unlock()
    }
}
