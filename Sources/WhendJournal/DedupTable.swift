import WhendWire

/// An open-addressing hash table from de-duplication keys to `_seq`s, sized once.
///
/// Keys are already uniform 128-bit digests, so their low bits index the table directly: no
/// hashing per lookup, no rehash ever (the table is sized for twice the window up front), linear
/// probing over flat arrays, and deletion by backward shift so that no tombstones accumulate.
struct DedupTable {
    private var lows: [UInt64]
    private var highs: [UInt64]
    /// 0 marks an empty slot: `_seq`s start at 1.
    private var seqs: [UInt64]
    private let mask: Int
    private(set) var count = 0

    init(capacity: Int) {
        var size = 16
        while size < capacity * 2 { size <<= 1 }
        lows = Array(repeating: 0, count: size)
        highs = Array(repeating: 0, count: size)
        seqs = Array(repeating: 0, count: size)
        mask = size - 1
    }

    @inline(__always) private func home(_ low: UInt64) -> Int { Int(truncatingIfNeeded: low) & mask }

    /// The slot holding `key`, or the empty slot where it would go.
    @inline(__always) private func slot(of key: DedupKey) -> (index: Int, found: Bool) {
        var i = home(key.low)
        while seqs[i] != 0 {
            if lows[i] == key.low && highs[i] == key.high { return (i, true) }
            i = (i + 1) & mask
        }
        return (i, false)
    }

    func seq(of key: DedupKey) -> UInt64? {
        let (i, found) = slot(of: key)
        return found ? seqs[i] : nil
    }

    /// Stores `key` at `seq` unless present. Returns the stored `_seq` of a key already there.
    mutating func insertIfAbsent(_ key: DedupKey, seq: UInt64) -> UInt64? {
        let (i, found) = slot(of: key)
        if found { return seqs[i] }
        precondition(count < mask, "the de-duplication table is full; it is sized for its window")
        lows[i] = key.low
        highs[i] = key.high
        seqs[i] = seq
        count += 1
        return nil
    }

    /// Removes `key` if it is stored at `seq` (a later resend may have moved nothing: a key is
    /// only ever stored once, but the caller states which entry it means).
    mutating func remove(_ key: DedupKey, ifSeq seq: UInt64? = nil) {
        var (i, found) = slot(of: key)
        guard found, seq == nil || seqs[i] == seq else { return }
        // Backward shift: pull later entries of the probe run into the hole when their home
        // slot does not lie cyclically between the hole and where they are.
        var j = i
        while true {
            j = (j + 1) & mask
            if seqs[j] == 0 { break }
            let k = home(lows[j])
            let staysPut = i <= j ? (i < k && k <= j) : (i < k || k <= j)
            if staysPut { continue }
            lows[i] = lows[j]
            highs[i] = highs[j]
            seqs[i] = seqs[j]
            i = j
        }
        seqs[i] = 0
        count -= 1
    }
}
