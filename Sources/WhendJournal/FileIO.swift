import Foundation
import WhendSystem
import WhendWire

/// A failed system call on a journal file, with what to do about it.
package struct JournalIOError: Error, CustomStringConvertible, Sendable {
    package var operation: String
    package var path: String
    package var errno: Int32

    package var description: String {
        let reason = String(cString: strerror(errno))
        var advice = ""
        switch errno {
        case ENOSPC, EDQUOT: advice = "; free space on that filesystem or lower the retention size"
        case EROFS: advice = "; the filesystem is read-only: remount it read-write or move the state directory"
        case EACCES, EPERM: advice = "; give the daemon's user write access, or point --state-dir elsewhere"
        default: break
        }
        return "\(operation) \(path): \(reason)\(advice)"
    }

    /// True when retrying later may succeed without anyone changing the configuration.
    package var isOutOfSpace: Bool { errno == ENOSPC || errno == EDQUOT }
}

enum FileIO {
    static func open(_ path: String, _ flags: Int32, mode: mode_t = DurableFile.fileMode) throws -> Int32 {
        // Never through a symbolic link when writing: one put where a segment goes would have
        // whend write the journal to whatever it points at.
        let nofollow = flags & (O_WRONLY | O_RDWR | O_CREAT) != 0 ? O_NOFOLLOW : 0
        let fd = Glibc.open(path, flags | O_CLOEXEC | nofollow, mode)
        guard fd >= 0 else { throw JournalIOError(operation: "open", path: path, errno: errno) }
        return fd
    }

    static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, path: String) throws {
        if let code = writeFully(fd, bytes) { throw JournalIOError(operation: "write", path: path, errno: code) }
    }

    static func sync(_ fd: Int32, path: String) throws {
        guard fdatasync(fd) == 0 else { throw JournalIOError(operation: "fdatasync", path: path, errno: errno) }
    }

    static func syncDirectory(_ path: String) throws {
        let fd = try open(path, O_RDONLY | O_DIRECTORY)
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw JournalIOError(operation: "fsync", path: path, errno: errno) }
    }

    /// The whole file (segments are bounded by the rotation size).
    static func readAll(_ path: String) throws -> [UInt8] {
        let fd = try open(path, O_RDONLY)
        defer { close(fd) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw JournalIOError(operation: "read", path: path, errno: errno)
            }
            if n == 0 { return result }
            result.append(contentsOf: chunk[0..<n])
        }
    }

    /// Bytes free to an unprivileged writer on the file system holding `path`.
    static func freeBytes(_ path: String) -> Int64? {
        var fs = statvfs()
        guard statvfs(path, &fs) == 0 else { return nil }
        return Int64(fs.f_bavail) * Int64(fs.f_frsize)
    }

    static func size(_ path: String) -> Int64? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        return Int64(st.st_size)
    }
}
