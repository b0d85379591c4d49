import Foundation
import Synchronization

/// The `whend` binary that serves the daemon's helper roles (`--pipeline-worker`,
/// `--pipeline-host`, `--plugin-check`), and beside which the built-in plugins are installed.
///
/// In whend itself that is the running executable. A program that embeds the daemon (the
/// tests, which run it in their own process) names the binary once, before the daemon starts.
package enum WhendExecutable {
    private static let chosen = Mutex<String?>(nil)

    package static var path: String {
        if let path = chosen.withLock({ $0 }) { return path }
        return (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
            ?? CommandLine.arguments[0]
    }

    /// For a process that is not `whend` but runs the daemon: the helpers are this binary.
    package static func use(_ path: String) {
        chosen.withLock { $0 = path }
    }
}
