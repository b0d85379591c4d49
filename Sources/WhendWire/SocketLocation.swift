import Foundation

/// Where the event and control sockets are (PROTOCOL.md §1).
package enum SocketLocation {
    /// The runtime directory whend uses when none is configured: `$RUNTIME_DIRECTORY`, else
    /// `$XDG_RUNTIME_DIR/whend`, else `/tmp/whend-$UID`.
    package static func defaultRuntimeDirectory(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        if let dir = environment["RUNTIME_DIRECTORY"], !dir.isEmpty {
            // systemd may pass several, separated by ':'; the first is ours.
            return String(dir.split(separator: ":").first ?? Substring(dir))
        }
        if let dir = environment["XDG_RUNTIME_DIR"], !dir.isEmpty { return dir + "/whend" }
        return temporaryRuntimeDirectory
    }

    /// The last resort, in a directory every user may write: used only when it is this user's
    /// own (`checkPrivateDirectory`), else anyone could put sockets there first.
    package static var temporaryRuntimeDirectory: String { "/tmp/whend-\(getuid())" }

    /// Why a client must not connect to `path`, or nil: a socket in `/tmp/whend-$UID` (the last
    /// resort when no runtime directory is set) only while that directory is this user's own and
    /// private, else another user may have made it first and put a socket of theirs there; and
    /// only to a socket of this user's (or root's) in it.
    package static func refusalToConnect(_ path: String) -> String? {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return nil }
        let directory = String(path[..<slash])
        var st = stat()
        guard directory == temporaryRuntimeDirectory, lstat(directory, &st) == 0 else { return nil }
        if let reason = checkPrivateDirectory(directory, create: false) {
            return "will not connect to \(path): \(reason)"
        }
        // A private directory may still hold a socket another user bound while it was not: the
        // socket itself must be this user's (or root's).
        guard lstat(path, &st) == 0 else { return nil }
        let advice =
            "another user may have put it there to receive the apps' events or answer whenctl. Remove it (as root or its owner), or set XDG_RUNTIME_DIR (or RUNTIME_DIRECTORY, or WHEND_SOCKET) to a directory of your own"
        if st.st_mode & S_IFMT != S_IFSOCK {
            return "will not connect to \(path): it is not a socket: \(advice)"
        }
        if st.st_uid != getuid(), st.st_uid != 0 {
            return "will not connect to \(path): it belongs to uid \(st.st_uid), not to uid \(getuid()): \(advice)"
        }
        return nil
    }

    /// Why `directory` may not hold this user's sockets, or nil when it may: as ssh-agent and
    /// tmux check theirs, it must be a directory, not a symbolic link, owned by this user and
    /// writable by nobody else. With `create`, a missing one is made (0700).
    package static func checkPrivateDirectory(_ directory: String, create: Bool) -> String? {
        if create, mkdir(directory, 0o700) != 0, errno != EEXIST {
            return "cannot create \(directory): \(String(cString: strerror(errno)))"
        }
        var st = stat()
        guard lstat(directory, &st) == 0 else {
            return "cannot look at \(directory): \(String(cString: strerror(errno)))"
        }
        let advice =
            "another user could put sockets there and receive the apps' events or answer whenctl. Remove it (as root or its owner), or set XDG_RUNTIME_DIR (or RUNTIME_DIRECTORY, or WHEND_SOCKET) to a directory of your own"
        let mode = String(st.st_mode & 0o7777, radix: 8)
        if st.st_mode & S_IFMT == S_IFLNK {
            return "\(directory) is a symbolic link, not a directory of uid \(getuid())'s own: \(advice)"
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            return "\(directory) is not a directory: remove it, or set XDG_RUNTIME_DIR to a directory of your own"
        }
        if st.st_uid != getuid() {
            return "\(directory) belongs to uid \(st.st_uid) (mode 0\(mode)), not to uid \(getuid()): \(advice)"
        }
        if st.st_mode & 0o022 != 0 {
            return
                "\(directory) may be written by others (mode 0\(mode)): \(advice); or make it private: chmod 700 \(directory)"
        }
        return nil
    }

    /// Where the packaged whend (the systemd units) has its sockets and its state.
    package static let systemRuntimeDirectory = "/run/whend"
    package static let systemStateDirectory = "/var/lib/whend"

    /// The event socket a client connects to: `$WHEND_SOCKET`, else `events.sock` in the
    /// default runtime directory if a whend made it, else the packaged whend's
    /// (`/run/whend/events.sock`) if there is one: the tools installed with the package find
    /// the installed daemon with no flags.
    package static func eventSocket(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["WHEND_SOCKET"], !path.isEmpty { return path }
        let own = defaultRuntimeDirectory(environment: environment) + "/events.sock"
        let system = systemRuntimeDirectory + "/events.sock"
        if !FileManager.default.fileExists(atPath: own), FileManager.default.fileExists(atPath: system) {
            return system
        }
        return own
    }

    /// The control socket that goes with an event socket: `control.sock` beside it.
    package static func controlSocket(besideEventSocket path: String) -> String {
        // By bytes, not NSString: Foundation's path functions trap on some odd strings.
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "control.sock" }
        return String(path[..<slash]) + "/control.sock"
    }

    /// The state directory: `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/whend`, else
    /// `~/.local/state/whend`. The journal is `journal/` inside it.
    package static func defaultStateDirectory(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        if let dir = environment["STATE_DIRECTORY"], !dir.isEmpty {
            return String(dir.split(separator: ":").first ?? Substring(dir))
        }
        if let dir = environment["XDG_STATE_HOME"], !dir.isEmpty { return dir + "/whend" }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return home + "/.local/state/whend"
    }

    /// The state directory a reader (`whenctl cat`, `verify`, `sessions`…) uses when none is
    /// given: the default one if it holds a journal, else the packaged whend's
    /// (`/var/lib/whend`) if that one does and can be read.
    package static func readerStateDirectory(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        let own = defaultStateDirectory(environment: environment)
        if environment["STATE_DIRECTORY"].map({ !$0.isEmpty }) == true
            || environment["XDG_STATE_HOME"].map({ !$0.isEmpty }) == true
            || FileManager.default.fileExists(atPath: own + "/journal")
        {
            return own
        }
        if FileManager.default.isReadableFile(atPath: systemStateDirectory + "/journal") { return systemStateDirectory }
        return own
    }
}
