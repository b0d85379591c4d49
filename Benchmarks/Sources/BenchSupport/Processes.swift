import Foundation
import WhendSystem

/// A daemon under test, spawned directly so that `wait4` reports its CPU time and peak RSS.
public final class SpawnedProcess {
    public let pid: pid_t
    public let name: String

    public struct Usage {
        public var cpuSeconds: Double
        public var exitStatus: Int32
    }

    public init(_ path: String, _ arguments: [String], log: String, environment: [String: String] = [:]) throws {
        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        let spawned = spawnProcess(path, arguments, environment: env) { actions in
            posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
        }
        self.pid = try spawned.mapError { BenchError("cannot start \(path): \($0)") }.get()
        self.name = (path as NSString).lastPathComponent
    }

    /// Current resident memory, from /proc.
    public var rssKiB: Int { procStatus("VmRSS:") }

    /// Peak resident memory of the running program. (wait4's ru_maxrss is no use here: a
    /// spawned child's figure includes the parent's memory from before the exec.)
    public var peakRSSKiB: Int { procStatus("VmHWM:") }

    private func procStatus(_ key: String) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix(key) {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0
        }
        return 0
    }

    /// SIGTERM, then wait: the daemon flushes and closes its files before it exits.
    public func stop() -> Usage {
        kill(pid, SIGTERM)
        return wait()
    }

    public func wait() -> Usage {
        var status: Int32 = 0
        var usage = rusage()
        while wait4(pid, &status, 0, &usage) < 0 && errno == EINTR {}
        let cpu =
            Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        return Usage(cpuSeconds: cpu, exitStatus: status)
    }
}

public struct BenchError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

public func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Runs a shell command and returns its standard output.
@discardableResult
public func shell(_ command: String) throws -> String {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/sh")
    p.arguments = ["-c", command]
    let out = Pipe()
    p.standardOutput = out
    try p.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    guard p.terminationStatus == 0 else { throw BenchError("`\(command)` failed with status \(p.terminationStatus)") }
    return String(decoding: data, as: UTF8.self)
}

public func fileSize(_ path: String) -> Int {
    var st = stat()
    return stat(path, &st) == 0 ? Int(st.st_size) : 0
}

public func waitForSocket(_ path: String, timeout: Double = 20) throws {
    let deadline = monotonicSeconds() + timeout
    while monotonicSeconds() < deadline {
        if let fd = try? connectUnix(path) {
            close(fd)
            return
        }
        usleep(10_000)
    }
    throw BenchError("nothing listens on \(path) after \(timeout) s")
}

public func connectUnix(_ path: String) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
    guard rc == 0 else {
        close(fd)
        throw BenchError("connect \(path): \(String(cString: strerror(errno)))")
    }
    return fd
}

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The body of an HTTP GET, or "" if there was no answer within 10 s.
public func httpGet(_ url: String) -> String {
    final class Box: @unchecked Sendable { var text = "" }
    guard let url = URL(string: url) else { return "" }
    let box = Box()
    let done = DispatchSemaphore(value: 0)
    URLSession.shared.dataTask(with: url) { data, _, _ in
        box.text = data.map { String(decoding: $0, as: UTF8.self) } ?? ""
        done.signal()
    }.resume()
    _ = done.wait(timeout: .now() + 10)
    return box.text
}
