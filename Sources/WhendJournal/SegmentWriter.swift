import CZstd
import Foundation

/// The active segment: records are compressed into zstd frames and written at each commit.
///
/// Within a frame, every commit ends with a zstd *flush*, so the bytes on disk decode up to the
/// last committed record even though the frame is still open. A frame is ended once it holds
/// `frameBytes` of records, which gives readers places to start (the index lists them).
final class SegmentWriter {
    let file: SegmentFile
    let fd: Int32
    let compressor: ZstdCompressor
    let frameBytes: Int
    let openedAt: Date
    private(set) var size: Int64 = 0
    private(set) var lastSeq: UInt64
    private(set) var entries: [SegmentIndex.Entry] = []
    /// Each frame's uncompressed bytes, for the seek table.
    private var frameSizes: [UInt32] = []
    private var frameUncompressed = 0
    private var output: [UInt8] = []

    var recordCount: UInt64 { lastSeq + 1 - file.firstSeq }

    /// Creates the segment file and makes its name durable. The file must not exist, unless
    /// `replacingEmpty`: then it is the empty sealed segment that keeps where `_seq` goes on
    /// (`JournalWriter.keepNextSeq`), and the new file is renamed over it. So a crash at any
    /// moment leaves a file of that name, and a reader that has the old one open sees it
    /// replaced (a new inode), as after a repair.
    init(
        directory: JournalDirectory, firstSeq: UInt64, compressor: ZstdCompressor, frameBytes: Int,
        openedAt: Date = Date(), replacingEmpty: Bool = false
    ) throws {
        let path = directory.segmentPath(firstSeq: firstSeq)
        file = SegmentFile(firstSeq: firstSeq, path: path)
        if replacingEmpty {
            let temporary = path + Self.replacingSuffix
            unlink(temporary)
            fd = try FileIO.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_APPEND)
            guard rename(temporary, path) == 0 else {
                let e = errno
                close(fd)
                unlink(temporary)
                throw JournalIOError(operation: "rename", path: temporary, errno: e)
            }
        } else {
            fd = try FileIO.open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND)
        }
        do {
            try FileIO.syncDirectory(directory.path)
        } catch {
            close(fd)
            unlink(path)
            throw error
        }
        compressor.reset()
        self.compressor = compressor
        self.frameBytes = frameBytes
        self.lastSeq = firstSeq - 1
        self.openedAt = openedAt
        output.reserveCapacity(1 << 16)
    }

    deinit { close(fd) }

    /// A segment being created over the empty one it replaces; a leftover is removed at start.
    static let replacingSuffix = ".replacing"

    /// Writes the empty sealed segment named `firstSeq`: no records, only the index saying
    /// so. It keeps where `_seq` goes on when retention has deleted every record.
    static func writeEmpty(directory: JournalDirectory, firstSeq: UInt64) throws {
        let segment = try SegmentWriter(
            directory: directory, firstSeq: firstSeq, compressor: ZstdCompressor(level: 1), frameBytes: 1 << 16)
        try segment.seal(sync: true)
    }

    /// Whether `path` holds an empty sealed segment whose first `_seq` is `firstSeq`.
    static func isEmptySealed(_ path: String, firstSeq: UInt64) -> Bool {
        guard let index = SegmentIndex.read(fromFileAt: path) else { return false }
        return index.firstSeq == firstSeq && index.lastSeq < index.firstSeq
    }

    /// Compresses and writes complete record lines `firstSeq…lastSeq`.
    ///
    /// - Parameter flush: end with a zstd flush so that everything written decodes (a commit);
    ///   false leaves data in the compressor for a later call (durability `none`).
    /// - Throws: when the write fails. The segment is then unusable: its frame is torn, and
    ///   only recovery may touch the file again.
    func append(
        lines: UnsafeRawBufferPointer, firstSeq: UInt64, lastSeq: UInt64, minReceived: Int64, maxReceived: Int64,
        flush: Bool
    ) throws {
        if frameUncompressed == 0 {
            entries.append(
                .init(offset: size, firstSeq: firstSeq, minReceivedMicros: minReceived, maxReceivedMicros: maxReceived))
            frameSizes.append(0)
        } else {
            entries[entries.count - 1].minReceivedMicros = min(
                entries[entries.count - 1].minReceivedMicros, minReceived)
            entries[entries.count - 1].maxReceivedMicros = max(
                entries[entries.count - 1].maxReceivedMicros, maxReceived)
        }
        frameUncompressed += lines.count
        frameSizes[frameSizes.count - 1] += UInt32(lines.count)
        let endFrame = frameUncompressed >= frameBytes
        output.removeAll(keepingCapacity: true)
        compressor.compress(
            lines, directive: endFrame ? ZSTD_e_end : (flush ? ZSTD_e_flush : ZSTD_e_continue), into: &output)
        if endFrame { frameUncompressed = 0 }
        self.lastSeq = lastSeq
        try writeOutput()
    }

    /// Flushes what the compressor holds (after appends with `flush: false`).
    func flush() throws {
        guard frameUncompressed > 0 else { return }
        output.removeAll(keepingCapacity: true)
        compressor.compress(UnsafeRawBufferPointer(start: nil, count: 0), directive: ZSTD_e_flush, into: &output)
        try writeOutput()
    }

    func sync() throws {
        try FileIO.sync(fd, path: file.path)
    }

    /// Ends the open frame, appends the index and the seek table, and syncs (unless `sync` is
    /// false: the caller syncs, as the journal's sync thread does under `durability = fsync`):
    /// the segment is then sealed, and no byte of it changes again.
    func seal(sync: Bool = true) throws {
        output.removeAll(keepingCapacity: true)
        if frameUncompressed > 0 {
            compressor.compress(UnsafeRawBufferPointer(start: nil, count: 0), directive: ZSTD_e_end, into: &output)
            frameUncompressed = 0
        }
        let index = SegmentIndex(firstSeq: file.firstSeq, lastSeq: lastSeq, entries: entries)
        output.append(
            contentsOf: index.sealingFrames(decompressedSizes: frameSizes, dataEnd: size + Int64(output.count)))
        try writeOutput()
        if sync { try self.sync() }
    }

    private func writeOutput() throws {
        guard !output.isEmpty else { return }
        let path = file.path
        let fd = self.fd
        let result: JournalIOError? = output.withUnsafeBytes { bytes in
            do { try FileIO.writeAll(fd, bytes, path: path) } catch {
                return error as? JournalIOError ?? JournalIOError(operation: "write", path: path, errno: EIO)
            }
            return nil
        }
        if let result { throw result }
        size += Int64(output.count)
    }
}
