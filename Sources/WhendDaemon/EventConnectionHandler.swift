import Foundation
import NIOCore
import WhendJournal
import WhendWire

/// Asks a connection to finish: read nothing more, wait for the journal, send the final ack,
/// close. Sent through the pipeline at a graceful stop.
struct DrainRequest {}

/// One app's connection to the event socket (PROTOCOL.md §2–§6), from bytes to acks.
///
/// Reading a chunk: the framer cuts lines; each is scanned and validated in place; valid events
/// are encoded as record bodies into one batch, invalid ones answered with an error at once. At
/// the end of the read the batch goes to the journal writer. When the writer reports it stored,
/// the ack moves forward to the last line before the oldest batch still in flight.
final class EventConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private struct InFlight {
        var firstLine: UInt64
        var lineNumbers: [UInt64]
        var bytes: Int
    }

    private let writer: JournalWriter
    private let live: LiveConfiguration
    private var configuration: DaemonConfiguration
    private var generation: Int
    private let counters: DaemonMetrics
    private let limiter: SenderRateLimiter
    private let credentials: PeerCredentials
    private let connectionID: UInt64
    private var framer: LineFramer
    private var encoder: RecordEncoder
    private var ingest: PluginChain
    /// The record as ingest middleware sees it: `{` and the body.
    private var ingestRecord: [UInt8] = []

    private var members: [EventMember] = []
    private var sawFirstLine = false
    private var acks = false
    private var lineNumber: UInt64 = 0
    private var lastAckSent: UInt64 = 0
    private var inFlight: [InFlight] = []
    private var inFlightHead = 0
    private var pendingBytes = 0
    private var batch = JournalBatch()
    private var batchLines: [UInt64] = []
    private var inputClosed = false
    private var closing = false
    private var readPending = false
    private var wroteSinceFlush = false

    init(
        writer: JournalWriter, live: LiveConfiguration, credentials: PeerCredentials, connectionID: UInt64,
        counters: DaemonMetrics, limiter: SenderRateLimiter
    ) {
        self.writer = writer
        self.live = live
        self.generation = live.generation
        self.configuration = live.current
        self.ingest = live.ingest
        self.counters = counters
        self.limiter = limiter
        self.credentials = credentials
        self.connectionID = connectionID
        // The line limit stays what the welcome told this client; new connections take up a
        // changed max_event_bytes.
        self.framer = LineFramer(maxLineBytes: configuration.maxEventBytes)
        self.encoder = RecordEncoder(credentials: credentials)
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        guard !closing else { return }
        if live.generation != generation {
            generation = live.generation
            let lineLimit = configuration.maxEventBytes
            configuration = live.current
            configuration.maxEventBytes = lineLimit
            ingest = live.ingest
        }
        counters.add(bytesIn: buffer.readableBytes)
        // A fresh batch grows to about the size of what was read plus the trusted fields:
        // reserve that once instead of doubling its way there.
        if batch.isEmpty && batch.bodies.capacity == 0 {
            let expected = buffer.readableBytes + buffer.readableBytes / 2
            batch.bodies.reserveCapacity(expected)
            batch.ends.reserveCapacity(expected / 128)
            batchLines.reserveCapacity(expected / 128)
        }
        // One `_rt` for everything in this read: it all arrived at the same moment.
        let received = encoder.stampReceived()
        batch.minReceivedMicros = min(batch.minReceivedMicros, received)
        batch.maxReceivedMicros = max(batch.maxReceivedMicros, received)
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
        guard !inputClosed, !closing else { return false }
        if pendingBytes >= configuration.maxPendingBytesPerConnection { return false }
        if acks && !context.channel.isWritable { return false }
        if writer.pendingBytes >= configuration.maxPendingBytes {
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
        switch piece {
        case .tooLarge(let length):
            sawFirstLine = true
            lineNumber += 1
            reject(
                lineNumber,
                WireError(
                    .tooLarge,
                    "the line is \(length) bytes; the limit is \(configuration.maxEventBytes) (max_event_bytes); split the event or move bulk data out of it"
                ), context: context)
        case .line(let bytes):
            let scanned: ScannedLine
            do {
                scanned = try EventScanner.scan(bytes, helloAllowed: !sawFirstLine, reusing: &members)
            } catch {
                if error.isAboutConnection {
                    // A hello we cannot honour: say why and close, rather than guess its settings.
                    write(ServerMessage.error(error, event: nil), context: context, essential: true)
                    closing = true
                    flushThenClose(context: context)
                    return
                }
                sawFirstLine = true
                lineNumber += 1
                reject(lineNumber, error, context: context)
                return
            }
            switch scanned {
            case .empty:
                return
            case .hello(let hello):
                sawFirstLine = true
                acks = hello.acks
                encoder = encoder.with(hello: hello)
                write(
                    ServerMessage.welcome(
                        server: "whend/\(WhendVersion.current)", maxEventBytes: configuration.maxEventBytes),
                    context: context, essential: true)
            case .event(let event):
                sawFirstLine = true
                lineNumber += 1
                guard
                    configuration.rateLimit <= 0
                        || limiter.take(credentials: credentials, connection: connectionID)
                else {
                    reject(
                        lineNumber,
                        WireError(
                            .rateLimited,
                            "over the limit of \(Settings.number(configuration.rateLimit)) events/s per \(configuration.rateLimitBy.rawValue) (burst \(Settings.number(configuration.rateBurst))); the event was not stored; slow down and send it again"
                        ), context: context)
                    return
                }
                let bodyStart = batch.bodies.count
                let key = encoder.appendBody(of: event, line: bytes, to: &batch.bodies)
                if !ingest.isEmpty && !passIngest(bodyFrom: bodyStart, context: context) { return }
                batch.ends.append(batch.bodies.count)
                if let key { batch.keys.append((batch.ends.count - 1, key)) }
                batchLines.append(lineNumber)
            }
        }
    }

    /// Runs the record just encoded at `bodyFrom` through the ingest middleware. Returns false
    /// when it is not to be stored (dropped, or rejected with an answer to the client).
    private func passIngest(bodyFrom start: Int, context: ChannelHandlerContext) -> Bool {
        ingestRecord.removeAll(keepingCapacity: true)
        ingestRecord.append(UInt8(ascii: "{"))
        ingestRecord.append(contentsOf: batch.bodies[start...])
        let outcome = ingestRecord.withUnsafeBufferPointer { ingest.run($0) }
        switch outcome {
        case .unchanged:
            return true
        case .changed(let output):
            do {
                let body = try output.withUnsafeBufferPointer { out in
                    try ingestRecord.withUnsafeBufferPointer { original in
                        try IngestRewrite.body(output: out, original: original)
                    }
                }
                batch.bodies.removeSubrange(start...)
                batch.bodies.append(contentsOf: body)
                return true
            } catch {
                batch.bodies.removeSubrange(start...)
                reject(
                    lineNumber,
                    WireError(.rejected, "an ingest plugin changed the event into something invalid: \(error)"),
                    context: context)
                return false
            }
        case .dropped:
            batch.bodies.removeSubrange(start...)
            return false
        case .rejected(let message):
            batch.bodies.removeSubrange(start...)
            reject(lineNumber, WireError(.rejected, message), context: context)
            return false
        }
    }

    private func reject(_ line: UInt64, _ error: WireError, context: ChannelHandlerContext) {
        counters.rejected(error.code)
        write(ServerMessage.error(error, event: line), context: context, essential: acks)
    }

    // MARK: The journal

    private func submitBatch(context: ChannelHandlerContext) {
        guard !batch.isEmpty else { return }
        let submitted = batch
        let entry = InFlight(firstLine: batchLines[0], lineNumbers: batchLines, bytes: submitted.bodies.count)
        batch = JournalBatch()
        batchLines = []
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
        if case .failed(let message) = result {
            let error = WireError(.unavailable, message)
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
        guard acks else { return }
        let handled = inFlightHead < inFlight.count ? inFlight[inFlightHead].firstLine - 1 : lineNumber
        if handled > lastAckSent {
            lastAckSent = handled
            write(ServerMessage.ack(handled), context: context, essential: true)
        }
    }

    private func closeIfDone(context: ChannelHandlerContext) {
        guard inputClosed, !closing, inFlightHead == inFlight.count, batch.isEmpty else { return }
        closing = true
        sendAckIfDue(context: context)
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
