import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendControl
import WhendPluginHost
import WhendWire

/// The control socket: it listens, serves root and the daemon's own user (the peer's
/// credentials, `SO_PEERCRED`, whatever the file's mode says) and tells anyone else why not,
/// one request per connection. It owns its listening channel and what answers the requests.
final class ControlServer: Sendable {
    private struct State {
        var channel: Channel?
        var respond: (@Sendable (ControlRequest) -> ControlAnswer)?
        /// Control connections open now.
        var connections: [ObjectIdentifier: Channel] = [:]
        /// Once a stop has begun, a request not yet read is refused, not carried out.
        var stopping = false
    }

    /// What a connection is told when whend stops before it has read the request.
    static let stoppingRefusal = "whend is stopping; nothing was done (a reload was not applied)"
    /// How long a stop waits for the answers under way (a reload reads files, restarts pipelines).
    static let answersDrainTimeout: Duration = .seconds(10)

    /// The most control connections open at once: each holds a descriptor and up to
    /// `ControlProtocol.maxRequestBytes`, and descriptors are what the event socket's clients need.
    static let maxConnections = 64

    private let state = NIOLockedValueBox(State())
    private let group: MultiThreadedEventLoopGroup
    private let listener: UnixListener
    private let live: LiveConfiguration
    private let currentLogger: @Sendable () -> Logger
    private var logger: Logger { currentLogger() }

    init(
        group: MultiThreadedEventLoopGroup, listener: UnixListener, live: LiveConfiguration,
        logger: @escaping @Sendable () -> Logger
    ) {
        self.group = group
        self.listener = listener
        self.live = live
        self.currentLogger = logger
    }

    /// What answers each request from now on.
    func answer(with respond: @escaping @Sendable (ControlRequest) -> ControlAnswer) {
        state.withLockedValue { $0.respond = respond }
    }

    /// Listens on the control socket; returns what it listens on.
    func start() async throws -> String {
        let configuration = live.current
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 64)
            .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { [self] channel in initialize(channel) }
        let control = try await listener.listen(
            bootstrap, name: "control", what: "control socket", path: configuration.controlSocketPath,
            mode: 0o600, flag: "--control-socket")
        state.withLockedValue { $0.channel = control.channel }
        return control.description
    }

    /// Lets root and the daemon's own user in; anyone else gets one line saying why.
    private func initialize(_ channel: Channel) -> EventLoopFuture<Void> {
        guard let provider = channel as? SocketOptionProvider else { return channel.close() }
        let state = self.state
        let id = ObjectIdentifier(channel)
        let admitted = state.withLockedValue { state in
            guard state.connections.count < Self.maxConnections else { return false }
            state.connections[id] = channel
            return true
        }
        // One too many: closed before anything is read (whenctl says whend closed it unanswered).
        // One accepted while whend stops is admitted, and told so (below) like those before it.
        guard admitted else { return channel.close() }
        channel.closeFuture.whenComplete { _ in _ = state.withLockedValue { $0.connections.removeValue(forKey: id) } }
        let credentials: EventLoopFuture<whend_ucred> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.flatMapThrowing { [self] cred in
            let allowed = cred.uid == 0 || cred.uid == geteuid()
            let handler: ControlConnectionHandler
            if allowed {
                handler = ControlConnectionHandler { request in
                    // Read when the request is, not when the connection was accepted.
                    let respond = state.withLockedValue { $0.stopping ? nil : $0.respond }
                    return respond?(request) ?? .refused(Self.stoppingRefusal)
                }
            } else {
                logger.warning(
                    "refused a control connection from uid \(cred.uid) (pid \(cred.pid)): only root and uid \(geteuid()) may control whend"
                )
                handler = ControlConnectionHandler(
                    refusing:
                        "uid \(cred.uid) may not control whend; only root and uid \(geteuid()) (the daemon's user) may")
            }
            try channel.pipeline.syncOperations.addHandler(handler)
            // A stop that began while the credentials were read told a pipeline with no handler.
            if state.withLockedValue({ $0.stopping }) {
                channel.pipeline.syncOperations.fireUserInboundEventTriggered(ControlConnectionHandler.Stopping())
            }
        }
    }

    /// Stops listening, refuses the requests not yet read, and waits (up to
    /// `answersDrainTimeout`) for the answers under way to be sent: whoever asked learns what
    /// became of it, instead of a connection broken off unanswered.
    func stop() async {
        let (listening, open) = state.withLockedValue { state in
            state.stopping = true
            return (state.channel, Array(state.connections.values))
        }
        if let listening {
            try? await listening.close().get()
            if listener.activation.descriptors["control"] == nil { unlink(live.current.controlSocketPath) }
        }
        for connection in open {
            connection.pipeline.fireUserInboundEventTriggered(ControlConnectionHandler.Stopping())
        }
        let clock = ContinuousClock()
        let deadline = clock.now + Self.answersDrainTimeout
        while state.withLockedValue({ !$0.connections.isEmpty }) {
            guard clock.now < deadline else {
                logger.warning(
                    "stopping with control requests still unanswered after \(Self.answersDrainTimeout); their connections are closed"
                )
                return
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }
}

/// The control socket: one request line of JSON in (`ControlRequest`), one answer line of JSON
/// out (`ControlAnswer`), then the daemon closes. Only root and the daemon's own user may use
/// it: the peer's credentials are checked (SO_PEERCRED), not only the file's mode.
final class ControlConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// How a request is answered: by running it, or, for a peer that may not control whend,
    /// with the same refusal whatever it asks (not even decoded).
    private enum Answering {
        case commands(@Sendable (ControlRequest) -> ControlAnswer)
        case refusal(ControlAnswer)
    }

    private var request: [UInt8] = []
    private var answered = false
    private let answering: Answering
    /// The request's deadline, cancelled once it is answered.
    private var deadline: Scheduled<Void>?

    init(respond: @escaping @Sendable (ControlRequest) -> ControlAnswer) {
        answering = .commands(respond)
    }

    init(refusing why: String) {
        answering = .refusal(.refused(why))
    }

    /// How long a connection may take to send its request: an idle one holds a descriptor.
    static let requestTimeout: TimeAmount = .seconds(10)

    /// The handler is added once the peer's credentials are read, when the connection may
    /// already be active: the deadline starts from whichever comes second.
    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { startDeadline(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        startDeadline(context: context)
        context.fireChannelActive()
    }

    private func startDeadline(context: ChannelHandlerContext) {
        guard deadline == nil, !answered else { return }
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: Self.requestTimeout) {
            guard !handler.value.answered, loopContext.value.channel.isActive else { return }
            handler.value.reply(
                .refused(
                    "no request within \(Self.requestTimeout.nanoseconds / 1_000_000_000) s; send one line of JSON"),
                context: loopContext.value)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        let buffer = unwrapInboundIn(data)
        request.append(contentsOf: buffer.readableBytesView)
        // The limit holds however the bytes arrive: a line longer than it is refused too.
        let newline = request.prefix(ControlProtocol.maxRequestBytes + 1).firstIndex(of: 0x0A)
        if let newline {
            answer(Array(request[..<newline]), context: context)
        } else if request.count > ControlProtocol.maxRequestBytes {
            reply(
                .refused("the request is over \(ControlProtocol.maxRequestBytes) bytes; send one line of JSON"),
                context: context)
        }
    }

    /// whend is stopping: a request not yet read is refused at once (one being answered is
    /// answered).
    struct Stopping {}

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is Stopping, !answered {
            reply(.refused(ControlServer.stoppingRefusal), context: context)
        } else if let event = event as? ChannelEvent, event == .inputClosed, !answered {
            answer(request, context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }

    /// Runs the command off the event loop (a reload reads files and may wait for the writer).
    private func answer(_ line: [UInt8], context: ChannelHandlerContext) {
        answered = true
        deadline?.cancel()
        let respond: @Sendable (ControlRequest) -> ControlAnswer
        switch answering {
        case .refusal(let refusal):
            reply(refusal, context: context)
            return
        case .commands(let commands):
            respond = commands
        }
        let request: ControlRequest
        do { request = try ControlRequest.decode(line) } catch {
            reply(.refused(error.description), context: context)
            return
        }
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        DispatchQueue.global().async {
            let answer = respond(request)
            eventLoop.execute { handler.value.reply(answer, context: loopContext.value) }
        }
    }

    private func reply(_ answer: ControlAnswer, context: ChannelHandlerContext) {
        answered = true
        deadline?.cancel()
        let bytes = answer.encoded()
        var buffer = context.channel.allocator.buffer(capacity: bytes.count + 1)
        buffer.writeBytes(bytes)
        buffer.writeInteger(UInt8(0x0A))
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }
}
