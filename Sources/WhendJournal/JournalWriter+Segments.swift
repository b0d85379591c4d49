import Foundation
import WhendWire

extension JournalWriter {
    func activeSegment() throws -> SegmentWriter {
        if let active { return active }
        let directory = configurationInUse.directory
        let segment = try SegmentWriter(
            directory: directory, firstSeq: nextSeq, compressor: compressor,
            frameBytes: configurationInUse.frameBytes, openedAt: now(),
            replacingEmpty: SegmentWriter.isEmptySealed(directory.segmentPath(firstSeq: nextSeq), firstSeq: nextSeq))
        active = segment
        return segment
    }

    /// After a failed write, seals what the torn segment holds and carries `_seq` on from it.
    /// Returns why the journal still cannot store, or nil when it can.
    func repairIfBroken() -> CommitFailure? {
        if let sealed = unsyncedSealed {
            do {
                let result = try SegmentRecovery.recover(sealed, evenIfSealed: true)
                unsyncedSealed = nil
                log("rewrote \(sealed.path) after its sync failed: records up to _seq \(result.lastSeq) are durable")
                if broken == nil { madeDurable() }
            } catch {
                return .cannotStore("\(error)")
            }
        }
        guard let segment = broken else { return nil }
        do {
            let result = try SegmentRecovery.recover(segment) { record in
                if !record.isDerived, let key = record.dedupKey, let seq = record.seq, seq >= nextSeq {
                    dedup.insert(key, seq: seq)
                }
            }
            nextSeq = result.lastSeq + 1
            condition.lock()
            stats.writtenThrough = nextSeq - 1
            condition.unlock()
            broken = nil
            log("the journal can store again: recovered \(segment.path) up to _seq \(result.lastSeq)")
            madeDurable()
            return nil
        } catch {
            return .cannotStore("\(error)")
        }
    }

    /// What a failed sync left is durable again (rewritten and synced): resends of it may be
    /// acknowledged, unless another sync failed since (its report is taken up next).
    private func madeDurable() {
        condition.lock()
        if syncFailure == nil { notDurableFrom = nil }
        condition.unlock()
    }

    func flushQuietly() {
        guard let active else { return }
        do { try active.flush() } catch {
            broken = active.file
            self.active = nil
            log("flushing \(active.file.path) failed: \(error)")
        }
    }

    func rotate() {
        guard let segment = active else { return }
        active = nil
        do {
            try seal(segment)
        } catch {
            broken = segment.file
            log("sealing \(segment.file.path) failed: \(error); it will be recovered before the next write")
        }
        applyRetention()
    }

    /// Seals a segment. Under `durability = fsync` its sync goes through the sync thread, after
    /// the groups written before it: one thread alone syncs the active segment's file, so that
    /// a failed sync is seen by the thread that acknowledges (a second `fdatasync` of the same
    /// file would report success for the pages the first failed to write).
    func seal(_ segment: SegmentWriter) throws {
        guard configurationInUse.durability == .fsync, let syncer else {
            // Synced whole: under `write` and `none`, where the records become durable.
            try segment.seal()
            syncedThrough.synced(from: segment.file.firstSeq, through: segment.lastSeq)
            return
        }
        try segment.seal(sync: false)
        syncer.hand(
            WrittenGroup(
                completions: [], submittedBytes: 0, segment: segment, outcome: .stored(lastSeq: segment.lastSeq),
                firstSeq: segment.lastSeq + 1))
    }

    func maintain() {
        let now = now()
        lastMaintenance = now
        if let segment = active, segment.recordCount > 0,
            now.timeIntervalSince(segment.openedAt) >= configurationInUse.segmentMaxAge
        {
            rotate()
        }
        if now.timeIntervalSince(lastRetention) >= 60 { applyRetention() }
    }
}
