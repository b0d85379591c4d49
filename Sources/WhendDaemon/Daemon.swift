import CSystemd
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import WhendJournal
import WhendWire

/// Why the daemon could not start, with what to do.
public struct DaemonStartError: Error, CustomStringConvertible {
    public var description: String
}

/// whend: the event socket in front of the journal.
///
/// `start()` recovers the journal, binds the socket and returns once whend accepts events;
/// `run()` then blocks until SIGTERM or SIGINT and stops gracefully: it stops accepting, lets
/// every connection finish the lines it has received, commits them, sends the final acks and
/// seals the active segment.
public final class Daemon: Sendable {
    public let configuration: DaemonConfiguration
    let logger: Logger
    let counters = DaemonCounters()
    let writer: JournalWriter
    let group: MultiThreadedEventLoopGroup
    let channels = NIOLockedValueBox<[ObjectIdentifier: Channel]>([:])
    let serverChannel = NIOLockedValueBox<Channel?>(nil)
    let notifier = ServiceNotifier()
    let activation = SocketActivation.fromEnvironment()
    private let stopRequested = DispatchSemaphore(value: 0)
    private let signalWatch = NIOLockedValueBox<SignalWatch?>(nil)
    private let lastStatus = NIOLockedValueBox<(at: Date, stored: UInt64)>((Date(), 0))

    public init(configuration: DaemonConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let log = logger
        do {
            writer = try JournalWriter(configuration: configuration.journal) { log.notice("\($0)") }
        } catch {
            throw DaemonStartError(
                description: "cannot open the journal in \(configuration.journal.directory.path): \(error)")
        }
        let threads = configuration.eventLoopThreads > 0 ? configuration.eventLoopThreads : System.coreCount
        group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
    }

    /// Starts the journal writer and listens on the event socket.
    public func start() throws {
        // Watch for SIGTERM and SIGINT before anything can connect: a stop requested the
        // moment the socket listens must not be lost.
        watchStopSignals()
        raiseOpenFileLimit()
        // The watchdog is fed from the journal writer's loop: if that loop hangs, pings stop.
        let notifier = self.notifier
        writer.start(heartbeatInterval: notifier.watchdogInterval ?? 1) { [weak self] in
            notifier.watchdog()
            self?.publishStatusIfDue()
        }
        let path = configuration.socketPath
        if activation.events == nil { try prepareSocketPath(path) }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 1024)
            .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
            .childChannelOption(ChannelOptions.maxMessagesPerRead, value: 16)
            .childChannelInitializer { [self] channel in initialize(channel) }
        let server: Channel
        let listening: String
        if let fd = activation.events {
            do {
                server = try bootstrap.withBoundSocket(fd).wait()
            } catch {
                throw DaemonStartError(
                    description: "cannot use the event socket the service manager passed (fd \(fd)): \(error)")
            }
            listening = "the event socket from the service manager (fd \(fd))"
        } else {
            do {
                server = try bootstrap.bind(unixDomainSocketPath: path).wait()
            } catch {
                throw DaemonStartError(
                    description:
                        "cannot listen on \(path): \(error); set WHEND_SOCKET or --socket to a path in a directory you can write"
                )
            }
            chmod(path, configuration.socketMode)
            listening = path
        }
        serverChannel.withLockedValue { $0 = server }
        let stats = writer.statistics
        logger.info(
            "whend \(WhendVersion.current) listening on \(listening); journal \(configuration.journal.directory.path) at _seq \(stats.lastSeq); durability \(configuration.journal.durability.rawValue)"
        )
        notifier.ready(status: statusLine())
    }

    private func initialize(_ channel: Channel) -> EventLoopFuture<Void> {
        guard let provider = channel as? SocketOptionProvider else {
            return channel.close()
        }
        // The sender's pid, uid and gid come from the kernel (SO_PEERCRED), never from the client.
        let credentials: EventLoopFuture<KernelPeerCredentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.flatMapThrowing { [self] cred in
            let comm =
                (try? String(contentsOfFile: "/proc/\(cred.pid)/comm", encoding: .utf8))?
                .trimmingCharacters(in: .newlines) ?? ""
            let peer = PeerCredentials(pid: cred.pid, uid: cred.uid, gid: cred.gid, comm: comm)
            let id = ObjectIdentifier(channel)
            channels.withLockedValue { $0[id] = channel }
            counters.connectionOpened()
            let counters = self.counters
            let channels = self.channels
            channel.closeFuture.whenComplete { _ in
                channels.withLockedValue { _ = $0.removeValue(forKey: id) }
                counters.connectionClosed()
            }
            let handler = EventConnectionHandler(
                writer: writer, configuration: configuration, credentials: peer, counters: counters)
            try channel.pipeline.syncOperations.addHandler(handler)
        }
    }

    /// The live figures for `STATUS=`: connections, events stored per second, last `_seq`.
    private func statusLine() -> String {
        let stats = writer.statistics
        let (at, stored) = lastStatus.withLockedValue { $0 }
        let seconds = max(0.001, Date().timeIntervalSince(at))
        let rate = Double(stats.recordsStored &- stored) / seconds
        let failing = stats.failing.map { "; journal failing: \($0)" } ?? ""
        return "\(counters.connections) clients, \(Int(rate)) events/s, last _seq \(stats.lastSeq)\(failing)"
    }

    /// Updates STATUS= every five seconds, from the writer's heartbeat.
    private func publishStatusIfDue() {
        let due = lastStatus.withLockedValue { Date().timeIntervalSince($0.at) >= 5 }
        guard due else { return }
        let line = statusLine()
        let stored = writer.statistics.recordsStored
        lastStatus.withLockedValue { $0 = (Date(), stored) }
        notifier.status(line)
    }

    private func watchStopSignals() {
        let stop = stopRequested
        var sources: [DispatchSourceSignal] = []
        for sig in [SIGTERM, SIGINT] {
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { stop.signal() }
            source.resume()
            // Only now stop the default action: a signal that comes first still ends whend.
            signal(sig, SIG_IGN)
            sources.append(source)
        }
        signalWatch.withLockedValue { $0 = SignalWatch(sources: sources) }
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

    /// Creates the socket's directory, and removes a socket file left by a daemon that is gone.
    /// Refuses to start when another daemon answers on the path.
    private func prepareSocketPath(_ path: String) throws {
        let directory = (path as NSString).deletingLastPathComponent
        if !FileManager.default.fileExists(atPath: directory) {
            do {
                try FileManager.default.createDirectory(
                    atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            } catch {
                throw DaemonStartError(description: "cannot create \(directory) for the event socket: \(error)")
            }
        }
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        guard st.st_mode & S_IFMT == S_IFSOCK else {
            throw DaemonStartError(
                description: "\(path) exists and is not a socket; remove it or choose another --socket")
        }
        if socketAnswers(path) {
            throw DaemonStartError(
                description:
                    "another whend is already listening on \(path); stop it first, or give this one another --socket")
        }
        unlink(path)
    }

    private func socketAnswers(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }

    /// Blocks until SIGTERM or SIGINT (watched from `start()` on), then stops gracefully.
    public func run() {
        stopRequested.wait()
        shutdown()
    }

    /// Stops accepting, drains every connection (bounded by `shutdownTimeout`), commits, seals.
    public func shutdown() {
        notifier.stopping()
        logger.info("stopping: draining \(counters.connections) connection(s)")
        if let server = serverChannel.withLockedValue({ $0 }) {
            try? server.close().wait()
            // An activated socket is the service manager's: it stays, and so does its path.
            if activation.events == nil { unlink(configuration.socketPath) }
        }
        let open = channels.withLockedValue { Array($0.values) }
        for channel in open {
            channel.pipeline.fireUserInboundEventTriggered(DrainRequest())
        }
        let deadline = Date().addingTimeInterval(configuration.shutdownTimeout)
        for channel in open {
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { break }
            let done = DispatchSemaphore(value: 0)
            channel.closeFuture.whenComplete { _ in done.signal() }
            if done.wait(timeout: .now() + remaining) == .timedOut {
                logger.warning("a connection did not drain within \(configuration.shutdownTimeout) s; closing it")
            }
        }
        for channel in open { channel.close(promise: nil) }
        writer.shutdown()
        try? group.syncShutdownGracefully()
        logger.info("stopped at _seq \(writer.statistics.lastSeq)")
    }
}

/// The layout of Linux's `struct ucred` (which Glibc hides behind `_GNU_SOURCE`).
struct KernelPeerCredentials: Sendable {
    var pid: Int32 = 0
    var uid: UInt32 = 0
    var gid: UInt32 = 0
}

/// Keeps the signal sources alive for as long as the daemon runs.
final class SignalWatch: @unchecked Sendable {
    // Unchecked: `sources` is set once in init and never touched again; it is held only so
    // that the sources are not released.
    let sources: [DispatchSourceSignal]

    init(sources: [DispatchSourceSignal]) {
        self.sources = sources
    }
}
