import Foundation
import WhendConfiguration
import WhendPluginHost
import WhendSystem
import WhendWire

/// The one-writer rule for a state directory: whend holds an exclusive `flock` on
/// `<state>/whend.lock` for its whole life, taken before it touches the journal, so that a second
/// daemon can never recover, seal or append to segments the first is writing.
///
/// The holder writes its pid into the file so that a refused daemon can name it. `whenctl`'s
/// readers never take the lock. The descriptor is close-on-exec: pipeline workers do not inherit
/// it, so a worker left behind by a dead daemon does not keep its successor out.
package final class StateDirectoryLock: Sendable {
    package let path: String
    private let descriptor: Int32

    /// Takes the lock, or throws a `DaemonStartError` that names the holder and what to do.
    package init(stateDirectory: String) throws {
        do {
            try DurableFile.createDirectory(stateDirectory)
        } catch {
            throw DaemonStartError.stateDirectoryUnusable(directory: stateDirectory, reason: "\(error)")
        }
        if let reason = Self.othersMayWrite(stateDirectory) ?? Self.foreignContents(stateDirectory) {
            throw DaemonStartError.stateDirectoryNotPrivate(reason: reason)
        }
        path = stateDirectory + "/whend.lock"
        // Held open read-only: a descriptor open for writing would keep the file system from
        // being remounted read-only under a running daemon (which whend survives).
        let fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, DurableFile.fileMode)
        guard fd >= 0 else {
            let reason = String(cString: strerror(errno))
            throw DaemonStartError.lockFileUnusable(path: path, reason: reason)
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let failure = errno
            let holder = Self.recordedHolder(fd)
            close(fd)
            guard failure == EWOULDBLOCK else {
                throw DaemonStartError.cannotLock(path: path, reason: String(cString: strerror(failure)))
            }
            throw DaemonStartError.stateDirectoryInUse(directory: stateDirectory, lockFile: path, holder: holder)
        }
        descriptor = fd
        // Record who holds it, through a descriptor closed at once (see above). Readers of the
        // file take no lock, so a short write is harmless.
        let writer = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW)
        if writer >= 0 {
            let pid = Array("\(getpid())\n".utf8)
            _ = pid.withUnsafeBytes { write(writer, $0.baseAddress, $0.count) }
            close(writer)
        }
    }

    /// Why another user could change what whend keeps in `directory`, or nil: its owner, or
    /// anyone who may write it (group or others, sticky bit or not: a sticky directory still
    /// lets anyone make the `journal/` or `plugins/` whend would then use), could replace the
    /// journal or put a symbolic link where whend (perhaps root) is about to write.
    static func othersMayWrite(_ directory: String) -> String? {
        var st = stat()
        guard stat(directory, &st) == 0 else { return nil }
        let mode = String(st.st_mode & 0o7777, radix: 8)
        let fix = "give it to whend's user (chown, chmod go-w), or set --state-dir to a directory of whend's own"
        if st.st_uid != geteuid(), st.st_uid != 0 {
            return
                "\(directory) belongs to uid \(st.st_uid), not to whend's user (uid \(geteuid())) or root: its owner could replace the journal or turn whend's writes elsewhere; \(fix)"
        }
        if st.st_mode & 0o022 != 0 {
            let who = st.st_mode & 0o002 != 0 ? "anyone" : "its group (gid \(st.st_gid))"
            return
                "\(directory) may be written by \(who) (mode 0\(mode)): another user could replace the journal or turn whend's writes elsewhere; \(fix)"
        }
        return nil
    }

    /// Why something already under the state directory may have been put there or changed by
    /// another user, or nil: whend keeps its journal, cursors, snapshots and its plugins' files
    /// in directories it made (`journal/`, `pipelines/…`, `plugins/…`), and writes into them as
    /// whoever it runs as. Each entry must belong to whend's user or root; a directory or file
    /// of whend's own that others may write (a chmod, an old umask) is made private again, and
    /// one of root's, which whend cannot change, is refused. A symbolic link (the journal on
    /// another disk) must lead, hop by hop, only through links and directories no other user
    /// could change (`unsafeLinkPath`) to something that exists, and what it leads to passes
    /// the same checks, except that whend repairs nothing there: it is not whend's to change.
    static func foreignContents(_ directory: String) -> String? {
        var visited: Set<[UInt64]> = []
        return foreignContents(directory, repair: true, visited: &visited)
    }

    private static func foreignContents(_ directory: String, repair: Bool, visited: inout Set<[UInt64]>) -> String? {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return nil }
        for name in names {
            let path = directory + "/" + name
            var st = stat()
            guard lstat(path, &st) == 0 else { continue }
            let kind = st.st_mode & S_IFMT
            let mode = String(st.st_mode & 0o7777, radix: 8)
            let fix = "remove it, or give it to whend's user (chown -R, chmod -R go-w), and start whend again"
            if !ownedByWhend(st) {
                return
                    "\(path) belongs to uid \(st.st_uid), not to whend's user (uid \(geteuid())) or root: its owner could read or replace what whend keeps there or turn whend's writes elsewhere; \(fix)"
            }
            if kind == S_IFLNK {
                if let reason = unsafeLinkPath(path) { return reason }
                var target = stat()
                guard stat(path, &target) == 0 else { continue }
                if target.st_mode & S_IFMT == S_IFDIR,
                    visited.insert([UInt64(target.st_dev), UInt64(target.st_ino)]).inserted,
                    let reason = foreignContents(path, repair: false, visited: &visited)
                {
                    return reason
                }
                continue
            }
            if kind == S_IFDIR || kind == S_IFREG, st.st_mode & 0o022 != 0 {
                let repaired =
                    repair && st.st_uid == geteuid() && chmod(path, st.st_mode & 0o7755 & ~mode_t(S_ISVTX)) == 0
                if !repaired {
                    return
                        "\(path) may be written by others (mode 0\(mode)): they could replace what whend keeps there or turn whend's writes elsewhere; \(fix)"
                }
            }
            if kind == S_IFDIR, let reason = foreignContents(path, repair: repair, visited: &visited) {
                return reason
            }
        }
        return nil
    }

    private static func ownedByWhend(_ st: stat) -> Bool { st.st_uid == geteuid() || st.st_uid == 0 }

    /// Why the symbolic link at `link` could be turned elsewhere by another user, or nil. Its
    /// target is resolved a name at a time, as the kernel does, from `/` or the link's own
    /// directory: every link met must belong to whend's user or root, and so must every
    /// directory passed through, which nobody else may write (unless it is sticky and the name
    /// in it is whend's or root's, as in /tmp); the end must exist (a dangling link is a name
    /// someone else may create later) and is checked by the caller like the rest.
    static func unsafeLinkPath(_ link: String) -> String? {
        let fix = "remove the link, or make every directory and link on its way whend's or root's and private"
        var pending = ["/"] + link.split(separator: "/").map(String.init)
        var current = ""
        var hops = 0
        while !pending.isEmpty {
            let name = pending.removeFirst()
            if name == "/" {
                current = "/"
                continue
            }
            if name.isEmpty || name == "." { continue }
            if name == ".." {
                current = (current as NSString).deletingLastPathComponent
                continue
            }
            let next = current == "/" ? "/" + name : current + "/" + name
            var parent = stat()
            var entry = stat()
            guard lstat(current, &parent) == 0 else { return nil }
            guard lstat(next, &entry) == 0 else {
                return "\(link) leads to \(next), which does not exist: another user could make it; \(fix)"
            }
            if parent.st_mode & 0o022 != 0, !(parent.st_mode & mode_t(S_ISVTX) != 0 && ownedByWhend(entry)) {
                return
                    "\(link) leads through \(current), which others may write (mode 0\(String(parent.st_mode & 0o7777, radix: 8))): they could turn it elsewhere; \(fix)"
            }
            if !ownedByWhend(entry) {
                return
                    "\(link) leads through \(next), which belongs to uid \(entry.st_uid), not to whend's user (uid \(geteuid())) or root: its owner could turn it elsewhere; \(fix)"
            }
            if entry.st_mode & S_IFMT == S_IFLNK {
                hops += 1
                guard hops <= 40, let target = try? FileManager.default.destinationOfSymbolicLink(atPath: next) else {
                    return "\(link) leads through too many symbolic links (a loop?); \(fix)"
                }
                pending = (target.hasPrefix("/") ? ["/"] : []) + target.split(separator: "/").map(String.init) + pending
                continue
            }
            if entry.st_mode & 0o022 != 0, !pending.isEmpty, entry.st_mode & mode_t(S_ISVTX) == 0 {
                return
                    "\(link) leads through \(next), which others may write (mode 0\(String(entry.st_mode & 0o7777, radix: 8))): they could turn it elsewhere; \(fix)"
            }
            current = next
        }
        var end = stat()
        if stat(current, &end) == 0, end.st_mode & 0o022 != 0 {
            return
                "\(link) leads to \(current), which others may write (mode 0\(String(end.st_mode & 0o7777, radix: 8))): they could replace what whend keeps there or turn whend's writes elsewhere; \(fix)"
        }
        return nil
    }

    /// The pid the holder wrote, if the file holds one.
    private static func recordedHolder(_ fd: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        let text = String(decoding: buffer[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return Int32(text)
    }

    deinit {
        // The kernel drops the lock with the descriptor; the file stays (unlinking it would let
        // two daemons lock two different files of the same name).
        close(descriptor)
    }
}
