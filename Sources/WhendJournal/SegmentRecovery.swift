import CZstd
import Foundation
import WhendRecord
import WhendWire

/// Brings the unsealed last segment back to a sealed state after a crash or a failed write.
///
/// It keeps every complete record, in order, with contiguous `_seq`s from the segment's name;
/// cuts whatever follows the last one (a torn frame, a torn line, garbage); and seals the
/// segment. The torn frame cannot simply be continued, and a new frame cannot follow an
/// unfinished one (decoders would report corruption and drop data), so the records of the torn
/// frame are compressed again into a fresh, finished frame. The new file is written beside the
/// old one and renamed over it, so a crash during recovery leaves the old file as it was.
package enum SegmentRecovery {
    package enum Outcome: Sendable, Equatable {
        /// The segment was sealed already: nothing touched.
        case alreadySealed
        /// The segment was sealed now; `droppedBytes` of its tail could not be kept.
        case sealed(droppedBytes: Int64)
        /// The segment held no complete record and was removed.
        case removedEmpty
    }

    package struct Result: Sendable {
        package var outcome: Outcome
        /// The last `_seq` the segment holds (`firstSeq - 1` when none).
        package var lastSeq: UInt64
        package var index: SegmentIndex?
        /// Lines kept that are not sound records (a record once split over lines by a plugin):
        /// kept with the records around them, and left for `verify` to name.
        package var unreadableLines = 0
    }

    /// Recovers `segment` in place.
    /// - Parameters:
    ///   - evenIfSealed: rewrite a sealed segment too (its records into a new file, synced
    ///     whole): after a failed sync, what the file shows may be held only in memory.
    ///   - onRecord: called for every record kept, in order (for the de-duplication window).
    package static func recover(
        _ segment: SegmentFile, evenIfSealed: Bool = false, onRecord: (StoredRecord) -> Void = { _ in }
    ) throws -> Result {
        if !evenIfSealed, let index = SegmentIndex.read(fromFileAt: segment.path), index.firstSeq == segment.firstSeq {
            return Result(outcome: .alreadySealed, lastSeq: index.lastSeq, index: index)
        }
        let data = try FileIO.readAll(segment.path)
        var entries: [SegmentIndex.Entry] = []
        var expected = segment.firstSeq
        var cut: Int64 = 0  // end of the last frame kept whole
        var frameLines: [[UInt8]] = []  // lines of the frame being decoded
        var frameEntry: SegmentIndex.Entry?
        var frameSizes: [UInt32] = []  // uncompressed bytes of each frame kept
        var frameSize: UInt32 = 0
        var lastReceived: Int64 = 0  // `_rt` of the last record kept, for one that has none
        var unreadable = 0

        struct Stop: Error {}
        let decoder = SegmentDecoder()
        do {
            try data.withUnsafeBytes { raw in
                try decoder.feed(raw) { event in
                    switch event {
                    case .line(let line, let frameOffset):
                        // The decoder gives only whole lines, as the writer wrote them: a torn
                        // write shows as a frame that fails, never as a line cut short. So a
                        // line that is not a sound record is no tear, and must not cost the
                        // records around it (a record split over lines once cost the whole
                        // segment: its first line did not scan, nothing was kept, the file was
                        // removed and `_seq` started again at 1). A line that starts as the
                        // next record is counted as that record; one that starts as no record
                        // is kept with its frame, counted as none. Only a record out of order
                        // ends what is kept.
                        let rt: Int64
                        if let record = try? StoredRecord.scan(line) {
                            guard record.seq == expected else { throw Stop() }
                            rt = record.receivedMicros ?? lastReceived
                            onRecord(record)
                        } else if let seq = seqPrefix(line) {
                            guard seq == expected else { throw Stop() }
                            rt = lastReceived
                            unreadable += 1
                        } else {
                            guard frameEntry != nil else { throw Stop() }
                            unreadable += 1
                            frameLines.append(Array(line))
                            frameSize += UInt32(line.count + 1)
                            return
                        }
                        lastReceived = rt
                        if frameEntry == nil {
                            frameEntry = .init(
                                offset: frameOffset, firstSeq: expected, minReceivedMicros: rt, maxReceivedMicros: rt)
                        } else {
                            frameEntry!.minReceivedMicros = min(frameEntry!.minReceivedMicros, rt)
                            frameEntry!.maxReceivedMicros = max(frameEntry!.maxReceivedMicros, rt)
                        }
                        frameLines.append(Array(line))
                        frameSize += UInt32(line.count + 1)
                        expected += 1
                    case .frameEnd(_, let end):
                        // A skippable frame (an index of a seal that was torn) holds no
                        // records: what is kept ends with the last frame that has some.
                        guard let e = frameEntry else { return }
                        entries.append(e)
                        frameSizes.append(frameSize)
                        frameEntry = nil
                        frameSize = 0
                        frameLines.removeAll()
                        cut = end
                    }
                }
            }
        } catch {
            // A torn or damaged tail: everything decoded before it is kept, the rest is cut.
        }
        let lastSeq = expected - 1
        if lastSeq < segment.firstSeq {
            guard unlink(segment.path) == 0 || errno == ENOENT else {
                throw JournalIOError(operation: "unlink", path: segment.path, errno: errno)
            }
            return Result(outcome: .removedEmpty, lastSeq: lastSeq, index: nil)
        }

        // The new file: the whole frames as they are, the torn frame's records in a new frame,
        // then the index and the seek table.
        var rebuilt = Array(data[0..<Int(cut)])
        if !frameLines.isEmpty, var entry = frameEntry {
            entry.offset = cut
            entries.append(entry)
            var plain: [UInt8] = []
            for line in frameLines {
                plain.append(contentsOf: line)
                plain.append(0x0A)
            }
            let compressor = ZstdCompressor(level: ZstdCompressor.journalLevel)
            plain.withUnsafeBytes { compressor.compress($0, directive: ZSTD_e_end, into: &rebuilt) }
            frameSizes.append(UInt32(plain.count))
        }
        let index = SegmentIndex(firstSeq: segment.firstSeq, lastSeq: lastSeq, entries: entries)
        rebuilt.append(
            contentsOf: index.sealingFrames(decompressedSizes: frameSizes, dataEnd: Int64(rebuilt.count)))

        let temporary = segment.path + ".recovering"
        let fd = try FileIO.open(temporary, O_WRONLY | O_CREAT | O_TRUNC)
        do {
            try rebuilt.withUnsafeBytes { b in try FileIO.writeAll(fd, b, path: temporary) }
            try FileIO.sync(fd, path: temporary)
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, segment.path) == 0 else {
            let e = errno
            unlink(temporary)
            throw JournalIOError(operation: "rename", path: temporary, errno: e)
        }
        try FileIO.syncDirectory((segment.path as NSString).deletingLastPathComponent)
        let dropped = Int64(data.count) - cut
        return Result(
            outcome: .sealed(droppedBytes: max(0, dropped)), lastSeq: lastSeq, index: index, unreadableLines: unreadable
        )
    }
}
