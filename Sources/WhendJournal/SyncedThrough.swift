import Foundation

/// `synced-through` in the journal directory: every record up to this `_seq` is durable.
///
/// A whend killed while its syncs lagged leaves segments written, and sealed, that nothing
/// synced; the next whend, syncing only the end of the journal at start-up, then acknowledged
/// records after them, and a later power cut tore them out of the middle of the journal (a gap
/// in `_seq` for good, with acknowledged records after it). With this mark, start-up syncs
/// every segment holding records after it before anything is acknowledged.
///
/// It is written after the syncs it speaks for have returned, at most ten times a second, and
/// in place (20 digits and a newline, never truncated); synced at most every five seconds: a
/// value the disk lost is an older one, still true; a crash leaves the last one written, which
/// the kernel holds; a power cut, one at most five seconds old (unsynced, the mark was lost at
/// every cut, and each start after one synced the whole journal); a file that cannot be read
/// is no mark, and start-up syncs every segment.
final class SyncedThrough: @unchecked Sendable {
    // Unchecked: the mutable state is guarded by `lock`.
    static let fileName = "synced-through"
    private let path: String
    private let lock = NSLock()
    private var value: UInt64
    private var written: UInt64?
    private var writtenAtNanos: UInt64 = 0
    private var syncedAtNanos: UInt64?

    /// The mark of `directory` as the last whend left it, if it can be read.
    static func read(_ directory: JournalDirectory) -> UInt64? {
        guard let data = FileManager.default.contents(atPath: directory.path + "/" + fileName),
            let text = String(data: data, encoding: .utf8)
        else { return nil }
        return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Everything through `value` is durable now: written at once (when there is anything).
    init(_ directory: JournalDirectory, durableThrough value: UInt64) {
        path = directory.path + "/" + Self.fileName
        self.value = value
        if value > 0 { flush() }
    }

    var durableThrough: UInt64 { lock.withLock { value } }

    /// Records `first…last` were synced: the mark moves on to `last` if it reaches `first`
    /// (else a record between is in doubt, as after a failed sync: it stays, and the next
    /// start syncs from it).
    func synced(from first: UInt64, through last: UInt64) {
        let now = DispatchTime.now().uptimeNanoseconds
        let due: Bool = lock.withLock {
            guard first <= value + 1, last > value else { return false }
            value = last
            return now &- writtenAtNanos >= 100_000_000
        }
        if due { flush() }
    }

    /// Writes the mark if it moved since it was last written.
    func flush() {
        let (mark, stale): (UInt64, Bool) = lock.withLock { (value, written != value) }
        guard stale else { return }
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o640)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let digits = String(mark)
        let text = Array((String(repeating: "0", count: max(0, 20 - digits.count)) + digits + "\n").utf8)
        let done = text.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) } == text.count
        guard done else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        let syncDue: Bool = lock.withLock {
            written = mark
            writtenAtNanos = now
            return syncedAtNanos.map { now &- $0 >= 5_000_000_000 } ?? true
        }
        guard syncDue, fdatasync(fd) == 0 else { return }
        // The first time, its name too.
        if lock.withLock({ syncedAtNanos == nil }) {
            try? FileIO.syncDirectory((path as NSString).deletingLastPathComponent)
        }
        lock.withLock { syncedAtNanos = now }
    }
}
