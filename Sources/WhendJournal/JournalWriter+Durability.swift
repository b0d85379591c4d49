import Foundation

extension JournalWriter {
    /// Syncs every segment that holds records from `_seq` `from` on, and the directory, before
    /// anything is acknowledged: the previous whend may have written them and died before their
    /// syncs (under `durability = fsync` a sealed segment's sync runs after the seal, on the sync
    /// thread), and a resend acknowledged as a duplicate of a record is only as durable as the
    /// record. Recovery syncs the unsealed tail, but not the sealed segments before it. A segment
    /// whose sync fails is rewritten whole and synced, as after a failed sync while running.
    ///
    /// Each is an `fdatasync` of a file that is usually clean already (a cache flush at most); the
    /// window spans a few segments at most unless they are tiny. Not `syncfs`: it would wait for
    /// every other program's writes on that file system too, and a FUSE file system does not see it.
    static func makeDurable(
        _ directory: JournalDirectory, recordsFrom from: UInt64, log: (String) -> Void
    ) throws {
        let segments = directory.segments()
        for (i, segment) in segments.enumerated() {
            // A segment's records end where the next one's begin.
            if i + 1 < segments.count, segments[i + 1].firstSeq <= from { continue }
            let fd = try FileIO.open(segment.path, O_RDONLY)
            let synced = fdatasync(fd) == 0
            let error = errno
            close(fd)
            guard !synced else { continue }
            log(
                "syncing \(segment.path) at start failed: \(String(cString: strerror(error))); rewriting it")
            _ = try SegmentRecovery.recover(segment, evenIfSealed: true)
        }
        try FileIO.syncDirectory(directory.path)
    }
}
