import Foundation

/// Where the tests keep their files: one directory per test run, `/tmp/wt-PID` (short: a
/// socket's path in it must fit in 108 bytes). A run removes what earlier runs left once their
/// process is gone, so the last run's files stay for a look after a failure, and runs do not
/// pile up hundreds of megabytes each in /tmp.
public enum ScratchDirectory {
    public static let root: String = {
        let mine = "wt-\(getpid())"
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? [] where entry != mine {
            guard entry.hasPrefix("wt-"), let pid = Int32(entry.dropFirst(3)), kill(pid, 0) != 0, errno == ESRCH
            else { continue }
            try? FileManager.default.removeItem(atPath: "/tmp/" + entry)
        }
        let root = "/tmp/" + mine
        try? FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        return root
    }()

    /// A new, empty directory of this run's, named after `name`.
    public static func make(_ name: String) -> String {
        let path = root + "/\(name.prefix(12))-\(UInt32.random(in: 0...UInt32.max))"
        try? FileManager.default.removeItem(atPath: path)
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }
}
