import CScan
import Glibc
import WhendRecord
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
    /// The mapping `slots` is in (aligned inside it to a huge page), for munmap.
    private let mapping: (base: UnsafeMutableRawPointer, bytes: Int)

    init(capacity: Int) {
        var size = 16
        while size < capacity * 2 { size <<= 1 }
        let hugePage = 2 << 20
        let bytes = size * MemoryLayout<Slot>.stride
        let alignment = bytes >= hugePage ? hugePage : 64
        // Anonymous memory, zero until touched: an empty slot is all zeros, so the table costs
        // only the pages its keys reached. (Initialised slot by slot, it was 6 MiB of whend's
        // 20 MiB of PSS while nothing had been sent.) Mapped with room to align it to a huge page.
        let mapped = bytes + alignment
        guard let base = mmap(nil, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            base != MAP_FAILED
        else {
            fatalError("cannot map the de-duplication table (\(mapped) bytes): \(String(cString: strerror(errno)))")
        }
        mapping = (base, mapped)
        let aligned = (Int(bitPattern: base) + alignment - 1) / alignment * alignment
        let memory = UnsafeMutableRawPointer(bitPattern: aligned)!
        // Advice only: without transparent huge pages the table works the same, on 4 KiB pages.
        if alignment == hugePage { _ = madvise(memory, bytes, MADV_HUGEPAGE) }
        slots = memory.bindMemory(to: Slot.self, capacity: size)
        mask = size - 1
    }

    deinit { munmap(mapping.base, mapping.bytes) }

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
