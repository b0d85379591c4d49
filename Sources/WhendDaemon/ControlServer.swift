import Foundation
import Logging
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendControl
import WhendPluginHost
import WhendWire

/// The control socket: one request line of JSON in (`ControlRequest`), one answer line of JSON
/// out (`ControlAnswer`), then the daemon closes. Only root and the daemon's own user may use
/// it: the peer's credentials are checked (SO_PEERCRED), not only the file's mode.
final class ControlConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var request: [UInt8] = []
    private var answered = false
    private let respond: @Sendable (ControlRequest) -> ControlAnswer
    /// The answer to whatever is asked, for a peer that may not control whend.
    private let refusal: ControlAnswer?

    init(respond: @escaping @Sendable (ControlRequest) -> ControlAnswer) {
        self.respond = respond
        refusal = nil
    }

    init(refusing why: String) {
        respond = { _ in .refused(why) }
        refusal = .refused(why)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        let buffer = unwrapInboundIn(data)
        request.append(contentsOf: buffer.readableBytesView)
        if let newline = request.firstIndex(of: 0x0A) {
            answer(Array(request[..<newline]), context: context)
        } else if request.count > ControlProtocol.maxRequestBytes {
            reply(
                .refused("the request is over \(ControlProtocol.maxRequestBytes) bytes; send one line of JSON"),
                context: context)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed, !answered {
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
        if let refusal {
            reply(refusal, context: context)
            return
        }
        let request: ControlRequest
        do { request = try ControlRequest.decode(line) } catch {
            reply(.refused(error.description), context: context)
            return
        }
        let respond = self.respond
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
        let bytes = answer.encoded()
        var buffer = context.channel.allocator.buffer(capacity: bytes.count + 1)
        buffer.writeBytes(bytes)
        buffer.writeInteger(UInt8(0x0A))
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }
}
