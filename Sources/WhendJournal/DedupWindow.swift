import WhendWire

/// Remembers the (`app`, `session`, `id`) of the events among the last `window` records of the
/// journal, so that a resent event is stored once (PROTOCOL.md §4).
///
/// The window is counted in records (`_seq`s), not in time, so that its memory is bounded by
/// configuration (at most `window` keys of 16 bytes, about 60 bytes each with the tables) and rebuilding it at
/// start-up reads at most `window` records, whatever the journal's size.
struct DedupWindow {
    let window: UInt64
    private var seqOfKey: [DedupKey: UInt64] = [:]
    private var order: [(seq: UInt64, key: DedupKey)] = []
    private var head = 0

    init(window: Int) {
        self.window = UInt64(max(0, window))
    }

    var count: Int { seqOfKey.count }

    mutating func insert(_ key: DedupKey, seq: UInt64) {
        guard window > 0 else { return }
        seqOfKey[key] = seq
        order.append((seq, key))
    }

    /// Records `key` as stored at `seq` unless it is already there.
    /// - Returns: false when the key is in the window already (a resend).
    mutating func insertIfAbsent(_ key: DedupKey, seq: UInt64) -> Bool {
        guard window > 0 else { return true }
        // One hash lookup for the common case, a new key; a resend pays a second to restore.
        if let original = seqOfKey.updateValue(seq, forKey: key) {
            seqOfKey[key] = original
            return false
        }
        order.append((seq, key))
        return true
    }

    mutating func remove(_ key: DedupKey) {
        seqOfKey[key] = nil
    }

    /// Forgets the keys of records that fell out of the window once `lastSeq` is stored.
    mutating func evict(lastSeq: UInt64) {
        guard lastSeq > window else { return }
        let oldest = lastSeq - window + 1
        while head < order.count, order[head].seq < oldest {
            let (seq, key) = order[head]
            if seqOfKey[key] == seq { seqOfKey[key] = nil }
            head += 1
        }
        if head > 4096, head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}
