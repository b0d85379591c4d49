import Foundation
import Logging
import Testing
import UnixSignals
import WhendConfiguration
import WhendJournal
import WhendSystem
import WhendWire

@testable import WhendDaemon

/// Where a test runs whend.
enum DaemonMode {
    /// In the test's own process: the same `Daemon` and `DaemonServices` as the binary, on
    /// real sockets and a real journal, started and stopped without a process in between.
    case inProcess
    /// The real `whend` binary: for the promises a process is part of (a SIGKILL, a signal, the
    /// environment a service manager gives it, what its workers write to its standard error).
    case live
}

/// whend for a test, with its own socket and state directory: in the test's process unless the
/// test needs a real one (`.live`), as Hummingbird's `app.test(.router)` and `.live` serve one
/// application two ways. Both read their settings from the same flags and log to `logPath`.
final class TestDaemon: @unchecked Sendable {
    // Unchecked: used from one test at a time; `process` and `embedded` are replaced only by
    // start() and stop().
    let mode: DaemonMode
    let directory: String
    let socketPath: String
    let stateDirectory: String
    let extraArguments: [String]
    /// Extra environment: a live daemon's (NOTIFY_SOCKET, WATCHDOG_USEC, …); in process, only
    /// the settings' `WHEND_` variables, which its configuration is resolved with.
    var environment: [String: String] = [:] {
        willSet {
            precondition(
                mode == .live || newValue.keys.allSatisfy { $0.hasPrefix("WHEND_") },
                "a daemon in the test's process has the test's environment: use .live")
        }
    }
    private(set) var process: Process?
    private var embedded: EmbeddedDaemon?
    let logPath: String

    init(_ name: String, arguments: [String] = [], stateDirectory: String? = nil, _ mode: DaemonMode = .inProcess) {
        self.mode = mode
        directory = scratchDirectory(name)
        socketPath = directory + "/events.sock"
        self.stateDirectory = stateDirectory ?? directory + "/state"
        extraArguments = arguments
        logPath = directory + "/whend.log"
    }

    /// A real `whend` process.
    static func live(_ name: String, arguments: [String] = [], stateDirectory: String? = nil) -> TestDaemon {
        TestDaemon(name, arguments: arguments, stateDirectory: stateDirectory, .live)
    }

    var journal: JournalDirectory { JournalDirectory(stateDirectory: stateDirectory) }

    /// What whend is given: the test's sockets and state, logging at notice, and the built-in
    /// pipelines only where a test asks for them (they add derived records).
    private var arguments: [String] {
        let builtin = extraArguments.contains("--builtin-pipelines") ? [] : ["--builtin-pipelines", "false"]
        return ["--socket", socketPath, "--state-dir", stateDirectory, "--log-level", "notice"] + builtin
            + extraArguments
    }

    /// Starts whend and waits until its sockets accept connections.
    func start() throws {
        Self.tally(mode)
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let exited: () -> Bool
        switch mode {
        case .live:
            let p = Process()
            p.executableURL = URL(fileURLWithPath: executable("whend"))
            p.arguments = arguments
            if !environment.isEmpty {
                var env = ProcessInfo.processInfo.environment
                for (k, v) in environment { env[k] = v }
                p.environment = env
            }
            let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
            log.seekToEndOfFile()
            p.standardOutput = log
            p.standardError = log
            try p.run()
            process = p
            exited = { !p.isRunning }
        case .inProcess:
            let daemon = try EmbeddedDaemon(arguments: arguments, environment: environment, logPath: logPath)
            embedded = daemon
            exited = { daemon.hasEnded }
        }
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            // Both sockets: the control socket is bound just after the event socket.
            if (try? BlockingSocket(path: socketPath)) != nil, FileManager.default.fileExists(atPath: controlPath) {
                return
            }
            if exited() {
                _ = stop()
                throw TestFailure(description: "whend exited at start: \(self.log)")
            }
            usleep(20_000)
        }
        throw TestFailure(description: "whend did not listen within 20 s: \(self.log)")
    }

    /// whend's process: the test's own when it runs in process.
    var pid: pid_t { mode == .live ? process?.processIdentifier ?? 0 : getpid() }

    /// Started, and not stopped or dead.
    var isRunning: Bool { process?.isRunning ?? embedded.map { !$0.hasEnded } ?? false }

    /// With WHEND_TEST_DAEMON_TALLY=FILE, a line there for each start: the mode and the test,
    /// for counting the tests that need a process of whend's own.
    private static func tally(_ mode: DaemonMode) {
        guard let file = ProcessInfo.processInfo.environment["WHEND_TEST_DAEMON_TALLY"] else { return }
        let test = Test.current.map { "\($0.id)" } ?? "?"
        let fd = open(file, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let line = Array("\(mode) \(test)\n".utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Stops whend gracefully (a live one by `signal`) and waits for it. Returns the exit status
    /// (in process: 0 after a clean stop, 1 if a step failed, as whend exits).
    @discardableResult
    func stop(signal: Int32 = SIGTERM) -> Int32 {
        if let daemon = embedded {
            precondition(signal == SIGTERM || signal == SIGINT, "signal \(signal) needs a live daemon: use .live")
            embedded = nil
            return daemon.stop()
        }
        guard let p = process else { return 0 }
        kill(p.processIdentifier, signal)
        if !p.exits(within: Self.stopDeadline) {
            Issue.record("whend did not stop within \(Self.stopDeadline) s of signal \(signal): \(log.suffix(3000))")
            Self.killAndReap(p)
        }
        process = nil
        return p.isRunning ? -1 : p.terminationStatus
    }

    /// How long a stop may take before the test says so: far past whend's own shutdown_timeout,
    /// so that a stop that hangs fails its test instead of holding the suite.
    static let stopDeadline: Double = 60

    /// SIGKILL: no chance to flush, seal or answer.
    func crash() {
        precondition(mode == .live, "a SIGKILL needs a live daemon: use .live")
        guard let p = process else { return }
        Self.killAndReap(p)
        process = nil
    }

    deinit {
        if let daemon = embedded { _ = daemon.stop() }
        if let p = process, p.isRunning { Self.killAndReap(p) }
    }

    /// SIGKILL, and the wait for the end, bounded: a thread in a request a file system never
    /// answers (the power-cut harness holding a write, a frozen ext4) cannot die until it is
    /// answered, and the test that would answer it (thaw, cut) must not wait for it for ever.
    private static func killAndReap(_ p: Process) {
        kill(p.processIdentifier, SIGKILL)
        if !p.exits(within: 30) {
            Issue.record(
                "whend \(p.processIdentifier) is not dead 30 s after SIGKILL; its threads wait in the kernel at: \(kernelWaits(of: p.processIdentifier))"
            )
        }
    }

    /// Where each thread of `pid` waits in the kernel (/proc/PID/task/TID/wchan), once each.
    private static func kernelWaits(of pid: pid_t) -> String {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        let waits = tasks.compactMap { try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/wchan", encoding: .utf8) }
        return Set(waits).sorted().joined(separator: ", ")
    }

    /// Every stored record, parsed.
    func records() -> [[String: Any]] {
        var result: [[String: Any]] = []
        JournalReader(directory: journal).read { r, _ in
            if let o = try? JSONSerialization.jsonObject(with: Data(buffer: r.line)) as? [String: Any] {
                result.append(o)
            }
            return true
        } onProblem: {
            Issue.record("journal problem: \($0)")
        }
        return result
    }
}

/// whend's services run in this process: resolved from the flags as the binary resolves them,
/// logging to a file, stopped as SIGTERM stops the binary.
///
/// The services' tasks run on a thread of their own (`ThreadTaskExecutor`), not on Swift's few
/// shared threads: the tests block those (sockets, `usleep`), and a daemon whose steps waited for
/// a thread the test held would never start.
private final class EmbeddedDaemon: @unchecked Sendable {
    // Unchecked: `status` is written once by the run task before `ended` is signalled and read
    // after it.
    private let services: DaemonServices
    private let executor: ThreadTaskExecutor
    private let ended = DispatchSemaphore(value: 0)
    private let endedFlag = Flag()
    private var status: Int32 = 0

    init(arguments: [String], environment: [String: String], logPath: String) throws {
        // The helpers (workers, the shared host, the plugin check) are the built binary, and the
        // built-in plugins are beside it.
        WhendExecutable.use(executable("whend"))
        // As whend does: a write to a worker's closed pipe is an error, not the end of the tests.
        signal(SIGPIPE, SIG_IGN)
        // `--config` is whend's option beside the settings.
        var settings = arguments
        let configIndex = settings.firstIndex(of: "--config").flatMap { $0 + 1 < settings.count ? $0 : nil }
        let file = configIndex.map { settings[$0 + 1] }
        if let index = configIndex { settings.removeSubrange(index...(index + 1)) }
        let flags = try SettingValue.flags(settings)
        let environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let (configuration, configurationFile) = try DaemonConfiguration.resolve(
            file: file, flags: flags, environment: environment)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        let logger = Logger(label: "whend") { label in FileLogHandler(label: label, file: handle) }
        executor = ThreadTaskExecutor(name: "whend-services")
        do {
            let daemon = try TerminationSignals.withNoneBlocked {
                try Daemon(
                    configuration: configuration, logger: logger, configurationFile: configurationFile,
                    reloadFrom: {
                        try DaemonConfiguration.resolve(file: file, flags: flags, environment: environment).0
                    })
            }
            services = DaemonServices(daemon, stopSignals: [])
        } catch let error as DaemonStartError {
            logger.critical("\(Secrets.scrub(error.description, configuration.allSecretValues))")
            executor.finish()
            throw TestFailure(description: "whend exited at start: \(error)")
        }
        let services = self.services
        Task(executorPreference: executor) { [self] in
            do {
                try await services.run()
            } catch {
                // As whend's binary says it, and exits 1.
                logger.critical("\(Secrets.scrub("\(error)", configuration.allSecretValues))")
                status = 1
            }
            endedFlag.set()
            ended.signal()
        }
    }

    var hasEnded: Bool { endedFlag.isSet }

    /// Stops the services as SIGTERM does, and waits until they have.
    func stop() -> Int32 {
        let services = self.services
        Task(executorPreference: executor) { await services.stop() }
        if ended.wait(timeout: .now() + TestDaemon.stopDeadline) == .timedOut {
            // Its services are left to run: nothing in the process can end them.
            Issue.record("whend in the test's process did not stop within \(TestDaemon.stopDeadline) s")
            return 1
        }
        ended.signal()  // a second stop returns at once
        executor.finish()
        return status
    }
}

extension Process {
    /// Waits until the process has exited, at most `seconds`; false if it still runs.
    func exits(within seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while isRunning, Date() < deadline { usleep(10_000) }
        if isRunning { return false }
        waitUntilExit()
        return true
    }

    /// SIGTERM, then SIGKILL if it still runs `seconds` later: a child of a test inherits the
    /// blocked signals of the thread that started it, and one that does not unblock them
    /// (Python) takes no notice of SIGTERM.
    func end(within seconds: Double = 20) {
        if isRunning { terminate() }
        if !exits(within: seconds) {
            kill(processIdentifier, SIGKILL)
            _ = exits(within: 10)
        }
    }
}

/// A `TaskExecutor` that runs its jobs on one thread of its own until finished.
final class ThreadTaskExecutor: TaskExecutor, @unchecked Sendable {
    // Unchecked: `jobs` and `finished` are guarded by `condition`.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var finished = false

    init(name: String) {
        let thread = Thread { [self] in serve() }
        thread.name = name
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.withLock {
            jobs.append(job)
            condition.signal()
        }
    }

    /// Ends the thread once the jobs already queued have run.
    func finish() {
        condition.withLock {
            finished = true
            condition.signal()
        }
    }

    private func serve() {
        while true {
            let batch: [UnownedJob] = condition.withLock {
                while jobs.isEmpty && !finished { condition.wait() }
                defer { jobs.removeAll(keepingCapacity: true) }
                return jobs
            }
            if batch.isEmpty { return }
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
        }
    }
}

/// Log lines as whend's binary writes them to standard error, to the test daemon's log file.
private struct FileLogHandler: LogHandler {
    let label: String
    let file: FileHandle
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let fields =
            all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0)=\($1)" }.joined(separator: " ")
        let line = "\(Date()) \(event.level) \(label) :\(fields) \(event.message)\n"
        file.write(Data(line.utf8))
    }
}
