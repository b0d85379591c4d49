import Foundation

/// Where the event and control sockets are (PROTOCOL.md §1).
public enum SocketLocation {
    /// The runtime directory whend uses when none is configured: `$RUNTIME_DIRECTORY`, else
    /// `$XDG_RUNTIME_DIR/whend`, else `/tmp/whend-$UID`.
    public static func defaultRuntimeDirectory(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        if let dir = environment["RUNTIME_DIRECTORY"], !dir.isEmpty {
            // systemd may pass several, separated by ':'; the first is ours.
            return String(dir.split(separator: ":").first ?? Substring(dir))
        }
        if let dir = environment["XDG_RUNTIME_DIR"], !dir.isEmpty { return dir + "/whend" }
        return "/tmp/whend-\(getuid())"
    }

    /// The event socket a client connects to: `$WHEND_SOCKET`, else `events.sock` in the
    /// default runtime directory.
    public static func eventSocket(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["WHEND_SOCKET"], !path.isEmpty { return path }
        return defaultRuntimeDirectory(environment: environment) + "/events.sock"
    }

    /// The control socket that goes with an event socket: `control.sock` beside it.
    public static func controlSocket(besideEventSocket path: String) -> String {
        // By bytes, not NSString: Foundation's path functions trap on some odd strings.
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "control.sock" }
        return String(path[..<slash]) + "/control.sock"
    }

    /// The state directory: `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/whend`, else
    /// `~/.local/state/whend`. The journal is `journal/` inside it.
    public static func defaultStateDirectory(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        if let dir = environment["STATE_DIRECTORY"], !dir.isEmpty {
            return String(dir.split(separator: ":").first ?? Substring(dir))
        }
        if let dir = environment["XDG_STATE_HOME"], !dir.isEmpty { return dir + "/whend" }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return home + "/.local/state/whend"
    }
}
