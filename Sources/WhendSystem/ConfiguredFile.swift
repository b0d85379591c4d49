import Foundation

/// Why a file a setting names could not be read: said so that the fix is plain.
package enum ConfiguredFileError: Error, Equatable {
    /// open(2) failed: its error number.
    case cannotOpen(code: Int32)
    /// A directory, a FIFO, a socket or a device: not something whend reads a setting from.
    case notARegularFile(kind: String)
    /// Larger than the limit the caller gave.
    case tooLarge(limit: Int)
    /// read(2) failed: its error number.
    case cannotRead(code: Int32)

    package var reason: String {
        switch self {
        case .cannotOpen(let code), .cannotRead(let code): return String(cString: strerror(code))
        case .notARegularFile(let kind): return "it is \(kind), not a regular file"
        case .tooLarge(let limit): return "it holds more than \(ConfiguredFile.size(limit))"
        }
    }
}

/// A file a setting names (a secret, a tracking plan), which someone else writes: read whole,
/// at most `limit` bytes, from a regular file only. Opened without blocking (a FIFO would hold
/// the start or the reload, and with it the daemon, until a writer came) and checked after
/// opening (`fstat`, so a symlink is followed to what it names, as systemd's and container
/// runtimes' secret files are, yet nothing is swapped in between).
package enum ConfiguredFile {
    package static func read(_ path: String, limit: Int) throws(ConfiguredFileError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { throw .cannotOpen(code: errno) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw .cannotRead(code: errno) }
        let kind = info.st_mode & S_IFMT
        guard kind == S_IFREG else { throw .notARegularFile(kind: describe(kind)) }
        guard info.st_size <= limit else { throw .tooLarge(limit: limit) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Int(info.st_size))
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else { throw .cannotRead(code: errno) }
            if n == 0 { return bytes }
            bytes.append(contentsOf: buffer[..<n])
            // It may grow after fstat: the limit holds for what is read.
            guard bytes.count <= limit else { throw .tooLarge(limit: limit) }
        }
    }

    static func describe(_ kind: mode_t) -> String {
        switch kind {
        case S_IFDIR: return "a directory"
        case S_IFIFO: return "a FIFO"
        case S_IFSOCK: return "a socket"
        case S_IFCHR: return "a character device"
        case S_IFBLK: return "a block device"
        default: return "not a file"
        }
    }

    static func size(_ bytes: Int) -> String {
        bytes % (1024 * 1024) == 0 ? "\(bytes / (1024 * 1024)) MiB" : "\(bytes / 1024) KiB"
    }
}
