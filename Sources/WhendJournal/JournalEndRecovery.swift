import Foundation

extension SegmentRecovery {
    /// The suffix of a segment set aside at start: it began past records a power cut took.
    package static let setAsideSuffix = ".beyond-gap"

    /// Brings the journal's end back to a sound state at start; returns its last `_seq` (0 for
    /// none).
    ///
    /// Normally only the last segment is unsealed: the one being written. A power cut while the
    /// sync thread is behind the writer leaves more: the segments sealed and begun since the
    /// last sync that completed, their seals lost, their tails torn, their files empty. Every
    /// unsealed segment at the end is recovered, oldest first (recovering only the last one
    /// left the others unsealed for good, and `verify` failing). One that does not begin where
    /// the records before it end (the cut took records before it) is set aside, renamed with
    /// `setAsideSuffix`, and so is every one after it: under `durability = fsync` none of their
    /// records was acknowledged (syncs, and so acknowledgements, go in `_seq` order) and the
    /// clients send them again, while kept they would leave a gap in `_seq` for good. Set aside,
    /// not deleted: under `durability = write` or `none` some were acknowledged.
    ///
    /// Its cost is one index read per segment from the doubtful one on, and the recovery of
    /// those unsealed.
    ///
    /// An unsealed segment before those, from the one holding `_seq` `doubtfulFrom` on (what the
    /// last whend may not have synced), is sealed too, its records kept as they are: a journal a
    /// power cut during an older whend's start-up left so.
    static func recoverEnd(
        of directory: JournalDirectory, resealingFrom doubtfulFrom: UInt64 = 1, log: (String) -> Void
    ) throws -> UInt64 {
        let segments = directory.segments()
        var firstUnsealed = segments.count
        var sealedBefore: SegmentIndex?
        while firstUnsealed > 0 {
            let segment = segments[firstUnsealed - 1]
            if let index = SegmentIndex.read(fromFileAt: segment.path), index.firstSeq == segment.firstSeq {
                sealedBefore = index
                break
            }
            firstUnsealed -= 1
        }
        // The segments before the last sealed one, from the doubtful one on.
        let beforeSealed = max(0, firstUnsealed - 1)
        let doubtful = segments.lastIndex { $0.firstSeq <= doubtfulFrom } ?? 0
        for segment in segments[min(doubtful, beforeSealed)..<beforeSealed] {
            guard SegmentIndex.read(fromFileAt: segment.path)?.firstSeq != segment.firstSeq else { continue }
            let result = try recover(segment)
            log(
                "recovered \(segment.path), unsealed before sealed segments: kept records up to _seq \(result.lastSeq), sealed"
            )
        }
        var lastSeq = sealedBefore?.lastSeq ?? 0
        var expected = sealedBefore.map { $0.lastSeq + 1 }
        var gapAt: UInt64?
        for segment in segments[firstUnsealed...] {
            if gapAt == nil, let expected, segment.firstSeq != expected { gapAt = expected }
            if let gap = gapAt {
                // Never over an earlier one: the `_seq`s a set-aside segment began at are given
                // out again, and so are segment names.
                var aside = segment.path + setAsideSuffix
                var n = 1
                while FileManager.default.fileExists(atPath: aside) {
                    aside = segment.path + setAsideSuffix + ".\(n)"
                    n += 1
                }
                guard rename(segment.path, aside) == 0 else {
                    throw JournalIOError(operation: "rename", path: segment.path, errno: errno)
                }
                log(
                    "set \(segment.path) aside as \(aside): it begins at _seq \(segment.firstSeq), but the records before it end at _seq \(gap - 1) (a power cut took the ones between); _seq goes on from \(gap)"
                )
                continue
            }
            let result = try recover(segment)
            switch result.outcome {
            case .alreadySealed: break
            case .sealed(let dropped):
                log(
                    "recovered \(segment.path): kept records up to _seq \(result.lastSeq) (the \(dropped) bytes after its last whole frame read again, what was torn cut), sealed"
                )
            case .removedEmpty:
                log("removed \(segment.path): it held no complete record")
            }
            lastSeq = result.lastSeq
            expected = result.lastSeq + 1
        }
        if gapAt != nil { try FileIO.syncDirectory(directory.path) }
        return lastSeq
    }
}
