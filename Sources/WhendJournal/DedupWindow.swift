import WhendRecord
import WhendWire

/// Remembers the (`app`, `session`, `id`) of the events among the last `window` records of the
/// journal, so that a resent event is stored once (PROTOCOL.md §4).
///
/// The window is counted in records (`_seq`s), not in time, so that its memory is bounded by
/// configuration (a table of twice `window` slots of 24 bytes and a ring of `window` entries:
/// about 95 bytes a record, 9.5 MB at 100,000) and
/// rebuilding it at start-up reads at most `window` records, whatever the journal's size.
///
/// A class, as the table it owns is (a copy that shared the table but not the ring would
/// corrupt both). Both tables are sized for the whole window up front and never grow or
/// compact afterwards: a rehash or a large copy on the journal writer's thread would stall
/// every ack behind it.
final class DedupWindow {
    let window: UInt64
    private var table: DedupTable
    /// The keys in the order they were stored: a ring of `window` slots, `count` of them live
    /// from `head` on.
    private var ring: [(seq: UInt64, key: DedupKey)?]
    private var head = 0
    private var count = 0

    init(window: Int) {
        self.window = UInt64(max(0, window))
        table = DedupTable(capacity: max(1, window))
        ring = Array(repeating: nil, count: max(0, window))
    }

    func insert(_ key: DedupKey, seq: UInt64) {
        guard window > 0 else { return }
        if table.insertIfAbsent(key, seq: seq) == nil { append(key, seq) }
    }

    /// Records `key` as stored at `seq` unless it is already there.
    /// - Returns: false when the key is in the window already (a resend).
    func insertIfAbsent(_ key: DedupKey, seq: UInt64) -> Bool { firstCopy(of: key, storingAt: seq) == nil }

    /// Records `key` as stored at `seq` unless it is already there.
    /// - Returns: nil when stored now; the `_seq` of the first copy when the key is in the
    ///   window already (a resend), whose ack must wait for that copy to be durable.
    func firstCopy(of key: DedupKey, storingAt seq: UInt64) -> UInt64? {
        guard window > 0 else { return nil }
        if let first = table.insertIfAbsent(key, seq: seq) { return first }
        append(key, seq)
        return nil
    }

    func contains(_ key: DedupKey) -> Bool { table.seq(of: key) != nil }

    /// How many records ahead the writer asks for a key's slot: enough for the loads to
    /// overlap, few enough that the lines are still cached when they are used.
    static let lookAhead = 16

    /// Starts loading `key`'s slot, to be inserted soon (see `DedupTable.prefetch`).
    @inline(__always) func prefetch(_ key: DedupKey) { table.prefetch(key) }

    /// Forgets the keys stored at `seq` and later: their records were not acknowledged, and
    /// their `_seq`s will be reused.
    func dropFrom(seq: UInt64) {
        while count > 0 {
            let tail = (head + count - 1) % ring.count
            guard let (stored, key) = ring[tail], stored >= seq else { return }
            table.remove(key, ifSeq: stored)
            ring[tail] = nil
            count -= 1
        }
    }

    private func append(_ key: DedupKey, _ seq: UInt64) {
        if count == ring.count {
            // A full window: each key stored pushes out the oldest, whose slot is loaded a few
            // keys before it goes.
            if let ahead = ring[(head + Self.lookAhead) % ring.count] { table.prefetch(ahead.key) }
            dropOldest()
        }
        ring[(head + count) % ring.count] = (seq, key)
        count += 1
    }

    private func dropOldest() {
        if let (seq, key) = ring[head] { table.remove(key, ifSeq: seq) }
        ring[head] = nil
        head = (head + 1) % ring.count
        count -= 1
    }

    /// Forgets the keys of records that fell out of the window once `lastSeq` is stored.
    func evict(lastSeq: UInt64) {
        guard lastSeq > window else { return }
        let oldest = lastSeq - window + 1
        while count > 0, let entry = ring[head], entry.seq < oldest {
            // The slots of the keys about to leave, loaded while these leave.
            if count > Self.lookAhead, let ahead = ring[(head + Self.lookAhead) % ring.count], ahead.seq < oldest {
                table.prefetch(ahead.key)
            }
            dropOldest()
        }
    }
}
