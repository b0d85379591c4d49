import Foundation
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendRecord
import WhendTrackingPlan
import WhendWire

/// Asks a connection to finish: read nothing more, wait for the journal, send the final ack,
/// close. Sent through the pipeline at a graceful stop.
struct DrainRequest {}

/// One app's connection to the event socket (PROTOCOL.md §2–§6): the transport around the
/// ingest path (`IngestStage`), from bytes to acks.
///
/// Reading a chunk: the framer cuts lines; the stage takes each (valid events into its batch,
/// an answer for the others, sent at once). At the end of the read the batch goes to the journal
/// writer. When the writer reports it stored, the ack moves forward to the last line before the
/// oldest batch still in flight.
final class EventConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private struct InFlight {
        var firstLine: UInt64
        var lineNumbers: [UInt64]
        var bytes: Int
    }

    let writer: any EventJournal
    let live: LiveConfiguration
    private var generation: Int
    private let counters: DaemonMetrics
    private var framer: LineFramer
    /// Everything between a line and the journal: validation, rate limit, encoding, middleware.
    private var stage: IngestStage
    let credentials: PeerCredentials
    let subscribers: SubscriberCount
    let hub: SubscriptionHub
    /// Set once the first line asked for a subscription: the connection then only sends.
    var subscribing = false
    var subscription: Subscription?

    private var lastAckSent: UInt64 = 0
    private var inFlight: [InFlight] = []
    private var inFlightHead = 0
    private var pendingBytes = 0
    private var inputClosed = false
    private var closing = false
    private var readPending = false
    private var wroteSinceFlush = false
    /// A line is being checked against the plan on another thread (`checkElsewhere`): the lines
    /// after it wait in `queued`, in order, and nothing more is read meanwhile.
    private var holding = false
    private var queued: [QueuedPiece] = []
    /// Bytes of lines this turn of the event loop may still check against the plan here: past
    /// them, the next line is checked elsewhere and the rest wait, so that a read of many lines
    /// just under `longCheckLineBytes` holds the loop no longer than one such line would.
    private var checkBytesLeft = Int.max

    /// A framed line kept past its read: its own bytes.
    private enum QueuedPiece {
        case line([UInt8])
        case tooLarge(Int)
    }

    init(
        writer: any EventJournal, live: LiveConfiguration, credentials: PeerCredentials, connectionID: UInt64,
        counters: DaemonMetrics, limiter: SenderRateLimiter, subscribers: SubscriberCount,
        hub: SubscriptionHub
    ) {
        self.hub = hub
        self.writer = writer
        self.credentials = credentials
        self.subscribers = subscribers
        self.live = live
        self.generation = live.generation
        self.counters = counters
        let (configuration, ingest, plan) = live.snapshot
        self.stage = IngestStage(
            configuration: configuration, ingest: ingest, plan: plan, limiter: limiter, credentials: credentials,
            connectionID: connectionID, metrics: counters)
        // The line limit stays what the welcome told this client; new connections take up a
        // changed max_event_bytes.
        self.framer = LineFramer(maxLineBytes: configuration.maxEventBytes)
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        guard !closing, !subscribing else { return }
        if live.generation != generation {
            generation = live.generation
            let now = live.snapshot
            stage.reconfigure(now.configuration, ingest: now.ingest, plan: now.plan)
        }
        counters.add(bytesIn: buffer.readableBytes)
        stage.beginRead(bytes: buffer.readableBytes)
        checkBytesLeft = stage.longCheckLineBytes
        buffer.withUnsafeReadableBytes { raw in
            framer.feed(raw.assumingMemoryBound(to: UInt8.self)) { piece in handle(piece, context: context) }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        submitBatch(context: context)
        sendAckIfDue(context: context)
        flushIfNeeded(context: context)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            // Half-close: the client has sent its last line. Bytes after the last newline form
            // a final line; then answer everything and close once the journal has it.
            framer.finish { piece in handle(piece, context: context) }
            submitBatch(context: context)
            inputClosed = true
            closeIfDone(context: context)
            flushIfNeeded(context: context)
        } else if event is DrainRequest, subscribing {
            // Stopping: the subscriber resumes from its last _seq at the next start. What it
            // has not read goes out if it reads within a second; a stalled one does not hold
            // the stop until shutdown_timeout.
            subscription?.cancel()
            closing = true
            flushThenClose(context: context)
            let channel = context.channel
            context.eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
        } else if event is DrainRequest {
            submitBatch(context: context)
            inputClosed = true
            closeIfDone(context: context)
            flushIfNeeded(context: context)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { resumeReadingIfAllowed(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        subscription?.cancel()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // A client that vanished mid-write: nothing to tell it. Its batches still get stored.
        closing = true
        context.close(promise: nil)
    }

    // MARK: Outbound: backpressure

    func read(context: ChannelHandlerContext) {
        if mayRead(context: context) {
            context.read()
        } else {
            readPending = true
        }
    }

    /// Stop reading while this connection has too much waiting for the journal, or while a
    /// client that asked for acks does not read them (so replies never pile up without bound).
    private func mayRead(context: ChannelHandlerContext) -> Bool {
        guard !inputClosed, !closing, !holding else { return false }
        // Through `stage`, not a copy of the whole configuration per read.
        if pendingBytes >= stage.configuration.maxPendingBytesPerConnection { return false }
        if stage.acks && !context.channel.isWritable { return false }
        if writer.pendingBytes >= stage.configuration.maxPendingBytes {
            // Paused by all connections together: nothing of ours may be in flight to wake us,
            // so look again shortly.
            scheduleRecheck(context: context)
            return false
        }
        return true
    }

    private var recheckScheduled = false

    private func scheduleRecheck(context: ChannelHandlerContext) {
        guard !recheckScheduled else { return }
        recheckScheduled = true
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: .milliseconds(2)) {
            handler.value.recheckScheduled = false
            handler.value.resumeReadingIfAllowed(context: loopContext.value)
        }
    }

    private func resumeReadingIfAllowed(context: ChannelHandlerContext) {
        if readPending && mayRead(context: context) {
            readPending = false
            context.read()
        }
    }

    // MARK: Lines

    private func handle(_ piece: LineFramer.Piece, context: ChannelHandlerContext) {
        // A subscriber's later lines, even those that came in the read of its first, are no
        // events (PROTOCOL.md §9): nothing it sends after that line is stored.
        guard !subscribing else { return }
        if holding {
            switch piece {
            case .line(let bytes): queued.append(.line(Array(bytes)))
            case .tooLarge(let length): queued.append(.tooLarge(length))
            }
            return
        }
        if case .line(let bytes) = piece {
            if bytes.count > checkBytesLeft, let plan = stage.plan {
                checkElsewhere(Array(bytes), plan: plan, context: context)
                return
            }
            checkBytesLeft &-= bytes.count
        }
        reply(to: piece, stage.take(piece), context: context)
    }

    /// Checks a line whose patterns may take long on a thread of the blocking pool, so that the
    /// event loop goes on serving the other connections (and accepting new ones): this
    /// connection alone waits, its later lines queued behind it, in order.
    private func checkElsewhere(_ line: [UInt8], plan: TrackingPlan, context: ChannelHandlerContext) {
        holding = true
        let app = stage.defaultApp
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        NIOThreadPool.singleton.runIfActive(eventLoop: context.eventLoop) {
            IngestStage.planVerdict(of: line, plan: plan, defaultApp: app)
        }.whenComplete { result in
            // A pool that no longer runs anything: the line is checked here.
            // (Not `try?`: it would flatten "checked, no violation" into "not checked", and the
            // line be checked again here, holding the loop after all.)
            let verdict: IngestStage.PlanVerdict
            switch result {
            case .success(let violation): verdict = .checked(violation)
            case .failure: verdict = .unchecked
            }
            handler.value.release(line, verdict, context: loopContext.value)
        }
    }

    /// The line checked elsewhere is taken with its verdict, then the lines that came after it.
    private func release(_ line: [UInt8], _ verdict: IngestStage.PlanVerdict, context: ChannelHandlerContext) {
        holding = false
        checkBytesLeft = stage.longCheckLineBytes
        line.withUnsafeBufferPointer { reply(to: .line($0), stage.take(.line($0), plan: verdict), context: context) }
        while !holding, !queued.isEmpty {
            switch queued.removeFirst() {
            case .line(let bytes): bytes.withUnsafeBufferPointer { handle(.line($0), context: context) }
            case .tooLarge(let length): handle(.tooLarge(length), context: context)
            }
        }
        submitBatch(context: context)
        sendAckIfDue(context: context)
        closeIfDone(context: context)
        flushIfNeeded(context: context)
        resumeReadingIfAllowed(context: context)
    }

    private func reply(to piece: LineFramer.Piece, _ answer: IngestStage.Answer?, context: ChannelHandlerContext) {
        switch answer {
        case nil:
            return
        case .welcome(let welcome):
            write(welcome, context: context, essential: true)
        case .rejected(let line, let error):
            let bytes: UnsafeBufferPointer<UInt8>? =
                if case .line(let bytes) = piece { bytes } else { nil }
            counters.recentRejections.add(error, line: bytes, helloApp: stage.helloApp, sender: credentials)
            reject(line, error, context: context)
        case .refuse(let message):
            refuse(message, context: context)
        case .subscribe(let request):
            subscribe(request, context: context)
        }
    }

    private func reject(_ line: UInt64, _ error: WireError, context: ChannelHandlerContext) {
        counters.rejected(error.code)
        write(ServerMessage.error(error, event: line), context: context, essential: stage.acks)
    }

    // MARK: The journal

    private func submitBatch(context: ChannelHandlerContext) {
        guard let (submitted, lines) = stage.takeBatch() else { return }
        let entry = InFlight(firstLine: lines[0], lineNumbers: lines, bytes: submitted.bodies.count)
        inFlight.append(entry)
        pendingBytes += entry.bytes
        counters.received(submitted.count)
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        writer.submit(submitted) { result in
            eventLoop.execute { handler.value.batchDone(result, context: loopContext.value) }
        }
    }

    private func batchDone(_ result: JournalCommit, context: ChannelHandlerContext) {
        let done = inFlight[inFlightHead]
        inFlightHead += 1
        if inFlightHead == inFlight.count {
            inFlight.removeAll(keepingCapacity: true)
            inFlightHead = 0
        }
        pendingBytes -= done.bytes
        if case .failed(let failure) = result {
            let error = WireError(.unavailable, failure.description)
            for line in done.lineNumbers { reject(line, error, context: context) }
        }
        guard context.channel.isActive else { return }
        sendAckIfDue(context: context)
        closeIfDone(context: context)
        flushIfNeeded(context: context)
        resumeReadingIfAllowed(context: context)
    }

    /// The ack covers every line before the oldest batch still waiting for the journal.
    private func sendAckIfDue(context: ChannelHandlerContext) {
        guard stage.acks else { return }
        let handled = inFlightHead < inFlight.count ? inFlight[inFlightHead].firstLine - 1 : stage.lineNumber
        if handled > lastAckSent {
            lastAckSent = handled
            write(ServerMessage.ack(handled), context: context, essential: true)
        }
    }

    private func closeIfDone(context: ChannelHandlerContext) {
        guard inputClosed, !closing, !holding, inFlightHead == inFlight.count, stage.batch.isEmpty else { return }
        closing = true
        sendAckIfDue(context: context)
        flushThenClose(context: context)
    }

    /// Says why the connection is not served, and closes it.
    func refuse(_ message: [UInt8], context: ChannelHandlerContext) {
        write(message, context: context, essential: true)
        closing = true
        flushThenClose(context: context)
    }

    /// Closes once everything written so far has reached the socket.
    private func flushThenClose(context: ChannelHandlerContext) {
        let channel = context.channel
        wroteSinceFlush = false
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    // MARK: Writing

    /// Writes a reply line. Non-essential lines (errors to a client that asked for no acks) are
    /// dropped while the client is not reading, as PROTOCOL.md §4 allows.
    private func write(_ bytes: [UInt8], context: ChannelHandlerContext, essential: Bool) {
        guard context.channel.isActive else { return }
        if !essential && !context.channel.isWritable {
            counters.droppedReply()
            return
        }
        var buffer = context.channel.allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        context.write(wrapOutboundOut(buffer), promise: nil)
        wroteSinceFlush = true
    }

    private func flushIfNeeded(context: ChannelHandlerContext) {
        if wroteSinceFlush {
            wroteSinceFlush = false
            context.flush()
        }
    }
}
