import CLinux
import CSystemd
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendControl
import WhendJournal
import WhendPipelines
import WhendPluginHost
import WhendWire

/// Why whend cannot start: a case per cause, each with what it was about and, as the log and
/// the exit say it, what to do.
package enum DaemonStartError: Error, CustomStringConvertible {
    case stateDirectoryUnusable(directory: String, reason: String)
    case stateDirectoryNotPrivate(reason: String)
    case lockFileUnusable(path: String, reason: String)
    case cannotLock(path: String, reason: String)
    case stateDirectoryInUse(directory: String, lockFile: String, holder: Int32?)
    case journalUnusable(directory: String, reason: String)
    case pluginsFailed(reason: String)
    case trackingPlanRefused(reason: String)
    case inheritedSocketUnusable(what: String, fd: Int32, reason: String)
    case socketDirectoryUnusable(directory: String, what: String, reason: String)
    case socketDirectoryNotPrivate(reason: String)
    case notASocket(path: String, flag: String)
    case socketInUse(path: String, flag: String)
    case cannotListen(path: String, what: String, reason: String, flag: String)

    package var description: String {
        switch self {
        case .stateDirectoryUnusable(let directory, let reason):
            return
                "cannot create the state directory \(directory): \(reason); set --state-dir to a directory you can write"
        case .stateDirectoryNotPrivate(let reason):
            return "refusing the state directory: \(reason)"
        case .lockFileUnusable(let path, let reason):
            return "cannot open \(path): \(reason); set --state-dir to a directory you can write"
        case .cannotLock(let path, let reason):
            return "cannot lock \(path): \(reason)"
        case .stateDirectoryInUse(let directory, let lockFile, let holder):
            let who = holder.map { "another whend (pid \($0))" } ?? "another whend"
            return
                "\(who) is already using the state directory \(directory) (it holds \(lockFile)); a journal has exactly one writer: stop that daemon first, or give this one its own --state-dir"
        case .journalUnusable(let directory, let reason):
            return "cannot open the journal in \(directory): \(reason)"
        case .pluginsFailed(let reason):
            return "cannot start the plugins: \(reason)"
        case .trackingPlanRefused(let reason):
            return "\(reason); fix the plan, or set tracking_plan to another file or to nothing"
        case .inheritedSocketUnusable(let what, let fd, let reason):
            return "cannot use the \(what) the service manager passed (fd \(fd)): \(reason)"
        case .socketDirectoryUnusable(let directory, let what, let reason):
            return "cannot create \(directory) for the \(what): \(reason)"
        case .socketDirectoryNotPrivate(let reason):
            return "refusing to listen: \(reason)"
        case .notASocket(let path, let flag):
            return "\(path) exists and is not a socket; remove it or choose another \(flag)"
        case .socketInUse(let path, let flag):
            return "another whend is already listening on \(path); stop it first, or give this one another \(flag)"
        case .cannotListen(let path, let what, let reason, let flag):
            return "cannot listen on \(path) (\(what)): \(reason); set \(flag) to a path in a directory you can write"
        }
    }
}

/// whend: the event socket in front of the journal, and the control socket beside it.
///
/// `init` takes the state directory's lock and recovers the journal; `DaemonServices` then runs
/// the steps below as services of one `ServiceGroup`, started in order and stopped in reverse
/// at SIGTERM or SIGINT: it stops accepting, lets every connection finish the lines it has
/// received, commits them, sends the final acks and seals the active segment. SIGHUP (or
/// `whenctl reload`) re-reads the configuration.
package final class Daemon: Sendable {
    /// Reads the configuration anew (file, environment, flags) for a reload.
    package typealias ConfigurationSource = @Sendable () throws -> DaemonConfiguration

    let live: LiveConfiguration
    /// Where the configuration came from, for status.
    let configurationFile: String?
    private let loggerBox: NIOLockedValueBox<Logger>
    let metrics = DaemonMetrics()
    let limiter: SenderRateLimiter
    /// Held for the daemon's life: no second whend may write this state directory's journal.
    let stateLock: StateDirectoryLock
    let writer: JournalWriter
    let group: MultiThreadedEventLoopGroup
    /// The event socket and its connections.
    let events: EventServer
    /// The control socket.
    let control: ControlServer
    let notifier = ServiceNotifier()
    let listener = UnixListener(activation: SocketActivation.fromEnvironment())
    var activation: SocketActivation { listener.activation }
    let startedAt = Date()
    /// What the sockets are, for the line that says whend is ready.
    let listening = NIOLockedValueBox<(events: String, control: String)>(("", ""))
    /// Whether the stop gave up waiting for the journal's last write or sync: whend then exits
    /// with status 1.
    package var stoppedWithoutTheJournal: Bool { journalAbandoned.withLockedValue { $0 } }
    private let journalAbandoned = NIOLockedValueBox(false)
    /// The heartbeat's reports: STATUS=, the rate limit's summary, memory given back.
    let reporter: StatusReporter
    /// The pipelines: their workers, the shared host, what retention took from them.
    let pipelines: PipelineService
    /// The configuration's changes and the plugins it routes to: reload, load, unload.
    let configurations: ConfigurationService

    /// The configuration in force (it changes on reload).
    package var configuration: DaemonConfiguration { live.current }
    var logger: Logger { loggerBox.withLockedValue { $0 } }

    package init(
        configuration: DaemonConfiguration, logger: Logger, configurationFile: String? = nil,
        reloadFrom source: ConfigurationSource? = nil
    ) throws {
        var logger = logger
        logger.logLevel = Logger.Level(rawValue: configuration.logLevel) ?? .info
        let loggerBox = NIOLockedValueBox(logger)
        self.loggerBox = loggerBox
        self.live = LiveConfiguration(configuration)
        self.configurationFile = configurationFile
        self.limiter = SenderRateLimiter(
            rate: configuration.rateLimit, burst: configuration.rateBurst, by: configuration.rateLimitBy)
        // Before anything touches the journal: recovering the tail of a journal another daemon
        // is writing would seal its live segment under it.
        stateLock = try StateDirectoryLock(stateDirectory: configuration.stateDirectory)
        do {
            writer = try JournalWriter(configuration: configuration.journal) { message in
                loggerBox.withLockedValue { $0 }.notice("\(message)")
            }
        } catch {
            throw DaemonStartError.journalUnusable(directory: configuration.journal.directory.path, reason: "\(error)")
        }
        pipelines = PipelineService(writer: writer) { loggerBox.withLockedValue { $0 } }
        let threads = configuration.eventLoopThreads > 0 ? configuration.eventLoopThreads : System.coreCount
        group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        events = EventServer(
            group: group, listener: listener, live: live, writer: writer, metrics: metrics, limiter: limiter
        ) { loggerBox.withLockedValue { $0 } }
        control = ControlServer(group: group, listener: listener, live: live) { loggerBox.withLockedValue { $0 } }
        reporter = StatusReporter(
            writer: writer, metrics: metrics, pipelines: pipelines, limiter: limiter, notifier: notifier, live: live
        ) { loggerBox.withLockedValue { $0 } }
        configurations = ConfigurationService(
            live: live, source: source, pipelines: pipelines, writer: writer, limiter: limiter, notifier: notifier,
            reporter: reporter, activation: listener.activation, loggerBox: loggerBox)
    }

    /// Starts the journal writer (the first step of `DaemonServices`).
    func startJournal() {
        raiseOpenFileLimit()
        // The watchdog is fed from the journal writer's loop: if that loop hangs, pings stop.
        let reporter = self.reporter
        let metrics = self.metrics
        // Retention waits for every configured pipeline's durable cursor.
        writer.waitForReaders { [weak self] in
            guard let self else { return [] }
            return self.pipelines.cursors(self.configuration)
        } onLoss: { [weak self] pipeline, first, last in
            self?.pipelines.lostToRetention(pipeline, last - first + 1)
            self?.metrics.lostToRetention(pipeline: pipeline, records: last - first + 1)
        }
        writer.start(heartbeatInterval: notifier.watchdogInterval ?? 1) {
            reporter.heartbeat()
        } onCommit: { records, bytes, seconds in
            metrics.committed(records: records, bytes: bytes, seconds: seconds)
        }
    }

    /// Listens on the control socket (`whenctl status`, `reload`, `metrics`, `plugins`).
    func startControl() async throws {
        control.answer { [weak self] request in self?.handleControlRequest(request) ?? .refused("whend is stopping") }
        let description = try await control.start()
        listening.withLockedValue { $0.control = description }
    }

    /// Listens on the event socket: from now on apps are served.
    func startEvents() async throws {
        let description = try await events.start()
        listening.withLockedValue { $0.events = description }
    }

    /// Stops accepting and drains every connection (bounded by `shutdown_timeout`).
    func stopEvents() async {
        notifier.stopping()
        await events.drain()
    }

    /// Every step has started: says so in the log and to the service manager (READY=1).
    func announceReady() {
        let configuration = self.configuration
        let (events, control) = listening.withLockedValue { ($0.events, $0.control) }
        logger.info(
            "whend \(WhendVersion.current) listening on \(events); control on \(control); journal \(configuration.journal.directory.path) at _seq \(writer.statistics.lastSeq); durability \(configuration.journal.durability.rawValue)"
        )
        notifier.ready(status: reporter.statusLine())
    }

    /// Each connection is a descriptor: take the hard limit (what systemd's LimitNOFILE or the
    /// administrator allows) rather than the soft default of 1024.
    private func raiseOpenFileLimit() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) != 0 {
            logger.warning("could not raise the open-file limit to \(limit.rlim_max)")
        }
    }

    /// Commits what is left, seals the active segment, and lets the event loops go: within
    /// `shutdown_timeout`. A write or a sync the device never finishes (a disk gone, a hung
    /// network file system) held the stop for as long as it hung; past the timeout whend stops
    /// without it, as a crash would: nothing it held was acknowledged, and the next start
    /// recovers the segment.
    func stopJournal() async {
        let writer = self.writer
        // At least a second: `shutdown_timeout = 0` asks not to wait for connections, not to
        // leave a journal that would seal in milliseconds unsealed.
        let seconds = max(1, configuration.shutdownTimeout)
        if await !onAThreadOfItsOwn(within: seconds, { writer.shutdown() }) {
            journalAbandoned.withLockedValue { $0 = true }
            logger.error(
                "the journal's last write or sync did not finish within shutdown_timeout (\(Settings.number(seconds)) s); stopping without it: nothing it held was acknowledged, and the next start recovers the segment. A sync that does not return is the device's: check the disk under \(configuration.stateDirectory)"
            )
        }
        try? await group.shutdownGracefully()
        logger.info("stopped at _seq \(writer.statistics.lastSeq)")
    }
}

// Read by NIO on the connection's event loop and handed on as values.
extension whend_ucred: @retroactive @unchecked Sendable {}
