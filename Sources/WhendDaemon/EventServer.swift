import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendJournal
import WhendRecord
import WhendWire

/// The event socket and its connections: it listens, admits each connection up to
/// `max_connections` (the sender's credentials from the kernel), hands it an
/// `EventConnectionHandler`, and at a stop drains them all. It owns the listening channel and
/// the open connections, under one lock.
final class EventServer: Sendable {
    private struct State {
        var server: Channel?
        var open: [ObjectIdentifier: Channel] = [:]
        /// Connections accepted since start, to number them.
        var connections: UInt64 = 0
        var lastRefusalLog = Date.distantPast
    }

    private let state = NIOLockedValueBox(State())
    private let group: MultiThreadedEventLoopGroup
    private let listener: UnixListener
    private let live: LiveConfiguration
    private let writer: any EventJournal
    private let metrics: DaemonMetrics
    private let limiter: SenderRateLimiter
    private let subscribers = SubscriberCount()
    /// The one reading of the journal's newest records for subscribers that caught up.
    private let hub: SubscriptionHub
    private let currentLogger: @Sendable () -> Logger
    private var logger: Logger { currentLogger() }

    init(
        group: MultiThreadedEventLoopGroup, listener: UnixListener, live: LiveConfiguration, writer: any EventJournal,
        metrics: DaemonMetrics, limiter: SenderRateLimiter, logger: @escaping @Sendable () -> Logger
    ) {
        self.group = group
        self.listener = listener
        self.live = live
        self.writer = writer
        self.metrics = metrics
        self.limiter = limiter
        self.currentLogger = logger
        hub = SubscriptionHub(journal: live.current.journal.directory, committed: { writer.statistics.lastSeq })
    }

    /// Listens on the event socket: from then on apps are served. Returns what it listens on.
    func start() async throws -> String {
        let server = try await listen(live.current)
        state.withLockedValue { $0.server = server.channel }
        return server.description
    }

    private func listen(_ configuration: DaemonConfiguration) async throws -> (channel: Channel, description: String) {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 1024)
            .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
            .childChannelOption(ChannelOptions.maxMessagesPerRead, value: 16)
            .childChannelInitializer { [self] channel in initialize(channel) }
        return try await listener.listen(
            bootstrap, name: "events", what: "event socket", path: configuration.socketPath,
            mode: configuration.socketMode, flag: "--socket")
    }

    private func initialize(_ channel: Channel) -> EventLoopFuture<Void> {
        guard let provider = channel as? SocketOptionProvider else {
            return channel.close()
        }
        // Each connection holds a descriptor and buffers: past `max_connections` one more is
        // told why and closed, before anything of it is read.
        let id = ObjectIdentifier(channel)
        let limit = live.current.maxConnections
        let admitted = state.withLockedValue { state in
            guard state.open.count < limit else { return false }
            state.open[id] = channel
            return true
        }
        guard admitted else { return refuseConnection(channel, limit: limit) }
        let state = self.state
        channel.closeFuture.whenComplete { _ in state.withLockedValue { _ = $0.open.removeValue(forKey: id) } }
        // The sender's pid, uid and gid come from the kernel (SO_PEERCRED), never from the client.
        let credentials: EventLoopFuture<whend_ucred> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.flatMapThrowing { [self] cred in
            let comm =
                (try? String(contentsOfFile: "/proc/\(cred.pid)/comm", encoding: .utf8))?
                .trimmingCharacters(in: .newlines) ?? ""
            let peer = PeerCredentials(pid: cred.pid, uid: cred.uid, gid: cred.gid, comm: comm)
            metrics.connectionOpened()
            let metrics = self.metrics
            channel.closeFuture.whenComplete { _ in metrics.connectionClosed() }
            let connectionID = self.state.withLockedValue {
                $0.connections += 1
                return $0.connections
            }
            let handler = EventConnectionHandler(
                writer: writer, live: live, credentials: peer, connectionID: connectionID, counters: metrics,
                limiter: limiter, subscribers: subscribers, hub: hub)
            try channel.pipeline.syncOperations.addHandler(handler)
        }
    }

    /// Answers one connection too many with an `unavailable` error about the connection (no
    /// event number: PROTOCOL.md §5) and closes it; counts it, and says so in the log at most
    /// every ten seconds.
    private func refuseConnection(_ channel: Channel, limit: Int) -> EventLoopFuture<Void> {
        let refused = metrics.connectionRefused()
        let due = state.withLockedValue { state in
            guard Date().timeIntervalSince(state.lastRefusalLog) >= 10 else { return false }
            state.lastRefusalLog = Date()
            return true
        }
        if due {
            logger.warning(
                "refused an event connection: \(limit) are open (max_connections); \(refused) refused since start")
        }
        let line = ServerMessage.error(
            WireError(
                .unavailable,
                "whend has \(limit) connections open, its max_connections; close one, or try again later",
                isAboutConnection: true), event: nil)
        // The channel is not active yet: the line goes out when it is.
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(RefusedConnectionHandler(line: line))
        }
    }

    /// Stops accepting and drains every connection: each finishes the lines it has received and
    /// gets its last acks, bounded by `shutdown_timeout`.
    func drain() async {
        logger.info("stopping: draining \(metrics.connections) connection(s)")
        let configuration = live.current
        if let server = state.withLockedValue({ $0.server }) {
            try? await server.close().get()
            // An activated socket is the service manager's: it stays, and so does its path.
            if listener.activation.events == nil { unlink(configuration.socketPath) }
        }
        let open = state.withLockedValue { Array($0.open.values) }
        for channel in open {
            channel.pipeline.fireUserInboundEventTriggered(DrainRequest())
        }
        let deadline = Date().addingTimeInterval(configuration.shutdownTimeout)
        for channel in open {
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { break }
            if await !Self.closes(channel, within: remaining) {
                logger.warning("a connection did not drain within \(configuration.shutdownTimeout) s; closing it")
            }
        }
        for channel in open { channel.close(promise: nil) }
    }

    /// Whether `channel` closes within `seconds`.
    private static func closes(_ channel: Channel, within seconds: TimeInterval) async -> Bool {
        let outcome = channel.eventLoop.makePromise(of: Bool.self)
        let settled = NIOLockedValueBox(false)
        let settle: @Sendable (Bool) -> Void = { closed in
            let first = settled.withLockedValue { done in
                defer { done = true }
                return !done
            }
            if first { outcome.succeed(closed) }
        }
        channel.closeFuture.whenComplete { _ in settle(true) }
        let timer = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(seconds * 1e9))) { settle(false) }
        let closed = (try? await outcome.futureResult.get()) ?? true
        timer.cancel()
        return closed
    }

}

/// Says why a connection is refused, once it is active, and closes it.
private final class RefusedConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let line: [UInt8]

    init(line: [UInt8]) { self.line = line }

    func channelActive(context: ChannelHandlerContext) {
        let buffer = context.channel.allocator.buffer(bytes: line)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    // Whatever the client sends is not read.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
