import Foundation
import WhendWire

extension JournalWriter {
    /// Sets who retention waits for, and who hears of records deleted before they were read.
    /// Call before `start()`.
    package func waitForReaders(_ readers: @escaping RetentionReaders, onLoss: @escaping RetentionLoss) {
        retentionReaders = readers
        retentionLoss = onLoss
    }

    /// Deletes whole sealed segments, oldest first, while the journal is over its size or age
    /// limits, but only segments every reader has passed: the oldest segment a reader still
    /// needs stops it. Past the hard limits (`retentionHardMaxBytes`, `retentionMinFreeBytes`)
    /// segments go even so, and each reader that loses records is told which. The active
    /// segment is never deleted.
    func applyRetention() {
        let now = now()
        lastRetention = now
        let configuration = configurationInUse
        let policy = RetentionPolicy(
            maxBytes: configuration.retentionMaxBytes, maxAge: configuration.retentionMaxAge,
            hardMaxBytes: configuration.retentionHardMaxBytes, minFreeBytes: configuration.retentionMinFreeBytes)
        guard !policy.isOff else { return }
        let all = configuration.directory.segments()
        var segments = all
        if let active, segments.last?.firstSeq == active.file.firstSeq { segments.removeLast() }
        if let broken, segments.last?.firstSeq == broken.firstSeq { segments.removeLast() }
        let sizes = segments.map { FileIO.size($0.path) ?? 0 }
        var total = sizes.reduce(0, +) + (active?.size ?? 0)
        let readers = (retentionReaders?() ?? []).map { RetentionPolicy.Reader(name: $0.name, cursor: $0.cursor) }
        for (index, file) in segments.enumerated() {
            // A sealed segment's records end where the next segment's begin.
            let lastSeq = (all.first { $0.firstSeq > file.firstSeq }?.firstSeq).map { $0 - 1 } ?? nextSeq - 1
            // The empty segment that keeps where `_seq` goes on holds nothing to delete.
            guard lastSeq >= file.firstSeq else { return }
            var st = stat()
            let age = stat(file.path, &st) == 0 ? now.timeIntervalSince1970 - TimeInterval(st.st_mtim.tv_sec) : 0
            let oldest = RetentionPolicy.Segment(
                firstSeq: file.firstSeq, lastSeq: lastSeq, bytes: sizes[index], age: age)
            let decision = policy.decide(
                oldest: oldest, totalBytes: total,
                freeBytes: policy.minFreeBytes > 0
                    ? FileIO.freeBytes(configuration.directory.path) : nil, readers: readers)
            switch decision {
            case .keep: return
            case .keepForReaders(let behind):
                if now.timeIntervalSince(lastKeptNotice) >= 3600 {
                    lastKeptNotice = now
                    let who = behind.map { "\($0.name) at _seq \($0.cursor)" }.joined(separator: ", ")
                    log(
                        "retention: keeping \(file.path) and what follows (\(total) bytes in all) past the limit: \(who) has not read it yet; past retention_hard_max_bytes or under retention_min_free_bytes it goes even so"
                    )
                }
                return
            case .delete(let reason, let losses):
                if file.firstSeq == all.last?.firstSeq {
                    // The last records go: an empty segment named by the next `_seq` keeps it
                    // for the next start, or `_seq`s would begin again at 1 and name new
                    // records as the deleted ones were named (to pipelines' cursors, to
                    // subscribers resuming, to dedup).
                    do {
                        try SegmentWriter.writeEmpty(directory: configuration.directory, firstSeq: nextSeq)
                    } catch {
                        log(
                            "retention: keeping \(file.path): cannot write the segment that keeps _seq \(nextSeq): \(error)"
                        )
                        return
                    }
                }
                guard unlink(file.path) == 0 else {
                    log("retention: cannot delete \(file.path): \(String(cString: strerror(errno)))")
                    return
                }
                try? FileIO.syncDirectory(configuration.directory.path)
                log("retention: deleted \(file.path) (\(reason))")
                for loss in losses {
                    log(
                        "retention: pipeline \(loss.reader) loses _seq \(loss.first)…\(loss.last), deleted before it read them"
                    )
                    retentionLoss?(loss.reader, loss.first, loss.last)
                }
                total -= sizes[index]
            }
        }
    }
}
