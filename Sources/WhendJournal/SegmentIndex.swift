import Foundation

/// whend's index of a sealed segment (`_seq` and `_rt` per frame), stored as a zstd *skippable*
/// frame, which `zstd`, `zstdcat` and every conforming decoder pass over. A sealed segment ends
/// with it and then the zstd seekable format's seek table (`SeekTable`), whose last entry it is;
/// segments sealed by earlier versions end with the index itself, and still read as sealed.
///
/// Layout (little-endian): magic `0x184D2A5E`, payload size (u32), then the payload:
/// `"WHIX"`, version (u32), first and last `_seq` (u64), record count (u64), entry count (u32),
/// reserved (u32), the entries (offset, first `_seq`, min and max `_rt` in µs: 4 × 64 bits), and
/// a trailer of payload size (u32) and `"WHIX"` so that a reader finds the index from its end.
/// A segment that ends in a valid index, or in a seek table after one, is *sealed*.
package struct SegmentIndex: Sendable, Equatable {
    /// One zstd frame of the segment.
    package struct Entry: Sendable, Equatable {
        /// Offset of the frame in the file.
        package var offset: Int64
        package var firstSeq: UInt64
        package var minReceivedMicros: Int64
        package var maxReceivedMicros: Int64
    }

    package var firstSeq: UInt64
    /// `firstSeq - 1` for a segment without records.
    package var lastSeq: UInt64
    package var entries: [Entry]

    package var recordCount: UInt64 { lastSeq + 1 - firstSeq }

    /// The index's frame, header included.
    package var encodedSize: Int { 8 + Self.headerSize + entries.count * 32 + Self.trailerSize }

    static let frameMagic: UInt32 = 0x184D_2A5E
    static let tag: UInt32 = 0x5849_4857  // "WHIX" read as little-endian
    static let version: UInt32 = 1
    static let trailerSize = 8
    /// Payload bytes before the entries: tag, version, first, last, count, entry count, reserved.
    static let headerSize = 40

    func encoded() -> [UInt8] {
        var payload: [UInt8] = []
        func put<T: FixedWidthInteger>(_ v: T) {
            withUnsafeBytes(of: v.littleEndian) { payload.append(contentsOf: $0) }
        }
        put(Self.tag)
        put(Self.version)
        put(firstSeq)
        put(lastSeq)
        put(recordCount)
        put(UInt32(entries.count))
        put(UInt32(0))
        for e in entries {
            put(e.offset)
            put(e.firstSeq)
            put(e.minReceivedMicros)
            put(e.maxReceivedMicros)
        }
        let size = UInt32(payload.count + Self.trailerSize)
        put(size)
        put(Self.tag)
        var frame: [UInt8] = []
        withUnsafeBytes(of: Self.frameMagic.littleEndian) { frame.append(contentsOf: $0) }
        withUnsafeBytes(of: size.littleEndian) { frame.append(contentsOf: $0) }
        return frame + payload
    }

    /// What seals a segment whose zstd frames end at `dataEnd`: this index, then the seek table
    /// of every frame (`decompressedSizes`: one per entry, in order) and of the index itself.
    package func sealingFrames(decompressedSizes: [UInt32], dataEnd: Int64) -> [UInt8] {
        precondition(decompressedSizes.count == entries.count, "one decompressed size per frame")
        let index = encoded()
        var frames: [SeekTable.Frame] = []
        for (i, entry) in entries.enumerated() {
            let end = i + 1 < entries.count ? entries[i + 1].offset : dataEnd
            frames.append(.init(compressedSize: UInt32(end - entry.offset), decompressedSize: decompressedSizes[i]))
        }
        frames.append(.init(compressedSize: UInt32(index.count), decompressedSize: 0))
        return index + SeekTable(frames: frames).encoded()
    }

    /// Reads the index near the end of a segment file (before its seek table, or at its very
    /// end in a segment of an earlier version); nil when the segment is not sealed.
    package static func read(fromFileAt path: String) -> SegmentIndex? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        let fileSize = Int64(st.st_size)
        // With a seek table, the index is its last frame: it ends where the table begins.
        let seekTable = SeekTable.read(fd: fd, fileSize: fileSize)
        let end = seekTable.map { fileSize - Int64($0.encodedSize) } ?? fileSize
        guard end >= 8 + Int64(headerSize + trailerSize) else { return nil }
        var trailer = [UInt8](repeating: 0, count: trailerSize)
        guard pread(fd, &trailer, trailerSize, off_t(end - Int64(trailerSize))) == trailerSize else { return nil }
        let size = Int64(le32(trailer, 0))
        guard le32(trailer, 4) == tag, size >= Int64(headerSize + trailerSize), size + 8 <= end, size < 1 << 30
        else { return nil }
        if let last = seekTable?.frames.last, last.compressedSize != UInt32(size + 8) || last.decompressedSize != 0 {
            return nil
        }
        var frame = [UInt8](repeating: 0, count: Int(size) + 8)
        guard pread(fd, &frame, frame.count, off_t(end - size - 8)) == frame.count else { return nil }
        guard let index = decode(frame), index.isConsistent(framesEndAt: end - size - 8) else { return nil }
        return index
    }

    /// An index whose trailer survived but whose entries contradict the file is no index: its
    /// frames must lie before the index frame in increasing order, their `_seq`s within the
    /// segment's and increasing.
    func isConsistent(framesEndAt end: Int64) -> Bool {
        var previousOffset: Int64 = -1
        var previousSeq = firstSeq
        for e in entries {
            guard e.offset > previousOffset, e.offset < end, e.firstSeq >= previousSeq, e.firstSeq <= lastSeq else {
                return false
            }
            previousOffset = e.offset
            previousSeq = e.firstSeq
        }
        return entries.first.map { $0.offset == 0 && $0.firstSeq == firstSeq } ?? (lastSeq &+ 1 == firstSeq)
    }

    static func decode(_ f: [UInt8]) -> SegmentIndex? {
        guard f.count >= 8 + headerSize + trailerSize, le32(f, 0) == frameMagic, Int(le32(f, 4)) == f.count - 8,
            le32(f, 8) == tag, le32(f, 12) == version
        else { return nil }
        let first = le64(f, 16)
        let last = le64(f, 24)
        let count = Int(le32(f, 40))
        guard 8 + headerSize + count * 32 + trailerSize == f.count, last &+ 1 >= first,
            le64(f, 32) == last &+ 1 &- first
        else { return nil }
        var entries: [Entry] = []
        for i in 0..<count {
            let at = 8 + headerSize + i * 32
            entries.append(
                Entry(
                    offset: Int64(bitPattern: le64(f, at)), firstSeq: le64(f, at + 8),
                    minReceivedMicros: Int64(bitPattern: le64(f, at + 16)),
                    maxReceivedMicros: Int64(bitPattern: le64(f, at + 24))))
        }
        return SegmentIndex(firstSeq: first, lastSeq: last, entries: entries)
    }

    /// The offset of the last frame that starts at or before `seq`.
    package func offset(forSeq seq: UInt64) -> Int64 {
        entries.last(where: { $0.firstSeq <= seq })?.offset ?? 0
    }

    /// The offset of the first frame that may hold a record received at or after `micros`.
    package func offset(forReceivedMicros micros: Int64) -> Int64? {
        entries.first(where: { $0.maxReceivedMicros >= micros })?.offset
    }
}

@inline(__always) func le32(_ b: [UInt8], _ at: Int) -> UInt32 {
    UInt32(b[at]) | UInt32(b[at + 1]) << 8 | UInt32(b[at + 2]) << 16 | UInt32(b[at + 3]) << 24
}

@inline(__always) func le64(_ b: [UInt8], _ at: Int) -> UInt64 {
    UInt64(le32(b, at)) | UInt64(le32(b, at + 4)) << 32
}
