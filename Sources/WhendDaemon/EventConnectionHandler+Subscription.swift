import CLinux
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import WhendJournal
import WhendWire

extension EventConnectionHandler {
    /// The first line asked for a subscription (PROTOCOL.md §9): whoever may, up to
    /// `max_subscribers`, gets one; anyone else is told why and closed.
    func subscribe(_ request: SubscribeRequest, context: ChannelHandlerContext) {
        let configuration = live.current
        let channel = context.channel
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        // The supplementary groups only when they decide, as the kernel took them at connect().
        let mayNeedGroups =
            credentials.uid != 0 && credentials.uid != geteuid() && !configuration.subscribeGroup.isEmpty
        let groups: EventLoopFuture<[UInt32]?> =
            mayNeedGroups
            ? Self.peerGroups(channel) : context.eventLoop.makeSucceededFuture(nil)
        // Nothing more is read from a subscriber: what it sends after its first line is ignored.
        subscribing = true
        groups.whenComplete { result in
            let handler = handler.value
            let context = loopContext.value
            let supplementary = (try? result.get()) ?? nil
            if let why = SubscriberAccess.refusal(
                uid: handler.credentials.uid, gid: handler.credentials.gid, supplementary: supplementary,
                group: configuration.subscribeGroup)
            {
                handler.refuse(
                    ServerMessage.error(WireError(.forbidden, why, isAboutConnection: true), event: nil),
                    context: context)
                return
            }
            if case .after(let seq) = request.start, seq > handler.writer.statistics.lastSeq {
                // A _seq this journal never acknowledged: another journal's, or one lost with
                // its tail (durability = none). Waiting for it would skip every record up to it.
                let last = handler.writer.statistics.lastSeq
                handler.refuse(
                    ServerMessage.error(
                        WireError(
                            .invalidField,
                            "subscribe \"after\" is \(seq), past the last _seq this journal holds (\(last)): is it another whend's? Resume with \"after\":\(last), or \"from\":\"oldest\"",
                            isAboutConnection: true), event: nil), context: context)
                return
            }
            guard handler.subscribers.take(limit: configuration.maxSubscribers) else {
                handler.refuse(
                    ServerMessage.error(
                        WireError(
                            .unavailable,
                            "whend has \(configuration.maxSubscribers) subscriptions open, its max_subscribers; try again later",
                            isAboutConnection: true), event: nil), context: context)
                return
            }
            guard channel.isActive else {
                handler.subscribers.release()
                return
            }
            let writer = handler.writer
            let subscribers = handler.subscribers
            let live = handler.live
            let credentials = handler.credentials
            let checkedAt = NIOLockedValueBox((generation: live.generation, group: configuration.subscribeGroup))
            let subscription = Subscription(
                request, journal: configuration.journal.directory, hub: handler.hub,
                committed: { writer.statistics.lastSeq },
                channel: channel,
                revoked: {
                    // A reload that changes subscribe_group applies to open subscriptions too.
                    let generation = live.generation
                    let group: String? = checkedAt.withLockedValue { seen in
                        guard seen.generation != generation else { return nil }
                        let group = live.current.subscribeGroup
                        defer { seen = (generation, group) }
                        return group == seen.group ? nil : group
                    }
                    guard let group else { return nil }
                    return SubscriberAccess.refusal(
                        uid: credentials.uid, gid: credentials.gid, supplementary: supplementary, group: group
                    ).map { "subscribe_group is now \(group.isEmpty ? "unset" : group): \($0)" }
                },
                onEnd: { subscribers.release() })
            handler.subscription = subscription
            subscription.start()
        }
    }

    /// The peer's supplementary groups (SO_PEERGROUPS); nil if the kernel would not say.
    private static func peerGroups(_ channel: Channel) -> EventLoopFuture<[UInt32]?> {
        guard let provider = channel as? SocketOptionProvider else { return channel.eventLoop.makeSucceededFuture(nil) }
        let groups: EventLoopFuture<whend_peer_groups> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(whend_so_peergroups))
        return groups.map { list -> [UInt32]? in
            withUnsafeBytes(of: list.groups) { Array($0.bindMemory(to: UInt32.self)) }
        }.recover { _ in nil }
    }
}
