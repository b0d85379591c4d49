import Foundation
import WhendRecord
import WhendWire

/// What `whenctl verify` found.
package struct VerificationReport: Sendable {
    package var segments = 0
    package var records: UInt64 = 0
    package var firstSeq: UInt64?
    package var lastSeq: UInt64?
    package var problems: [JournalProblem] = []
    /// Facts that are not problems, such as a segment being written right now.
    package var notes: [String] = []

    package var isClean: Bool { problems.isEmpty }
}

/// Checks every segment: zstd integrity (frame checksums included), one JSON object per line,
/// `_seq` contiguous within and across segments, and each sealed segment's index.
package struct JournalVerifier: Sendable {
    package let directory: JournalDirectory

    package init(directory: JournalDirectory) {
        self.directory = directory
    }

    /// - Parameter progress: called after each segment with (done, total).
    package func verify(progress: (Int, Int) -> Void = { _, _ in }) -> VerificationReport {
        var report = VerificationReport()
        let segments = directory.segments()
        var previousLast: UInt64?
        for (i, segment) in segments.enumerated() {
            let isLast = i == segments.count - 1
            report.segments += 1
            if let previousLast, segment.firstSeq != previousLast + 1 {
                let message =
                    segment.firstSeq > previousLast + 1
                    ? "_seq \(previousLast + 1)…\(segment.firstSeq - 1) are missing before this segment"
                    : "this segment starts at _seq \(segment.firstSeq), but the one before ends at \(previousLast)"
                report.problems.append(JournalProblem(path: segment.path, offset: 0, message: message))
            }
            let problemsBefore = report.problems.count
            let last = verify(segment, isLast: isLast, into: &report)
            previousLast = last ?? (segment.firstSeq - 1)
            // A damaged segment's unreadable records are its own problem, already reported:
            // carry on from what its index says it holds, so the next one is not blamed.
            if report.problems.count > problemsBefore, let index = SegmentIndex.read(fromFileAt: segment.path) {
                previousLast = index.lastSeq
            }
            progress(i + 1, segments.count)
        }
        return report
    }

    /// Returns the last `_seq` found in the segment.
    private func verify(_ segment: SegmentFile, isLast: Bool, into report: inout VerificationReport) -> UInt64? {
        func problem(_ offset: Int64, _ message: String) {
            report.problems.append(JournalProblem(path: segment.path, offset: offset, message: message))
        }
        let data: [UInt8]
        do { data = try FileIO.readAll(segment.path) } catch {
            problem(0, "cannot read: \(error)")
            return nil
        }
        var expected = segment.firstSeq
        var lastSeq: UInt64?
        var frameStarts = Set<Int64>()
        var lineInFrame = 0
        // Each frame of records decoded whole: where it starts, and its uncompressed bytes.
        var frames: [(start: Int64, bytes: Int)] = []
        var frameBytes = 0
        var damaged = false  // a frame that does not decode: reported, and no seek table check
        let sealedIndex = SegmentIndex.read(fromFileAt: segment.path)
        var start: Int64 = 0
        var decoder = SegmentDecoder()
        // Decode from `start`; after a damaged frame, go on from the next frame the index lists.
        while true {
            decoder = SegmentDecoder(startingAt: start)
            do {
                try data.withUnsafeBytes { raw in
                    try decoder.feed(UnsafeRawBufferPointer(rebasing: raw[Int(start)...])) { event in
                        switch event {
                        case .frameEnd(let frameStart, _):
                            if lineInFrame > 0 { frames.append((frameStart, frameBytes)) }
                            lineInFrame = 0
                            frameBytes = 0
                        case .line(let line, let frameOffset):
                            frameStarts.insert(frameOffset)
                            lineInFrame += 1
                            frameBytes += line.count + 1
                            let fields: StoredRecord
                            do { fields = try StoredRecord.scan(line) } catch {
                                problem(frameOffset, "line \(lineInFrame) of the frame is not a JSON object (\(error))")
                                // As recovery counts it: a line that begins as the next record is
                                // that record, unreadable; one that begins as none (the rest of a
                                // record a plugin once split over lines) is no record at all.
                                if let seq = seqPrefix(line), seq == expected {
                                    lastSeq = seq
                                    expected += 1
                                }
                                return
                            }
                            guard let seq = fields.seq else {
                                problem(frameOffset, "line \(lineInFrame) of the frame has no _seq")
                                expected += 1
                                return
                            }
                            if seq != expected {
                                problem(frameOffset, "expected _seq \(expected), found \(seq)")
                            }
                            expected = seq + 1
                            lastSeq = seq
                            report.records += 1
                            if report.firstSeq == nil { report.firstSeq = seq }
                            report.lastSeq = seq
                        }
                    }
                }
                break
            } catch let failure as SegmentDecoder.Failure {
                lineInFrame = 0
                frameBytes = 0
                damaged = true
                frameStarts.insert(failure.offset)  // reported here, not again by the index check
                guard let next = sealedIndex?.entries.first(where: { $0.offset > failure.offset }),
                    next.offset < Int64(data.count)
                else {
                    problem(failure.offset, "\(failure.message); the rest of the segment cannot be read")
                    return sealedIndex?.lastSeq ?? lastSeq
                }
                problem(
                    failure.offset,
                    "\(failure.message); records from _seq \(expected) to \(next.firstSeq - 1) of this frame are unreadable"
                )
                start = next.offset
                expected = next.firstSeq
            } catch {
                problem(0, "\(error)")
                return lastSeq
            }
        }
        if let index = sealedIndex {
            if index.firstSeq != segment.firstSeq || index.lastSeq != (lastSeq ?? segment.firstSeq - 1) {
                problem(
                    0,
                    "the index says _seq \(index.firstSeq)…\(index.lastSeq), the records say \(segment.firstSeq)…\(lastSeq.map(String.init) ?? "none")"
                )
            }
            for entry in index.entries where !frameStarts.contains(entry.offset) {
                problem(entry.offset, "the index points to offset \(entry.offset), where no frame of records starts")
            }
            if !damaged, let table = SeekTable.read(fromFileAt: segment.path) {
                checkSeekTable(table, against: frames, indexSize: index.encodedSize, problem: problem)
            }
        } else if isLast {
            report.notes.append("\(segment.path) is the active segment (not sealed yet)")
            if !decoder.isBetweenFrames, decoder.pendingLineBytes > 0 {
                report.notes.append(
                    "\(segment.path) ends inside a record: being written, or torn (whend recovers it at start)")
            }
        } else {
            problem(
                0,
                "not sealed, yet not the last segment: it was torn and never recovered; start whend once to recover it")
        }
        return lastSeq
    }

    /// The seek table lists every frame of records as decoded (where it starts, by the sum of
    /// the sizes before it, and its uncompressed bytes), then whend's index frame.
    private func checkSeekTable(
        _ table: SeekTable, against frames: [(start: Int64, bytes: Int)], indexSize: Int,
        problem: (Int64, String) -> Void
    ) {
        guard table.frames.count == frames.count + 1 else {
            problem(
                0,
                "the seek table lists \(table.frames.count) frames; the segment has \(frames.count) frames of records and its index"
            )
            return
        }
        var offset: Int64 = 0
        for (i, entry) in table.frames.dropLast().enumerated() {
            if offset != frames[i].start || Int(entry.decompressedSize) != frames[i].bytes {
                problem(
                    frames[i].start,
                    "the seek table puts frame \(i + 1) at offset \(offset) with \(entry.decompressedSize) bytes uncompressed; it is at \(frames[i].start) with \(frames[i].bytes)"
                )
                return
            }
            offset += Int64(entry.compressedSize)
        }
        if let last = table.frames.last, Int(last.compressedSize) != indexSize || last.decompressedSize != 0 {
            problem(offset, "the seek table's last entry is not the index frame (\(indexSize) bytes)")
        }
    }
}
