import CLinux
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendRecord
import WhendWire

/// One subscriber's stream of records (PROTOCOL.md §9): the journal from where it asked, then
/// each record as it is committed, those its filters pass, in `_seq` order.
///
/// It reads the journal on a thread of its own, as the pipelines do: a subscriber is never fed
/// from ingest, so however slowly it reads, ingest does not wait for it. What it has not read
/// is bounded (`maxUnread` bytes sent and not yet taken by the kernel); a subscriber that takes
/// nothing for `stallLimit` while more waits is told `too_slow` and disconnected, and resumes
/// from its last `_seq` when it can keep up. Only records whend has acknowledged are sent, so a
/// record a subscriber saw is never one a power cut takes back.
final class Subscription: Sendable {
    /// Bytes sent and not yet taken by the kernel before the reader waits.
    static let maxUnread = 1 << 20
    /// Lines are gathered up to this many bytes before they go out together.
    static let chunkBytes = 64 << 10
    /// How long a subscriber may take nothing while records wait before it is disconnected.
    static let stallLimit: TimeInterval = 10
    /// At least this often while filters skip records, the last `_seq` examined is told.
    static let checkpointEvery: TimeInterval = 1

    private let request: SubscribeRequest
    /// Why the subscriber may no longer subscribe (a reload changed `subscribe_group`), or
    /// nil; asked about once a second.
    private let revoked: @Sendable () -> String?
    private let journal: JournalDirectory
    private let hub: SubscriptionHub
    private let committed: @Sendable () -> UInt64
    private let channel: Channel
    private let onEnd: @Sendable () -> Void
    private let cancelled = Atomic<Bool>(false)
    private let closesOnceFlushed = Atomic<Bool>(false)
    private let unread = Mutex<Int>(0)
    private let taken = NSCondition()

    init(
        _ request: SubscribeRequest, journal: JournalDirectory, hub: SubscriptionHub,
        committed: @escaping @Sendable () -> UInt64, channel: Channel,
        revoked: @escaping @Sendable () -> String? = { nil }, onEnd: @escaping @Sendable () -> Void
    ) {
        self.request = request
        self.revoked = revoked
        self.journal = journal
        self.hub = hub
        self.committed = committed
        self.channel = channel
        self.onEnd = onEnd
    }

    /// Starts reading: `subscribed` first, then the records.
    func start() {
        Thread { [self] in
            // Named from inside: a name given before the start is not the new thread's.
            Thread.current.name = "whend-subscribe"
            run()
            onEnd()
        }.start()
    }

    /// The member the hub reads for, while it does: woken by `cancel` so that the thread ends
    /// (and frees its `max_subscribers` place) at once, not at its next checkpoint.
    private let hubMember = Mutex<SubscriptionHub.Member?>(nil)

    /// The subscriber is gone, or whend is stopping: the reader ends at once, or within its
    /// journal poll interval while it reads alone.
    func cancel() {
        cancelled.store(true, ordering: .releasing)
        taken.broadcast()
        if let member = hubMember.withLock({ $0 }) { member.changed.withLock { member.changed.broadcast() } }
    }

    private var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    private func run() {
        var filter = RecordFilter(
            app: request.app, session: request.session, types: Set(request.types), names: Set(request.names),
            derived: request.derived, pipeline: request.pipeline)
        var fromSeq: UInt64?
        switch request.start {
        case .now: fromSeq = committed() + 1
        case .oldest: fromSeq = nil
        case .after(let seq): fromSeq = seq == .max ? seq : seq + 1
        case .since(let micros): filter.sinceMicros = micros
        }
        var out = ServerMessage.subscribed(server: "whend/\(WhendVersion.current)", after: fromSeq.map { $0 - 1 })
        /// The last `_seq` examined, and the last the subscriber was told of (a record or a checkpoint).
        var examined = fromSeq.map { $0 - 1 } ?? 0
        var told = examined
        var committedThrough = committed()
        var caughtUp = false
        var lastCheckpoint = Date()
        var lastSent = Date()
        var ok = true

        /// Sends what is gathered, a chunk at a time: what the hub hands at once (up to its
        /// 1 MiB) waits for room like the rest, and never lies in NIO's buffers beyond
        /// `maxUnread` and a chunk. Each piece ends at a line's end, so that what a stalled
        /// subscriber is sent last (`too_slow`) never follows half a record.
        var lastAccessCheck = Date()
        var revokedNow = false
        func send() {
            if Date().timeIntervalSince(lastAccessCheck) >= Self.checkpointEvery {
                lastAccessCheck = Date()
                if let why = revoked() {
                    // What is gathered was read while it still might: it goes, then the refusal.
                    out.append(
                        contentsOf: ServerMessage.error(WireError(.forbidden, why, isAboutConnection: true), event: nil)
                    )
                    revokedNow = true
                }
            }
            defer {
                if revokedNow {
                    ok = false
                    closeOnceFlushed()
                }
            }
            var start = 0
            while ok && start < out.count {
                var end = min(out.count, start + Self.chunkBytes)
                if end < out.count {
                    end =
                        (out[start..<end].lastIndex(of: 0x0A) ?? out[end...].firstIndex(of: 0x0A) ?? out.count - 1)
                        + 1
                }
                ok = write(Array(out[start..<end]))
                start = end
            }
            // A chunk's room is kept; a hand-over's megabytes are not, for each subscriber.
            out.removeAll(keepingCapacity: out.capacity <= 2 * Self.chunkBytes)
            lastSent = Date()
        }
        // Told at once, before any reading: a long catch-up must not look like no answer.
        send()
        func checkpoint(force: Bool) {
            guard examined > told, force || Date().timeIntervalSince(lastCheckpoint) >= Self.checkpointEvery
            else { return }
            out.append(contentsOf: ServerMessage.checkpoint(seq: examined))
            told = examined
            lastCheckpoint = Date()
        }

        var joined = false
        /// Reads the journal itself from after `examined` until it has caught up and the hub
        /// takes it on (then true), or it must stop (false).
        func readAlone() -> Bool {
            let member = SubscriptionHub.Member(filter: filter, after: examined)
            JournalReader(directory: journal).read(
                fromSeq: fromSeq, sinceMicros: filter.sinceMicros, follow: true,
                body: { record, _ in
                    guard let seq = record.seq, seq > examined else { return ok && !isCancelled }
                    // Not yet acknowledged (written, not yet synced): wait for the commit.
                    while seq > committedThrough {
                        committedThrough = committed()
                        if seq > committedThrough {
                            send()
                            guard ok, !isCancelled else { return false }
                            usleep(500)
                        }
                    }
                    // Gone before this subscriber read them: said, never silent.
                    if seq > examined + 1, fromSeq != nil || examined > 0 {
                        out.append(contentsOf: ServerMessage.gap(from: examined + 1, through: seq - 1))
                    }
                    examined = seq
                    if filter.matches(record) {
                        out.append(contentsOf: record.line)
                        out.append(0x0A)
                        told = seq
                    } else if seq & 63 == 0 {
                        checkpoint(force: false)
                    }
                    // Gathered for a chunk, but never held back longer than a checkpoint's
                    // interval: a sparse filter over a long catch-up still sees its records,
                    // and its checkpoints, as they are found.
                    // (The clock is read every 64 records: a catch-up examines millions.)
                    if out.count >= Self.chunkBytes
                        || (seq & 63 == 0 && !out.isEmpty && Date().timeIntervalSince(lastSent) >= Self.checkpointEvery)
                    {
                        send()
                    }
                    return ok && !isCancelled
                },
                onCaughtUp: {
                    // Records below the oldest segment are gone. Read to the end, a reader sees
                    // them missing only when no record follows them yet: retention deleted every
                    // record, and the empty segment keeps the next _seq (its name says it).
                    var skipped = false
                    if let oldest = journal.segments().first?.firstSeq, oldest > examined + 1 {
                        if fromSeq != nil || examined > 0 {
                            out.append(contentsOf: ServerMessage.gap(from: examined + 1, through: oldest - 1))
                        }
                        examined = oldest - 1
                        skipped = true
                    }
                    if !caughtUp {
                        caughtUp = true
                        out.append(contentsOf: ServerMessage.caughtUp(seq: examined))
                        told = examined
                        lastCheckpoint = Date()
                    } else {
                        checkpoint(force: skipped)
                    }
                    send()
                    guard ok, !isCancelled else { return false }
                    // From here the hub reads for it.
                    joined = hub.join(member, after: examined)
                    return !joined
                },
                onProblem: { _ in })
            guard joined else { return false }
            joined = false
            hubMember.withLock { $0 = member }
            defer { hubMember.withLock { $0 = nil } }
            // What the hub hands it, until it is let go (it fell behind) or it ends.
            while ok && !isCancelled {
                member.changed.withLock {
                    if member.queued.isEmpty && member.releasedAt == nil && !isCancelled {
                        _ = member.changed.wait(until: Date().addingTimeInterval(Self.checkpointEvery))
                    }
                }
                let (handed, through, released) = member.take(position: hub.examined)
                if out.isEmpty { out = handed } else { out += handed }
                examined = through
                if handed.isEmpty { checkpoint(force: false) }
                send()
                if released {
                    fromSeq = examined + 1
                    return true
                }
            }
            hub.leave(member)
            return false
        }
        while readAlone() {}
        if ok && !isCancelled { send() }
        // Reached only when the subscriber is gone, whend stops, or it could not keep up (then
        // the connection closes once it has been told so).
        if !isCancelled && !closesOnceFlushed.load(ordering: .acquiring) { channel.close(promise: nil) }
    }

    /// Closes the connection once what was written is taken, or after another `stallLimit` at
    /// most: closing at once would drop the last line, which says why (`too_slow`, `forbidden`).
    private func closeOnceFlushed() {
        closesOnceFlushed.store(true, ordering: .releasing)
        let channel = self.channel
        channel.writeAndFlush(channel.allocator.buffer(capacity: 0)).whenComplete { _ in
            channel.close(promise: nil)
        }
        channel.eventLoop.scheduleTask(in: .milliseconds(Int64(Self.stallLimit * 1000))) {
            channel.close(promise: nil)
        }
    }

    /// Sends `bytes`, first waiting while the subscriber has `maxUnread` bytes not yet taken;
    /// false when it is gone, or took nothing for `stallLimit` (then it is told so and closed).
    private func write(_ bytes: [UInt8]) -> Bool {
        let deadline = Date().addingTimeInterval(Self.stallLimit)
        taken.lock()
        while unread.withLock({ $0 }) >= Self.maxUnread && !isCancelled && Date() < deadline {
            _ = taken.wait(until: min(deadline, Date().addingTimeInterval(0.1)))
        }
        taken.unlock()
        guard !isCancelled else { return false }
        guard unread.withLock({ $0 }) < Self.maxUnread else {
            let line = ServerMessage.error(
                WireError(
                    .tooSlow,
                    "the subscriber took nothing for \(Int(Self.stallLimit)) s while records waited; resume with \"after\" set to the last _seq it saw",
                    isAboutConnection: true), event: nil)
            channel.write(channel.allocator.buffer(bytes: line), promise: nil)
            closeOnceFlushed()
            return false
        }
        let count = bytes.count
        unread.withLock { $0 += count }
        let promise = channel.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenComplete { [self] _ in
            unread.withLock { $0 -= count }
            taken.broadcast()
        }
        channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: promise)
        return channel.isActive
    }
}

/// The subscriptions open, against `max_subscribers`.
final class SubscriberCount: Sendable {
    private let open = Mutex<Int>(0)

    /// Takes a place if fewer than `limit` are taken.
    func take(limit: Int) -> Bool {
        open.withLock { n in
            guard n < limit else { return false }
            n += 1
            return true
        }
    }

    func release() { open.withLock { $0 -= 1 } }

    var count: Int { open.withLock { $0 } }
}

/// Who may subscribe (PROTOCOL.md §9, SECURITY.md): whend's own user, root, and members of
/// `subscribe_group` — as the kernel tells the peer's user and groups, taken at its connect().
enum SubscriberAccess {
    /// nil when allowed, else why not.
    static func refusal(
        uid: UInt32, gid: UInt32, supplementary: [UInt32]?, group: String
    ) -> String? {
        if uid == 0 || uid == geteuid() { return nil }
        let how = "subscriptions are open to whend's user, root"
        guard !group.isEmpty else {
            return "\(how) only (subscribe_group is not set); uid \(uid) is neither"
        }
        guard let wanted = groupID(group) else {
            return "\(how) and the group \(group) (subscribe_group), which does not exist on this system"
        }
        // The zeroes after the kernel's list are not groups: root's group counts only as the
        // peer's primary group.
        if gid == wanted || (wanted != 0 && supplementary?.contains(wanted) == true) { return nil }
        return "\(how) and members of \(group) (subscribe_group); uid \(uid) is not one"
    }

    /// The group's id, by `getgrnam_r`: connections are checked on several threads at once,
    /// and `getgrnam`'s answer lives in one static buffer they would share.
    static func groupID(_ name: String) -> gid_t? {
        var entry = group()
        var found: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 1024)
        while true {
            let status = getgrnam_r(name, &entry, &buffer, buffer.count, &found)
            if status == ERANGE && buffer.count < 1 << 20 {
                buffer = [CChar](repeating: 0, count: buffer.count * 4)
                continue
            }
            return status == 0 ? found?.pointee.gr_gid : nil
        }
    }
}
