import CScan
import Glibc
import WhendWire

/// An open-addressing hash table from de-duplication keys to `_seq`s, sized once.
///
/// Keys are already uniform 128-bit digests, so their low bits index the table directly: no
/// hashing per lookup, no rehash ever (the table is sized for twice the window up front), linear
/// probing, and deletion by backward shift so that no tombstones accumulate.
///
/// Each slot keeps its key and `_seq` side by side, in one allocation backed by huge pages where
/// the kernel offers them: every record stored costs the writer thread a lookup and, once the
/// window is full, a removal, each at a random place in several megabytes, so a probe must touch
/// one cache line and no page-table walk (with the key halves and the `_seq`s in three arrays, a
/// probe touched three lines, and the table was a quarter of the writer's time).
final class DedupTable {
    private struct Slot {
        var low: UInt64
        var high: UInt64
        /// 0 marks an empty slot: `_seq`s start at 1.
        var seq: UInt64
    }

    private let slots: UnsafeMutablePointer<Slot>
    private let mask: Int
    private(set) var count = 0

    init(capacity: Int) {
        var size = 16
        while size < capacity * 2 { size <<= 1 }
        let hugePage = 2 << 20
        var bytes = size * MemoryLayout<Slot>.stride
        let alignment = bytes >= hugePage ? hugePage : 64
        bytes = (bytes + alignment - 1) / alignment * alignment
        var memory: UnsafeMutableRawPointer?
        guard posix_memalign(&memory, alignment, bytes) == 0, let memory else {
            fatalError("cannot allocate the de-duplication table (\(bytes) bytes)")
        }
        // Advice only: without transparent huge pages the table works the same, on 4 KiB pages.
        if alignment == hugePage { _ = madvise(memory, bytes, MADV_HUGEPAGE) }
        slots = memory.bindMemory(to: Slot.self, capacity: size)
        slots.initialize(repeating: Slot(low: 0, high: 0, seq: 0), count: size)
        mask = size - 1
    }

    deinit { free(slots) }

    @inline(__always) private func home(_ low: UInt64) -> Int { Int(truncatingIfNeeded: low) & mask }

    /// The slot holding `key`, or the empty slot where it would go.
    @inline(__always) private func slot(of key: DedupKey) -> (index: Int, found: Bool) {
        var i = home(key.low)
        while slots[i].seq != 0 {
            if slots[i].low == key.low && slots[i].high == key.high { return (i, true) }
            i = (i + 1) & mask
        }
        return (i, false)
    }

    /// Starts loading `key`'s home slot into the cache: a lookup of it a little later finds it
    /// there instead of waiting on memory.
    /// The slot after it too: a removal looks there first (its backward shift), and with
    /// 24-byte slots it is often on the next line.
    @inline(__always) func prefetch(_ key: DedupKey) {
        let i = home(key.low)
        whend_prefetch(UnsafeRawPointer(slots + i))
        whend_prefetch(UnsafeRawPointer(slots + ((i + 1) & mask)) + MemoryLayout<Slot>.stride - 1)
    }

    func seq(of key: DedupKey) -> UInt64? {
        let (i, found) = slot(of: key)
        return found ? slots[i].seq : nil
    }

    /// Stores `key` at `seq` unless present. Returns the stored `_seq` of a key already there.
    func insertIfAbsent(_ key: DedupKey, seq: UInt64) -> UInt64? {
        let (i, found) = slot(of: key)
        if found { return slots[i].seq }
        precondition(count < mask, "the de-duplication table is full; it is sized for its window")
        slots[i] = Slot(low: key.low, high: key.high, seq: seq)
        count += 1
        return nil
    }

    /// Removes `key` if it is stored at `seq` (a later resend may have moved nothing: a key is
    /// only ever stored once, but the caller states which entry it means).
    func remove(_ key: DedupKey, ifSeq seq: UInt64? = nil) {
        var (i, found) = slot(of: key)
        guard found, seq == nil || slots[i].seq == seq else { return }
        // Backward shift: pull later entries of the probe run into the hole when their home
        // slot does not lie cyclically between the hole and where they are.
        var j = i
        while true {
            j = (j + 1) & mask
            if slots[j].seq == 0 { break }
            let k = home(slots[j].low)
            let staysPut = i <= j ? (i < k && k <= j) : (i < k || k <= j)
            if staysPut { continue }
            slots[i] = slots[j]
            i = j
        }
        slots[i].seq = 0
        count -= 1
    }
}
