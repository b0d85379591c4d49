import Foundation

/// Why a durable write did not happen, with the path and the system's reason.
package struct DurableFileError: Error, CustomStringConvertible {
    package var operation: String
    package var path: String
    package var code: Int32

    package init(operation: String, path: String, code: Int32) {
        self.operation = operation
        self.path = path
        self.code = code
    }

    package var description: String { "cannot \(operation) \(path): \(String(cString: strerror(code)))" }
}

/// The one rule for files whend and its plugins must find whole after a crash or a power cut:
/// cursors, snapshots, indexes, spools, reports.
package enum DurableFile {
    /// The modes of what whend and its plugins create under the state directory, decided here
    /// once: readable by whend's group (a reader's `whenctl`), by nobody else, and written by
    /// whend alone. (Nothing there holds a secret: those stay in the configuration, a file or a
    /// credential.)
    package static let fileMode: mode_t = 0o640
    package static let directoryMode: mode_t = 0o750
    // Every file whend creates is opened O_NOFOLLOW: a symbolic link put where one of them goes
    // would otherwise have whend (perhaps root) write to whatever it points at.

    /// Replaces `path` with `bytes`: written beside (`path.tmp`), synced, renamed over `path`,
    /// and the directory synced, so that afterwards `path` holds the old bytes or the new ones,
    /// never a mix, and the rename itself survives a power cut. Every step is checked.
    package static func replace(_ path: String, with bytes: [UInt8], mode: mode_t = fileMode)
        throws(DurableFileError)
    {
        try replace(path, mode: mode) { (write: ([UInt8]) throws(DurableFileError) -> Void) throws(DurableFileError) in
            try write(bytes)
        }
    }

    /// `replace(_:with:mode:)` with the bytes handed over a piece at a time by `body`, each
    /// written as it comes: a large file is never whole in memory.
    package static func replace(
        _ path: String, mode: mode_t = fileMode,
        writing body: (_ write: ([UInt8]) throws(DurableFileError) -> Void) throws(DurableFileError) -> Void
    ) throws(DurableFileError) {
        let temporary = path + ".tmp"
        let fd = PluginDescriptors.opened(path: temporary) {
            open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode)
        }
        guard fd >= 0 else { throw DurableFileError(operation: "create", path: temporary, code: errno) }
        do throws(DurableFileError) {
            try body { (bytes: [UInt8]) throws(DurableFileError) in try writeAll(fd, bytes, path: temporary) }
            guard fsync(fd) == 0 else { throw DurableFileError(operation: "sync", path: temporary, code: errno) }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        guard close(fd) == 0 else {
            let code = errno
            unlink(temporary)
            throw DurableFileError(operation: "close", path: temporary, code: code)
        }
        guard rename(temporary, path) == 0 else {
            let code = errno
            unlink(temporary)
            throw DurableFileError(operation: "rename \(temporary) to", path: path, code: code)
        }
        try syncDirectory(of: path)
    }

    /// Appends `bytes` whole to `path` (created if need be), and syncs it when `sync`. If the
    /// write fails part-way, what was written of it is cut off again, so that the file stays
    /// whole lines.
    package static func append(_ bytes: [UInt8], to path: String, sync: Bool = false, mode: mode_t = fileMode)
        throws(DurableFileError)
    {
        let fd = PluginDescriptors.opened(path: path) {
            open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, mode)
        }
        guard fd >= 0 else { throw DurableFileError(operation: "open", path: path, code: errno) }
        defer { close(fd) }
        try append(bytes, to: fd, path: path)
        if sync, fsync(fd) != 0 { throw DurableFileError(operation: "sync", path: path, code: errno) }
    }

    /// Appends `bytes` whole to the file open (`O_APPEND`) on `fd`: if the write fails
    /// part-way, what was written of it is cut off again.
    package static func append(_ bytes: [UInt8], to fd: Int32, path: String) throws(DurableFileError) {
        try append(bytes, to: fd, path: path, length: lseek(fd, 0, SEEK_END))
    }

    /// The same, for a file whose `length` the caller keeps (its only writer): no `lseek`.
    package static func append(_ bytes: [UInt8], to fd: Int32, path: String, length: off_t) throws(DurableFileError) {
        do throws(DurableFileError) {
            try writeAll(fd, bytes, path: path)
        } catch {
            if length >= 0 { _ = ftruncate(fd, length) }
            throw error
        }
    }

    /// Makes what was written to `fd` durable (`fdatasync`: the data and the length, not the
    /// times). A plugin that appends without a sync calls it once per `flush`, not per write.
    package static func syncData(_ fd: Int32, path: String) throws(DurableFileError) {
        while fdatasync(fd) != 0 {
            guard errno == EINTR else { throw DurableFileError(operation: "sync", path: path, code: errno) }
        }
    }

    /// Creates the directory `path` and whatever parents it lacks, each one durable: a
    /// directory's name is in its parent, so the parent is synced after each one is made (else
    /// a power cut can take a new journal directory away with everything synced inside it).
    package static func createDirectory(_ path: String, mode: mode_t = directoryMode) throws(DurableFileError) {
        var missing: [String] = []
        var candidate = path
        var status = stat()
        while !candidate.isEmpty, candidate != "/", stat(candidate, &status) != 0 {
            guard errno == ENOENT else { throw DurableFileError(operation: "look at", path: candidate, code: errno) }
            missing.append(candidate)
            candidate = (candidate as NSString).deletingLastPathComponent
        }
        if missing.isEmpty, status.st_mode & S_IFMT != S_IFDIR {
            throw DurableFileError(operation: "use as a directory", path: path, code: ENOTDIR)
        }
        for directory in missing.reversed() {
            if mkdir(directory, mode) != 0, errno != EEXIST {
                throw DurableFileError(operation: "create the directory", path: directory, code: errno)
            }
            try syncDirectory(of: directory)
        }
    }

    /// Syncs the directory holding `path`: a rename or a new file is durable only then.
    package static func syncDirectory(of path: String) throws(DurableFileError) {
        let directory = (path as NSString).deletingLastPathComponent
        let opened = directory.isEmpty ? "." : directory
        let fd = PluginDescriptors.opened(path: opened) { open(opened, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        guard fd >= 0 else { throw DurableFileError(operation: "open the directory", path: directory, code: errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else {
            throw DurableFileError(operation: "sync the directory", path: directory, code: errno)
        }
    }

    private static func writeAll(_ fd: Int32, _ bytes: [UInt8], path: String) throws(DurableFileError) {
        if let code = bytes.withUnsafeBytes({ writeFully(fd, $0) }) {
            throw DurableFileError(operation: "write", path: path, code: code)
        }
    }
}

/// Writes all of `bytes` to `fd`, carrying on after short writes and EINTR. Returns nil once
/// all is written, else the errno of the write that failed (EIO for one that wrote nothing).
package func writeFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32? {
    var done = 0
    while done < bytes.count {
        let n = write(fd, bytes.baseAddress! + done, bytes.count - done)
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { return n < 0 ? errno : EIO }
        done += n
    }
    return nil
}
