import Foundation
import NIOCore
import NIOEmbedded
import Testing
import WhendConfiguration
import WhendJournal
import WhendRecord
import WhendSystem
import WhendWire

@testable import WhendDaemon
@testable import WhendPluginHost

/// The event connection's handler on its own: NIO's test channel in front of a journal in memory
/// that commits when the test says. What a client sees of framing, acks, half-close,
/// back-pressure, a failed commit and a graceful drain, step by step, without a socket, a disk
/// or a process in between (the real journal under a real daemon: ProtocolTests).
@Suite struct ConnectionHandlerTests {
    /// Counts the reads the handler lets through to the transport.
    final class ReadCounter: ChannelOutboundHandler, @unchecked Sendable {
        // Unchecked: touched on the channel's event loop only.
        typealias OutboundIn = ByteBuffer
        var reads = 0
        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }
    }

    struct Connection {
        let channel: NIOAsyncTestingChannel
        let writer: InMemoryJournal
        let reads: ReadCounter

        /// Sends `text` as one read.
        func send(_ text: String) async throws {
            var buffer = channel.allocator.buffer(capacity: text.utf8.count)
            buffer.writeString(text)
            try await channel.writeInbound(buffer)
        }

        /// The reply lines written so far, waiting up to `seconds` for at least `atLeast` (a
        /// loaded machine can take its time; a passing run does not wait).
        func replies(atLeast: Int = 1, within seconds: Double = 60) async throws -> [String] {
            var lines: [String] = []
            // Counted in polls, not by the clock: while the rest of the suite keeps the
            // cooperative threads busy, this task (and the channel it reads) may not run for a
            // long while, and a deadline by the clock ran out with the ack on its way.
            var polls = Int(seconds / 0.005)
            while lines.count < atLeast && polls > 0 {
                polls -= 1
                if var buffer = try await channel.readOutbound(as: ByteBuffer.self) {
                    let text = buffer.readString(length: buffer.readableBytes) ?? ""
                    lines += text.split(separator: "\n").map(String.init)
                } else {
                    try await Task.sleep(nanoseconds: 5_000_000)
                }
            }
            return lines
        }

        /// Whether the handler closed the connection within `seconds` (a handler that never
        /// closes fails the test instead of hanging it).
        func closes(within seconds: Double = 60) async throws -> Bool {
            var polls = Int(seconds / 0.005)  // in polls, as `replies`
            while channel.isActive && polls > 0 {
                polls -= 1
                try await Task.sleep(nanoseconds: 5_000_000)
            }
            return !channel.isActive
        }

        func close() {}
    }

    func connect(
        _ name: String, startWriter: Bool = true, configure: (inout DaemonConfiguration) -> Void = { _ in }
    ) async throws -> Connection {
        var configuration = DaemonConfiguration(environment: ["HOME": "/nonexistent"])
        configure(&configuration)
        let writer = InMemoryJournal(startWriter ? .automatic : .manual)
        let live = LiveConfiguration(configuration)
        let channel = NIOAsyncTestingChannel()
        let reads = ReadCounter()
        let frozen = configuration
        try await channel.testingEventLoop.executeInContext {
            let handler = EventConnectionHandler(
                writer: writer, live: live, credentials: PeerCredentials(pid: 42, uid: 1000, gid: 1000, comm: "test"),
                connectionID: 1, counters: DaemonMetrics(),
                limiter: SenderRateLimiter(rate: frozen.rateLimit, burst: frozen.rateBurst, by: frozen.rateLimitBy),
                subscribers: SubscriberCount(),
                hub: SubscriptionHub(journal: frozen.journal.directory, committed: { 0 }))
            try channel.pipeline.syncOperations.addHandler(reads)
            try channel.pipeline.syncOperations.addHandler(handler)
        }
        try await channel.connect(to: SocketAddress(unixDomainSocketPath: "/whend-test")).get()
        return Connection(channel: channel, writer: writer, reads: reads)
    }

    static let hello = #"{"hello":{"protocol":1,"app":"a","session":"s","acks":true}}"# + "\n"

    static func events(_ range: ClosedRange<Int>) -> String {
        range.map { #"{"type":"when","name":"e\#($0)"}"# + "\n" }.joined()
    }

    /// A hundred events in one read are stored as one batch and acknowledged by one line.
    @Test func theEventsOfOneReadGetOneAck() async throws {
        let c = try await connect("h-acks")
        defer { c.close() }
        try await c.send(Self.hello + Self.events(1...100))
        let replies = try await c.replies(atLeast: 2)
        #expect(replies.first?.hasPrefix(#"{"welcome":"#) == true)
        #expect(Array(replies.dropFirst()) == [#"{"ack":100}"#], "\(replies)")
        #expect(c.writer.statistics.lastSeq == 100)
    }

    /// After a half-close, the bytes after the last newline are a last event; it is stored and
    /// acknowledged, then the connection closes.
    @Test func aHalfCloseStoresTheLastLineAcksItAndCloses() async throws {
        let c = try await connect("h-half")
        defer { c.close() }
        try await c.send(Self.hello + Self.events(1...2) + #"{"type":"when","name":"last"}"#)
        try await c.channel.testingEventLoop.executeInContext {
            c.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        }
        let replies = try await c.replies(atLeast: 3)
        #expect(replies.last == #"{"ack":3}"#, "\(replies)")
        #expect(try await c.closes(), "the connection stayed open")
        #expect(c.writer.statistics.lastSeq == 3)
    }

    /// A client that asked for acks and does not read them is not read from either: replies
    /// never pile up without bound. Reading resumes when it is writable again.
    @Test func anUnwritableClientIsNotReadFrom() async throws {
        let c = try await connect("h-back")
        defer { c.close() }
        try await c.send(Self.hello)
        _ = try await c.replies(atLeast: 1)
        let before = try await c.channel.testingEventLoop.executeInContext { c.reads.reads }
        c.channel.isWritable = false
        try await c.channel.testingEventLoop.executeInContext { c.channel.read() }
        #expect(try await c.channel.testingEventLoop.executeInContext { c.reads.reads } == before)
        c.channel.isWritable = true
        try await c.channel.testingEventLoop.executeInContext {
            c.channel.pipeline.fireChannelWritabilityChanged()
        }
        #expect(try await c.channel.testingEventLoop.executeInContext { c.reads.reads } == before + 1)
    }

    /// Over its share of pending bytes a connection is not read until the journal has stored
    /// them; then reading resumes and the ack goes out.
    @Test func aConnectionOverItsPendingBytesWaitsForTheJournal() async throws {
        // The writer starts only later: until then the batch stays pending.
        let c = try await connect("h-pend", startWriter: false) { $0.maxPendingBytesPerConnection = 1 }
        defer { c.close() }
        try await c.send(Self.hello + Self.events(1...50))
        func readGoesThrough() async throws -> Bool {
            try await c.channel.testingEventLoop.executeInContext { () -> Bool in
                let before = c.reads.reads
                c.channel.read()
                return c.reads.reads == before + 1
            }
        }
        #expect(try await readGoesThrough() == false, "read while 50 events wait for the journal")
        c.writer.start()
        let replies = try await c.replies(atLeast: 2)
        #expect(replies.last == #"{"ack":50}"#, "\(replies)")
        // The read held back is let through once the batch is stored.
        #expect(try await c.channel.testingEventLoop.executeInContext { c.reads.reads } >= 1)
        #expect(try await readGoesThrough())
    }

    /// A batch the journal cannot store is answered `unavailable`, event by event, with what
    /// the journal said; nothing of it is stored, and the connection carries on: the next batch
    /// is stored and acknowledged once the journal can again.
    @Test func aBatchTheJournalCannotStoreIsRefusedEventByEventAndTheConnectionCarriesOn() async throws {
        let c = try await connect("h-fail", startWriter: false)
        defer { c.close() }
        try await c.send(Self.hello + Self.events(1...3))
        c.writer.fail(with: .cannotStore("No space left on device"))
        c.writer.commit()
        let refused = try await c.replies(atLeast: 5)
        let errors = refused.compactMap { line -> (code: String, line: Int, message: String)? in
            guard let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                let error = o["error"] as? [String: Any], let code = error["code"] as? String,
                let number = error["event"] as? Int
            else { return nil }
            return (code, number, error["message"] as? String ?? "")
        }
        #expect(errors.map(\.code) == ["unavailable", "unavailable", "unavailable"], "\(refused)")
        #expect(errors.map(\.line) == [1, 2, 3], "\(refused)")
        #expect(errors.allSatisfy { $0.message.contains("No space left on device") }, "\(refused)")
        #expect(refused.last == #"{"ack":3}"#, "\(refused)")
        #expect(c.writer.bodies.isEmpty)

        c.writer.fail(with: nil)
        c.writer.start()
        try await c.send(Self.events(4...5))
        let stored = try await c.replies(atLeast: 1)
        #expect(stored.last == #"{"ack":5}"#, "\(stored)")
        #expect(c.writer.bodies.count == 2)
    }

    /// At a graceful stop the connection is drained: what it sent is stored, the last ack goes
    /// out, and it closes.
    @Test func aDrainStoresAcksAndCloses() async throws {
        let c = try await connect("h-drain")
        defer { c.close() }
        try await c.send(Self.hello + Self.events(1...10))
        try await c.channel.testingEventLoop.executeInContext {
            c.channel.pipeline.fireUserInboundEventTriggered(DrainRequest())
        }
        #expect(try await c.closes(), "the connection stayed open")
        let replies = try await c.replies(atLeast: 2)
        #expect(replies.last == #"{"ack":10}"#, "\(replies)")
        #expect(c.writer.statistics.lastSeq == 10)
    }
}
