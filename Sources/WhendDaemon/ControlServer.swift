import Foundation
import Logging
import NIOCore
import NIOPosix
import WhendConfiguration
import WhendPluginHost
import WhendWire

/// The control socket: one request line of JSON in (`{"command":"status"}`), one reply line of
/// JSON out, then the daemon closes. Only root and the daemon's own user may use it: the peer's
/// credentials are checked (SO_PEERCRED), not only the file's mode.
final class ControlConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// A request longer than this is refused: the commands are short.
    static let maxRequestBytes = 64 << 10

    private var request: [UInt8] = []
    private var answered = false
    private let respond: @Sendable ([UInt8]) -> [UInt8]

    init(respond: @escaping @Sendable ([UInt8]) -> [UInt8]) {
        self.respond = respond
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        let buffer = unwrapInboundIn(data)
        request.append(contentsOf: buffer.readableBytesView)
        if let newline = request.firstIndex(of: 0x0A) {
            answer(Array(request[..<newline]), context: context)
        } else if request.count > Self.maxRequestBytes {
            reply(
                ControlReply.failure("the request is over \(Self.maxRequestBytes) bytes; send one line of JSON"),
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
        let respond = self.respond
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        DispatchQueue.global().async {
            let bytes = respond(line)
            eventLoop.execute { handler.value.reply(bytes, context: loopContext.value) }
        }
    }

    private func reply(_ bytes: [UInt8], context: ChannelHandlerContext) {
        answered = true
        var buffer = context.channel.allocator.buffer(capacity: bytes.count + 1)
        buffer.writeBytes(bytes)
        buffer.writeInteger(UInt8(0x0A))
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }
}

/// Replies of the control socket, as JSON lines.
enum ControlReply {
    static func encode(_ object: [String: Any]) -> [UInt8] {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return Array(#"{"ok":false,"error":"the reply could not be encoded"}"#.utf8)
        }
        return Array(data)
    }

    static func failure(_ message: String) -> [UInt8] { encode(["ok": false, "error": message]) }
}
