import Foundation
import WhendRecord
import WhendSystem
import WhendWire

/// Something wrong found in a segment, with where it is.
package struct JournalProblem: Sendable, CustomStringConvertible, Equatable {
    package var path: String
    /// The offset in the (compressed) file of the frame where it lies.
    package var offset: Int64
    package var message: String

    package var description: String { "\(path): offset \(offset): \(message)" }
}

/// A record as a reader sees it.
package struct JournalRecord {
    /// The stored line, without `\n`. Valid only during the callback.
    package var line: UnsafeBufferPointer<UInt8>
    /// Its `_seq`, read from the line's start where the writer puts it.
    package var seq: UInt64?
    package var segment: String
    package var frameOffset: Int64

    /// Scans (and so validates) the whole line for the fields filters and indexes use. Readers
    /// that need only the line and `_seq` skip this cost.
    package func fields() throws(WireError) -> StoredRecord {
        try StoredRecord.scan(line)
    }
}

/// The `_seq` of a stored line, from its `{"_seq":N,` prefix; nil when the line starts otherwise.
@inline(__always)
func seqPrefix(_ line: UnsafeBufferPointer<UInt8>) -> UInt64? {
    let prefix: StaticString = "{\"_seq\":"
    let n = prefix.utf8CodeUnitCount
    guard line.count > n, memcmp(line.baseAddress!, prefix.utf8Start, n) == 0 else { return nil }
    var v: UInt64 = 0
    var i = n
    while i < line.count, line[i] >= 0x30 && line[i] <= 0x39, i - n < 19 {
        v = v * 10 + UInt64(line[i] - 0x30)
        i += 1
    }
    return i > n && i < line.count && (line[i] == 0x2C || line[i] == 0x7D) ? v : nil
}

/// Reads the journal in `_seq` order, while the daemon writes it if need be.
///
/// Sealed segments are entered through their index, so that `fromSeq` and `sinceMicros` start
/// near the first wanted record instead of decompressing everything before it. The active
/// segment is read up to its last flushed commit; with `follow`, the reader waits for more and
/// moves to the next segment once the writer opens it, and after the last record it saw in the
/// file that replaced the one it read, when the writer's repair of a failed write replaced it.
package struct JournalReader: Sendable {
    package let directory: JournalDirectory
    /// How long a following reader waits for a change it is not told of (inotify tells it of
    /// every commit; this bounds the wait where inotify is missing).
    package var pollInterval: TimeInterval = 0.1

    package init(directory: JournalDirectory) {
        self.directory = directory
    }

    /// Calls `body` for every record with `_seq ≥ fromSeq` (when given), in order, until it
    /// returns false.
    ///
    /// - Parameters:
    ///   - sinceMicros: skip sealed frames whose records were all received before this time.
    ///     Records are not filtered by it: the caller filters exactly.
    ///   - follow: at the end of the journal, wait for new records instead of returning.
    ///   - onCaughtUp: called each time the reader has read everything there is (when
    ///     following); returning false stops the reading.
    ///   - onProblem: called for damage; the reader then goes on with the next segment.
    package func read(
        fromSeq: UInt64? = nil, sinceMicros: Int64? = nil, follow: Bool = false,
        body: (JournalRecord, _ isLive: Bool) -> Bool,
        onCaughtUp: () -> Bool = { true },
        onProblem: (JournalProblem) -> Void
    ) {
        // Watching before the first read: a commit between the last read and the wait still wakes it.
        let changes = follow ? JournalChangeWaiter(directory: directory.path) : nil
        var segments = directory.segments()
        var position = startPosition(segments, fromSeq: fromSeq, sinceMicros: sinceMicros)
        var lastSeqSeen: UInt64 = 0
        // Records before this are not given: `fromSeq`, then (once a segment was replaced under
        // the reader) whatever was seen already, as the new file holds those records again.
        var from = fromSeq
        while true {
            guard let (index, startOffset) = position, index < segments.count else {
                // Nothing to read yet (an empty journal): wait for a first segment if following.
                guard follow, onCaughtUp() else { return }
                changes?.wait(timeout: pollInterval)
                segments = directory.segments()
                position =
                    segments.isEmpty
                    ? nil : (segments.firstIndex { $0.firstSeq > lastSeqSeen } ?? segments.count - 1, 0)
                continue
            }
            let segment = segments[index]
            // Kept open across the pipeline's plugin calls.
            let fd = PluginDescriptors.opened(path: segment.path) { open(segment.path, O_RDONLY | O_CLOEXEC) }
            guard fd >= 0 else {
                if errno == ENOENT {  // deleted by retention meanwhile
                    segments = directory.segments()
                    position = segments.firstIndex { $0.firstSeq > lastSeqSeen }.map { ($0, 0) }
                    continue
                }
                onProblem(
                    JournalProblem(
                        path: segment.path, offset: 0, message: "cannot open: \(String(cString: strerror(errno)))"))
                position = (index + 1, 0)
                continue
            }
            defer { close(fd) }
            let decoder = SegmentDecoder(startingAt: startOffset)
            var offset = off_t(startOffset)
            var chunk = [UInt8](repeating: 0, count: 1 << 18)
            var stop = false
            var damaged = false
            var resumeAt: Int64?
            var nextSegmentSeen = false
            var replaced = false
            reading: while true {
                let n = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, offset) }
                if n > 0 {
                    offset += off_t(n)
                    let isLast = index == segments.count - 1
                    do {
                        try chunk.withUnsafeBytes { raw in
                            try decoder.feed(UnsafeRawBufferPointer(rebasing: raw[0..<n])) { event in
                                guard case .line(let line, let frameOffset) = event else { return }
                                var seq = seqPrefix(line)
                                if seq == nil {
                                    // Not as the writer lays records out: scan the whole line.
                                    do { seq = try StoredRecord.scan(line).seq } catch {
                                        onProblem(
                                            JournalProblem(
                                                path: segment.path, offset: frameOffset,
                                                message: "a line is not a JSON object: \(error)"))
                                        return
                                    }
                                }
                                if let seq {
                                    lastSeqSeen = max(lastSeqSeen, seq)
                                    if let from, seq < from { return }
                                }
                                let record = JournalRecord(
                                    line: line, seq: seq, segment: segment.path, frameOffset: frameOffset)
                                if !body(record, isLast) { throw StopReading() }
                            }
                        }
                    } catch is StopReading {
                        stop = true
                        break reading
                    } catch let failure as SegmentDecoder.Failure {
                        damaged = true
                        // In a sealed segment the index says where the next frame starts: skip
                        // only the damaged frame.
                        let next = SegmentIndex.read(fromFileAt: segment.path)?.entries
                            .first { $0.offset > failure.offset }
                        resumeAt = next?.offset
                        let skip =
                            next.map { "; skipped to the next frame at offset \($0.offset)" }
                            ?? "; skipped the rest of the segment"
                        onProblem(
                            JournalProblem(path: segment.path, offset: failure.offset, message: failure.message + skip))
                        break reading
                    } catch {
                        damaged = true
                        break reading
                    }
                    continue
                }
                if n < 0 && errno == EINTR { continue }
                // End of the file as it is now. The writer's repair of a failed write replaces
                // the file it tore: rewritten and renamed over it, or removed and (when it held
                // no whole record) created again under the same name, with the same first
                // `_seq`, and written on. What is open is then a file nothing writes to any more,
                // and its name will never change to tell: what is at the name counts.
                if isReplaced(fd, segment.path) {
                    replaced = true
                    break reading
                }
                if index < segments.count - 1 || nextSegmentSeen { break reading }
                guard follow else { break reading }
                if !onCaughtUp() {
                    stop = true
                    break reading
                }
                changes?.wait(timeout: pollInterval)
                let now = directory.segments()
                if now.last.map({ $0.firstSeq > segment.firstSeq }) == true {
                    // The writer moved on: this segment is sealed; read what remains, then go on.
                    segments = now
                    nextSegmentSeen = true
                }
            }
            if stop { return }
            if replaced {
                from = max(from ?? 0, lastSeqSeen + 1)
                segments = directory.segments()
                position = startPosition(segments, fromSeq: from, sinceMicros: sinceMicros)
                continue
            }
            if let resumeAt {
                position = (index, resumeAt)
                continue
            }
            let isLast = index == segments.count - 1
            if !damaged, !decoder.isBetweenFrames, !isLast {
                onProblem(
                    JournalProblem(
                        path: segment.path, offset: decoder.frameStart ?? 0,
                        message:
                            "the segment ends inside a frame: it was torn and not recovered; start whend once to recover it"
                    ))
            }
            if isLast && !follow { return }
            if isLast {
                // Following, and the last segment vanished or was damaged: look again.
                segments = directory.segments()
                position = segments.firstIndex { $0.firstSeq > lastSeqSeen }.map { ($0, 0) } ?? (segments.count, 0)
                continue
            }
            if let i = segments.firstIndex(where: { $0.firstSeq > segment.firstSeq }) {
                position = (i, 0)
            } else {
                position = (segments.count, 0)
            }
        }
    }

    private struct StopReading: Error {}

    /// Whether the file open as `fd` is no longer the one at `path` (replaced, or removed).
    private func isReplaced(_ fd: Int32, _ path: String) -> Bool {
        var opened = stat()
        var current = stat()
        guard fstat(fd, &opened) == 0 else { return false }
        guard stat(path, &current) == 0 else { return errno == ENOENT }
        return opened.st_ino != current.st_ino || opened.st_dev != current.st_dev
    }

    /// The segment and offset where reading starts.
    func startPosition(_ segments: [SegmentFile], fromSeq: UInt64?, sinceMicros: Int64?) -> (Int, Int64)? {
        guard !segments.isEmpty else { return nil }
        var start = 0
        if let fromSeq {
            start = segments.lastIndex { $0.firstSeq <= fromSeq } ?? 0
        }
        for i in start..<segments.count {
            guard let index = SegmentIndex.read(fromFileAt: segments[i].path) else { return (i, 0) }
            if let fromSeq, index.lastSeq < fromSeq { continue }
            var offset: Int64 = fromSeq.map { index.offset(forSeq: $0) } ?? 0
            if let sinceMicros {
                guard let timeOffset = index.offset(forReceivedMicros: sinceMicros) else { continue }
                offset = max(offset, timeOffset)
            }
            return (i, offset)
        }
        return (segments.count - 1, 0)
    }
}
