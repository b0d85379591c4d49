import Foundation
import NIOCore
import NIOPosix
import WhendWire

/// One subscription on whend's event socket (PROTOCOL.md §9), read as lines: the first line
/// sent is `{"subscribe":{…}}`, and whend answers with `subscribed`, records, `caught_up`,
/// `checkpoint`, `gap` or an `error`. Reading waits on the browser: while a page takes nothing,
/// nothing more is read, and whend holds what waits (up to its own bound) for this subscriber
/// alone.
enum UISubscription {
    /// What reading gives: a line from whend (without its newline), or word that nothing came
    /// for `idle` (the caller then checks that its own reader is still there).
    enum Item: Sendable {
        case line(ByteBuffer)
        case idle
    }

    /// Opens a subscription with `request` and hands its lines to `body` until `body` returns
    /// false, whend closes, or `body` throws.
    static func read(
        socket path: String, request: SubscribeRequest, idle: TimeAmount = .seconds(15),
        _ body: (Item) async throws -> Bool
    ) async throws {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(unixDomainSocketPath: path) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(IdleStateHandler(readTimeout: idle))
                    try channel.pipeline.syncOperations.addHandler(LineSplitter())
                    return try NIOAsyncChannel<Item, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: request.line))
            for try await item in inbound {
                guard try await body(item) else { return }
            }
        }
    }

    /// A line from whend, read as `whenctl tail -f` and WhenClient read it; nil for one this
    /// whenctl does not know.
    static func event(_ line: ByteBuffer) -> SubscriptionReader.Event? {
        line.withUnsafeReadableBytes { raw in
            raw.withMemoryRebound(to: UInt8.self) { SubscriptionReader.event($0) }
        }
    }

    /// Cuts whend's bytes into lines, and turns a read timeout into `.idle`.
    private final class LineSplitter: ChannelInboundHandler, @unchecked Sendable {
        // Unchecked: used on its channel's event loop only.
        typealias InboundIn = ByteBuffer
        typealias InboundOut = Item
        private var pending = ByteBuffer()

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var incoming = unwrapInboundIn(data)
            pending.writeBuffer(&incoming)
            while let newline = pending.readableBytesView.firstIndex(of: 0x0A) {
                let length = newline - pending.readerIndex
                guard let line = pending.readSlice(length: length) else { break }
                pending.moveReaderIndex(forwardBy: 1)
                context.fireChannelRead(wrapInboundOut(.line(line)))
            }
            pending.discardReadBytes()
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if event is IdleStateHandler.IdleStateEvent {
                context.fireChannelRead(wrapInboundOut(.idle))
            } else {
                context.fireUserInboundEventTriggered(event)
            }
        }
    }
}
