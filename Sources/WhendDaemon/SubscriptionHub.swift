import Foundation
import WhendJournal
import WhendRecord

/// One reading of the journal's newest records for every subscriber that has caught up: each
/// frame decompressed and each record scanned once, then offered to each subscriber's filter.
///
/// A subscriber reads the journal on its own thread until it has caught up, then joins the hub
/// and only sends what the hub hands it. One that falls behind (more than `maxQueued` bytes
/// handed and not yet sent) is let go and reads on its own again from where it was, so no
/// subscriber holds the hub, and none holds ingest. Without this, each subscriber read and
/// scanned every record itself: with 100 connected, ingest ran at 0.03 × its rate alone.
final class SubscriptionHub: @unchecked Sendable {
    // Unchecked: `members`, `position`, `running` and `recent` under `lock`; a member's fields
    // under its own condition's lock.
    /// What the hub hands one subscriber.
    final class Member: @unchecked Sendable {
        let filter: RecordFilter
        /// Signalled when something was handed, or the member was let go.
        let changed = NSCondition()
        /// Stored lines that pass the filter, `\n` after each, not yet taken, and the `_seq` of
        /// the last.
        var queued: [UInt8] = []
        var lastQueued: UInt64 = 0
        /// Records through this `_seq` are not this member's (it read them itself).
        var skipThrough: UInt64
        /// Let go at this `_seq` (handed everything through it): it fell behind, and reads on
        /// its own again after it.
        var releasedAt: UInt64?

        init(filter: RecordFilter, after: UInt64) {
            self.filter = filter
            skipThrough = after
        }

        /// Takes what was handed, and the last `_seq` examined for it: `position` (the hub's,
        /// read before the take, so every record through it is in what is taken), or further.
        func take(position: UInt64) -> (lines: [UInt8], examined: UInt64, released: Bool) {
            changed.withLock {
                // Handed over whole: emptying it while the caller holds the same buffer would
                // copy it (and keep a second buffer of its size for each member).
                let lines = queued
                queued = []
                // A member let go was handed nothing past where it was let go.
                return (lines, releasedAt ?? max(position, lastQueued, skipThrough), releasedAt != nil)
            }
        }
    }

    /// Bytes handed to a member and not yet taken before it is let go.
    static let maxQueued = 1 << 20
    /// The newest records kept for subscribers joining a little behind the hub.
    static let recentBytes = 4 << 20

    private struct Recent {
        var seq: UInt64
        var line: [UInt8]
        var fields: StoredRecord?
    }

    private let journal: JournalDirectory
    private let committed: @Sendable () -> UInt64
    private let lock = NSLock()
    private var members: [ObjectIdentifier: Member] = [:]
    /// Members by the session they follow; those that follow no one session.
    private var bySession: [[UInt8]: [ObjectIdentifier: Member]] = [:]
    private var anySession: [ObjectIdentifier: Member] = [:]
    /// Members handed something since they were last woken.
    private var handed: [ObjectIdentifier: Member] = [:]
    private var running = false
    /// The last `_seq` the hub examined.
    private var position: UInt64 = 0
    private var recent: [Recent] = []
    private var recentHead = 0
    private var recentSize = 0

    init(journal: JournalDirectory, committed: @escaping @Sendable () -> UInt64) {
        self.journal = journal
        self.committed = committed
    }

    /// Joins `member`, which has read everything through `after` itself. False when
    /// the hub is further on than its newest records reach back: the member reads on.
    func join(_ member: Member, after: UInt64) -> Bool {
        lock.withLock {
            if !running {
                running = true
                position = after
                recent.removeAll()
                recentHead = 0
                recentSize = 0
                add(member)
                Thread { [self] in
                    Thread.current.name = "whend-subscribe"
                    run(after: after)
                }.start()
                return true
            }
            if position <= after {
                member.skipThrough = after
                add(member)
                return true
            }
            // The hub is ahead: what it examined since `after` is handed from its newest records.
            guard recentHead < recent.count, recent[recentHead].seq <= after + 1 else { return false }
            member.changed.withLock {
                for r in recent[recentHead...] where r.seq > after {
                    if let fields = r.fields, member.filter.matches(fields) {
                        member.queued += r.line
                        member.queued.append(0x0A)
                        member.lastQueued = r.seq
                    }
                }
                member.skipThrough = position
            }
            add(member)
            return true
        }
    }

    func leave(_ member: Member) {
        lock.withLock { remove(member) }
    }

    /// The last `_seq` the hub examined.
    var examined: UInt64 { lock.withLock { position } }

    private func add(_ member: Member) {
        let id = ObjectIdentifier(member)
        members[id] = member
        if let session = member.filter.session {
            bySession[session, default: [:]][id] = member
        } else {
            anySession[id] = member
        }
    }

    private func remove(_ member: Member) {
        let id = ObjectIdentifier(member)
        members.removeValue(forKey: id)
        handed.removeValue(forKey: id)
        if let session = member.filter.session {
            bySession[session]?.removeValue(forKey: id)
            if bySession[session]?.isEmpty == true { bySession.removeValue(forKey: session) }
        } else {
            anySession.removeValue(forKey: id)
        }
    }

    private func run(after: UInt64) {
        var committedThrough = committed()
        var sinceSignal = 0
        JournalReader(directory: journal).read(
            fromSeq: after + 1, follow: true,
            body: { record, _ in
                guard let seq = record.seq else { return true }
                // Only acknowledged records: a record a subscriber saw is never one a power cut
                // takes back.
                while seq > committedThrough {
                    committedThrough = committed()
                    if seq > committedThrough {
                        signalHanded()
                        guard !stopIfAlone() else { return false }
                        usleep(500)
                    }
                }
                let fields = try? record.fields()
                lock.withLock {
                    guard seq > position else { return }
                    remember(Recent(seq: seq, line: Array(record.line), fields: fields))
                    // Only the members that may want it: a member following a session is not
                    // looked at for another's records.
                    for member in anySession.values { offer(record.line, seq, fields, to: member) }
                    if let session = fields?.session, let following = bySession[session] {
                        for member in following.values { offer(record.line, seq, fields, to: member) }
                    }
                    // After what it handed: whoever reads `position` has every record through it.
                    position = seq
                }
                sinceSignal += 1
                if sinceSignal >= 256 {
                    sinceSignal = 0
                    signalHanded()
                }
                return true
            },
            onCaughtUp: {
                signalHanded()
                return !stopIfAlone()
            },
            onProblem: { _ in })
    }

    /// With no member left, the hub stops (the next to join starts it again).
    private func stopIfAlone() -> Bool {
        lock.withLock {
            guard members.isEmpty else { return false }
            running = false
            return true
        }
    }

    /// Hands a record to `member` if it passes its filter (called under `lock`); a line that
    /// does not scan passes only a filter that looks at nothing, as for a reader of its own.
    private func offer(
        _ line: UnsafeBufferPointer<UInt8>, _ seq: UInt64, _ fields: StoredRecord?, to member: Member
    ) {
        guard seq > member.skipThrough, fields.map(member.filter.matches) ?? !member.filter.needsFields else { return }
        member.changed.lock()
        member.queued.append(contentsOf: line)
        member.queued.append(0x0A)
        member.lastQueued = seq
        if member.queued.count > Self.maxQueued {
            member.releasedAt = seq
            member.changed.broadcast()
            member.changed.unlock()
            remove(member)
            return
        }
        member.changed.unlock()
        handed[ObjectIdentifier(member)] = member
    }

    /// Wakes the members handed something since the last time.
    private func signalHanded() {
        let woken = lock.withLock {
            defer { handed.removeAll(keepingCapacity: true) }
            return Array(handed.values)
        }
        for member in woken { member.changed.withLock { member.changed.broadcast() } }
    }

    /// Keeps a record among the newest, dropping the oldest past `recentBytes`.
    private func remember(_ r: Recent) {
        recent.append(r)
        recentSize += r.line.count
        while recentSize > Self.recentBytes, recentHead < recent.count - 1 {
            recentSize -= recent[recentHead].line.count
            recentHead += 1
        }
        if recentHead > 4096 && recentHead * 2 > recent.count {
            recent.removeFirst(recentHead)
            recentHead = 0
        }
    }
}
