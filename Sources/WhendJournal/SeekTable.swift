import Foundation

/// The seek table of the zstd seekable format (facebook/zstd,
/// `contrib/seekable_format/zstd_seekable_compression_format.md`, version 0.1.0): the last frame
/// of a sealed segment, so that any seekable-format reader finds every frame of it.
///
/// Layout (little-endian): a skippable frame — magic `0x184D2A5E`, the size of what follows
/// (u32) — holding one entry per frame before it (compressed size, decompressed size: u32
/// each; no checksums, the zstd frames carry their own), then the footer: the number of frames
/// (u32), the descriptor (one byte, 0: no checksums) and the seekable magic `0x8F92EAB1`, the
/// file's last four bytes. The compressed sizes add up to exactly where the table begins.
package struct SeekTable: Sendable, Equatable {
    package struct Frame: Sendable, Equatable {
        package var compressedSize: UInt32
        /// 0 for a skippable frame (whend's own index).
        package var decompressedSize: UInt32
    }

    package var frames: [Frame]

    static let skippableMagic: UInt32 = 0x184D_2A5E
    static let seekableMagic: UInt32 = 0x8F92_EAB1
    static let footerSize = 9
    /// The descriptor's reserved bits (6…2): a compliant reader refuses a table that sets one.
    static let reservedBits: UInt8 = 0x7C

    /// The table's frame, header included.
    package var encodedSize: Int { 8 + frames.count * 8 + Self.footerSize }

    /// Where the frames it describes end: the sum of their compressed sizes.
    package var framesEnd: Int64 { frames.reduce(Int64(0)) { $0 + Int64($1.compressedSize) } }

    package init(frames: [Frame]) { self.frames = frames }

    package func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(encodedSize)
        func put(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) } }
        put(Self.skippableMagic)
        put(UInt32(encodedSize - 8))
        for f in frames {
            put(f.compressedSize)
            put(f.decompressedSize)
        }
        put(UInt32(frames.count))
        out.append(0)
        put(Self.seekableMagic)
        return out
    }

    /// The seek table that ends the file at `path`, if it has a consistent one.
    static func read(fromFileAt path: String) -> SeekTable? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        return read(fd: fd, fileSize: Int64(st.st_size))
    }

    /// The seek table that ends the file open on `fd` (`fileSize` bytes), if there is one whose
    /// frames account for every byte before it; nil otherwise (a segment of an earlier version,
    /// or one whose seal was torn).
    static func read(fd: Int32, fileSize: Int64) -> SeekTable? {
        guard fileSize >= Int64(8 + footerSize) else { return nil }
        var footer = [UInt8](repeating: 0, count: footerSize)
        guard pread(fd, &footer, footerSize, off_t(fileSize - Int64(footerSize))) == footerSize,
            le32(footer, 5) == seekableMagic, footer[4] & reservedBits == 0
        else { return nil }
        let count = Int(le32(footer, 0))
        let size = 8 + count * 8 + footerSize
        guard count < 1 << 24, Int64(size) <= fileSize else { return nil }
        var table = [UInt8](repeating: 0, count: size)
        guard pread(fd, &table, size, off_t(fileSize - Int64(size))) == size, le32(table, 0) == skippableMagic,
            Int(le32(table, 4)) == size - 8
        else { return nil }
        let frames = (0..<count).map {
            Frame(compressedSize: le32(table, 8 + $0 * 8), decompressedSize: le32(table, 12 + $0 * 8))
        }
        let seekTable = SeekTable(frames: frames)
        guard seekTable.framesEnd == fileSize - Int64(size) else { return nil }
        return seekTable
    }
}
