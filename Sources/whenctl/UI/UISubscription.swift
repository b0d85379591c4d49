import Foundation
import NIOCore
import NIOPosix

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

    /// Opens a subscription with `request` (the members of the `subscribe` object) and hands
    /// its lines to `body` until `body` returns false, whend closes, or `body` throws.
    static func read(
        socket path: String, request: [String: Any], idle: TimeAmount = .seconds(15),
        _ body: (Item) async throws -> Bool
    ) async throws {
        try await read(socket: path, line: try line(request), idle: idle, body)
    }

    /// The first line, `{"subscribe":{…}}`, without its newline.
    static func line(_ request: [String: Any]) throws -> [UInt8] {
        Array(try JSONSerialization.data(withJSONObject: ["subscribe": request], options: [.sortedKeys]))
    }

    static func read(
        socket path: String, line: [UInt8], idle: TimeAmount = .seconds(15), _ body: (Item) async throws -> Bool
    ) async throws {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(unixDomainSocketPath: path) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(IdleStateHandler(readTimeout: idle))
                    try channel.pipeline.syncOperations.addHandler(LineFramer())
                    return try NIOAsyncChannel<Item, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: line + [0x0A]))
            for try await item in inbound {
                guard try await body(item) else { return }
            }
        }
    }

    /// Cuts whend's bytes into lines, and turns a read timeout into `.idle`.
    private final class LineFramer: ChannelInboundHandler, @unchecked Sendable {
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

/// What a line from whend on a subscription is.
enum UISubscriptionLine {
    /// A record, as stored; `seq` its `_seq`.
    case record(seq: UInt64, line: ByteBuffer)
    /// `subscribed`, `caught_up`, `checkpoint`, `gap` or `error`: its key, its object, and the
    /// `_seq` it says the subscriber has seen through (caught_up's and checkpoint's).
    case control(kind: String, object: [String: Any], seenThrough: UInt64?)
    case unreadable

    init(_ line: ByteBuffer) {
        let bytes = line.readableBytesView
        // Records, and only records, begin with {"_seq" (PROTOCOL.md §9).
        if bytes.starts(with: Array(#"{"_seq":"#.utf8)) {
            let digits = bytes.dropFirst(8).prefix { $0 >= 0x30 && $0 <= 0x39 }
            if let seq = UInt64(String(decoding: digits, as: UTF8.self)) {
                self = .record(seq: seq, line: line)
                return
            }
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any],
            object.count == 1, let (kind, value) = object.first
        else {
            self = .unreadable
            return
        }
        let inner = value as? [String: Any] ?? [:]
        let seen = (kind == "caught_up" || kind == "checkpoint") ? (inner["seq"] as? NSNumber)?.uint64Value : nil
        self = .control(kind: kind, object: inner, seenThrough: seen)
    }
}
