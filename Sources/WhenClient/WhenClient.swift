import Foundation
import WhendWire

/// Emits events to whend without ever making the app wait.
///
/// `emit` encodes the event on the caller's thread and appends it to a bounded in-memory queue,
/// and returns: whatever the daemon's state, it never waits on I/O. A background thread
/// connects (hello, acks), sends what is queued, and forgets each event only once an ack covers
/// it. When the connection breaks it reconnects with backoff and sends again what was not
/// acknowledged; every event carries an `id`, so the daemon stores it once however often it is
/// sent. Events the daemon could not store for now (`unavailable`, `rate_limited`) are sent
/// again after a backoff; events it refused for good (a bad field) are counted in `refused`.
///
/// When the queue is full, new events are dropped and counted. As soon as the daemon can be
/// told, the client sends one `when` event named `whenClientDroppedEvents` with
/// `params.count` (how many), `params.since` (when the first of them was dropped) and
/// `params.queueCapacity`, and the count starts again from zero.
public final class WhenClient: Sendable {
    public struct Configuration: Sendable {
        /// The event socket; nil: `$WHEND_SOCKET`, else the usual places (PROTOCOL.md §1).
        public var socketPath: String?
        public var app: String
        public var session: String
        /// The user, for analytics; sent on every event when set.
        public var user: String?
        /// Events kept until acknowledged; beyond it new events are dropped and counted.
        public var queueCapacity: Int = 10_000
        /// The same bound in bytes of encoded events.
        public var queueCapacityBytes: Int = 16 << 20
        /// The longest wait between two connection attempts.
        public var maxBackoff: TimeInterval = 5

        public init(app: String, session: String = UUID().uuidString, socketPath: String? = nil) {
            self.app = app
            self.session = session
            self.socketPath = socketPath
        }
    }

    public let configuration: Configuration
    private let delivery: Delivery

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        delivery = Delivery(configuration)
        // The thread owns the delivery, not the client: releasing the client stops it.
        let delivery = self.delivery
        let thread = Thread { delivery.run() }
        thread.name = "whenclient"
        thread.start()
    }

    deinit { delivery.stop() }

    /// Queues one event (a JSON object as PROTOCOL.md §6 describes it: strings, numbers, bools,
    /// arrays, objects). Adds `id` and `ts` (the client's clock) unless given, and `user` when
    /// configured. Never waits on I/O. Returns false if the event was dropped: the queue was
    /// full (counted and later reported), or the value has no JSON form.
    @discardableResult
    public func emit(_ event: [String: Any]) -> Bool {
        guard let line = line(for: event) else { return false }
        return delivery.enqueue(line)
    }

    /// The line `emit` would queue for `event`: with `id`, `ts`, `user` and `session` added,
    /// encoded. Nil when a value has no JSON form.
    public func line(for event: [String: Any]) -> [UInt8]? {
        let session = delivery.session
        return try? EventEncoding.line(
            event,
            extra: [
                "id": event["id"] == nil ? delivery.nextID() : nil,
                "ts": event["ts"] == nil ? EventEncoding.timestamp() : nil,
                "user": configuration.user, "session": session.isEmpty ? nil : session,
            ])
    }

    public func emit(_ lifecycle: ScreenLifecycleEvent) {
        var event: [String: Any] = [
            "type": "lifecycle", "screen": lifecycle.screen, "status": lifecycle.status.rawValue,
        ]
        if lifecycle.isBeingPresentedInitially { event["isBeingPresentedInitially"] = true }
        if lifecycle.isBeingRemovedIndefinitely { event["isBeingRemovedIndefinitely"] = true }
        emit(event)
    }

    /// The session events are stamped with from now on (`emit` adds it unless the event has
    /// one). Starts as the configuration's; apps start a new one after, say, a long pause.
    public var session: String {
        get { delivery.session }
        set { delivery.session = newValue }
    }

    /// What the client has done since it started.
    public struct Statistics: Sendable, Equatable {
        /// Events accepted by `emit` into the queue.
        public var enqueued = 0
        /// Events the daemon acknowledged (stored, or refused for good).
        public var delivered = 0
        /// Events dropped because the queue was full.
        public var dropped = 0
        /// Events the daemon refused for good.
        public var refused = 0

        public init() {}
    }

    public var statistics: Statistics { delivery.statistics }

    /// Why the client cannot deliver right now (the daemon is not running, refused the hello,
    /// …), or nil while it delivers. For an app's diagnostics; the client keeps trying.
    public var lastProblem: String? { delivery.lastProblem }

    /// Events waiting for an ack, and events dropped since the daemon was last told.
    public var pending: (queued: Int, dropped: Int) { delivery.pending }

    /// How many events the daemon refused for good (each answered with an error such as
    /// `invalid_field`); they are not sent again.
    public var refused: Int { delivery.statistics.refused }

    /// Waits until every queued event is acknowledged (and any drop count reported), or the
    /// timeout passes. For an app's shutdown. Returns true when all is delivered.
    @discardableResult
    public func flush(timeout: TimeInterval) -> Bool { delivery.flush(timeout: timeout) }
}

/// The queue and the background connection behind a `WhenClient`.
final class Delivery: @unchecked Sendable {
    // Unchecked: every mutable field is guarded by `condition`.
    private let configuration: WhenClient.Configuration
    private let condition = NSCondition()
    /// Encoded event lines not yet acknowledged, oldest first (the first `inFlight` are sent).
    private var queue: [[UInt8]] = []
    private var queueHead = 0
    private var queuedBytes = 0
    private var dropped = 0
    private var droppedSince: String?
    private var stopped = false
    private var idCounter: UInt64 = 0
    private var totals = WhenClient.Statistics()
    private let idPrefix = String(UInt64.random(in: 0...UInt64.max), radix: 36) + "-"
    /// Lines sent and not yet acknowledged at most (the sender thread's alone). It shrinks to
    /// what got through when the daemon asks to retry later, and grows again with every ack,
    /// so that a rate-limited client does not send its whole queue again and again.
    private var window = Delivery.maxWindow
    static let maxWindow = 4096

    private var currentSession: String

    init(_ configuration: WhenClient.Configuration) {
        self.configuration = configuration
        currentSession = configuration.session
    }

    var session: String {
        get { condition.withLock { currentSession } }
        set { condition.withLock { currentSession = newValue } }
    }

    func nextID() -> String {
        condition.lock()
        idCounter += 1
        let n = idCounter
        condition.unlock()
        return idPrefix + String(n, radix: 36)
    }

    func enqueue(_ line: [UInt8]) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard queue.count - queueHead < configuration.queueCapacity,
            queuedBytes + line.count <= configuration.queueCapacityBytes
        else {
            if dropped == 0 { droppedSince = EventEncoding.timestamp() }
            dropped += 1
            totals.dropped += 1
            return false
        }
        totals.enqueued += 1
        queue.append(line)
        queuedBytes += line.count
        condition.signal()
        return true
    }

    var pending: (queued: Int, dropped: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (queue.count - queueHead, dropped)
    }

    var statistics: WhenClient.Statistics { condition.withLock { totals } }

    private var problem: String?
    var lastProblem: String? { condition.withLock { problem } }
    private func noteProblem(_ text: String?) { condition.withLock { problem = text } }

    func flush(timeout: TimeInterval) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while queue.count > queueHead || dropped > 0 {
            if !condition.wait(until: deadline) { return queue.count == queueHead && dropped == 0 }
        }
        return true
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
    }

    private var isStopped: Bool {
        condition.lock()
        defer { condition.unlock() }
        return stopped
    }

    // MARK: The sender thread

    func run() {
        let initialBackoff = 0.05
        var backoff = initialBackoff
        while !isStopped {
            let path = configuration.socketPath ?? SocketLocation.eventSocket()
            do {
                // Events go to no socket another user could have put in /tmp/whend-$UID.
                if let refusal = SocketLocation.refusalToConnect(path) { throw WhenClientRefusal(reason: refusal) }
                let connection = try BlockingSocket(path: path)
                switch deliver(over: connection) {
                case .closed: backoff = initialBackoff
                case .noWelcome, .retryLater(progressed: false): break
                // Some got through (a rate limit): pause briefly and go on at that pace.
                case .retryLater(progressed: true): backoff = initialBackoff
                case .stopped: return
                }
            } catch {
                noteProblem("\(error)")
            }
            // Disconnected or never connected: everything in flight goes again, in order.
            condition.lock()
            if !stopped { _ = condition.wait(until: Date().addingTimeInterval(backoff)) }
            condition.unlock()
            backoff = min(configuration.maxBackoff, backoff * 2)
        }
    }

    private enum End {
        /// The connection broke after a welcome: reconnect at once.
        case closed
        /// Connected, but no daemon answered the hello.
        case noWelcome
        /// The daemon could not store an event for now: reconnect after a backoff, send it again.
        case retryLater(progressed: Bool)
        case stopped
    }

    private enum SentLine {
        case event
        case dropReport(Int)
    }

    /// One connection's life: hello, then send and read acks until it breaks.
    private func deliver(over connection: BlockingSocket) -> End {
        // Empty means "not set": the daemon then uses the process name (app) or none (session).
        var hello: [String: Any] = ["protocol": 1, "acks": true]
        if !configuration.app.isEmpty { hello["app"] = configuration.app }
        if !configuration.session.isEmpty { hello["session"] = configuration.session }
        guard let helloLine = try? EventEncoding.line(["hello": hello]), (try? connection.send(helloLine)) != nil else {
            noteProblem("the daemon closed the connection before the hello")
            return .noWelcome
        }
        var reader = LineReader()
        guard let welcome = reader.next(from: connection, timeout: 5), welcome.contains("\"welcome\"") else {
            noteProblem("the daemon did not welcome the hello: \(reader.lastLine ?? "no answer within 5 s")")
            return .noWelcome
        }
        noteProblem(nil)
        // What was sent on this connection and not yet acknowledged, in line order; line
        // numbers count from 1 on each connection (PROTOCOL.md §4).
        var unacked: [SentLine] = []
        var acknowledgedLines = 0
        var inFlight = 0
        var reportInFlight = false
        // The first line the daemon could not store for now: nothing from it on is released.
        var retryFrom: Int?
        while true {
            var batch: [UInt8] = []
            condition.lock()
            if stopped {
                condition.unlock()
                return .stopped
            }
            if retryFrom == nil {
                let newOnes = max(0, min(queue.count - queueHead - inFlight, 512, window - unacked.count))
                for i in 0..<newOnes {
                    batch += queue[queueHead + inFlight + i]
                    unacked.append(.event)
                }
                inFlight += newOnes
                if !reportInFlight && dropped > 0 {
                    let report: [String: Any] = [
                        "type": "when", "name": "whenClientDroppedEvents", "ts": EventEncoding.timestamp(),
                        "params": [
                            "count": dropped, "since": droppedSince ?? "", "queueCapacity": configuration.queueCapacity,
                        ] as [String: Any],
                    ]
                    if let line = try? EventEncoding.line(report) {
                        batch += line
                        unacked.append(.dropReport(dropped))
                        reportInFlight = true
                    }
                }
            }
            condition.unlock()
            if !batch.isEmpty {
                guard (try? connection.send(batch)) != nil else { return .closed }
            }
            // Read what the daemon says: wait a little for acks, or for new events to send.
            guard let line = reader.next(from: connection, timeout: unacked.isEmpty ? 0.02 : 1) else {
                if reader.closed { return .closed }
                if unacked.isEmpty { waitForEvents(0.05) }
                continue
            }
            if let ack = Self.number(after: #""ack":"#, in: line), ack > acknowledgedLines {
                // Lines up to the first one to retry are done; the rest stay queued.
                let upTo = min(ack, (retryFrom ?? Int.max) - 1)
                if upTo > acknowledgedLines {
                    let done = unacked.prefix(upTo - acknowledgedLines)
                    unacked.removeFirst(done.count)
                    acknowledgedLines = upTo
                    var events = 0
                    var reported = 0
                    for line in done {
                        switch line {
                        case .event: events += 1
                        case .dropReport(let n): reported += n
                        }
                    }
                    if reported > 0 { reportInFlight = false }
                    inFlight -= events
                    window = min(Self.maxWindow, window + done.count)
                    release(events: events, dropsReported: reported)
                }
                if let retryFrom, ack >= retryFrom {
                    let passed = retryFrom - 1
                    window = max(8, passed)
                    return .retryLater(progressed: passed > 0)
                }
            } else if line.contains(#""error""#) {
                let code = Self.string(after: #""code":""#, in: line)
                if code == "unavailable" || code == "rate_limited" {
                    if let event = Self.number(after: #""event":"#, in: line) {
                        retryFrom = min(retryFrom ?? event, event)
                    }
                } else if Self.number(after: #""event":"#, in: line) != nil {
                    condition.withLock { totals.refused += 1 }
                } else {
                    // An error about the connection itself (unsupported protocol …): start again.
                    noteProblem("the daemon refused the connection: \(line)")
                    return .retryLater(progressed: false)
                }
            }
        }
    }

    /// Forgets acknowledged events (the oldest in the queue) and reported drops.
    private func release(events: Int, dropsReported: Int) {
        condition.lock()
        for i in queueHead..<(queueHead + events) { queuedBytes -= queue[i].count }
        queueHead += events
        totals.delivered += events
        dropped -= dropsReported
        if dropped == 0 { droppedSince = nil }
        if queueHead > 4096 && queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
        condition.broadcast()
        condition.unlock()
    }

    private func waitForEvents(_ seconds: TimeInterval) {
        condition.lock()
        if queue.count - queueHead == 0 && dropped == 0 && !stopped {
            _ = condition.wait(until: Date().addingTimeInterval(seconds))
        }
        condition.unlock()
    }

    static func number(after key: String, in line: String) -> Int? {
        guard let range = line.range(of: key) else { return nil }
        return Int(line[range.upperBound...].prefix { $0.isNumber })
    }

    static func string(after key: String, in line: String) -> String? {
        guard let range = line.range(of: key) else { return nil }
        return String(line[range.upperBound...].prefix { $0 != "\"" })
    }
}

/// Reads lines from a blocking socket with a timeout (poll), keeping what follows.
struct LineReader {
    private var framer = LineFramer(maxLineBytes: BlockingSocket.maxAnswerBytes)
    /// Lines received and not returned yet, oldest first.
    private var pending: [String] = []
    private(set) var closed = false
    /// The last line returned, for diagnostics.
    private(set) var lastLine: String?

    mutating func next(from connection: BlockingSocket, timeout: TimeInterval) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if !pending.isEmpty {
                let line = pending.removeFirst()
                lastLine = line
                return line
            }
            guard !closed else { return nil }
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { return nil }
            guard connection.waitReadable(timeout: remaining) else { return nil }
            guard let bytes = try? connection.receive(), !bytes.isEmpty else {
                closed = true
                return nil
            }
            var lines: [String] = []
            bytes.withUnsafeBufferPointer {
                framer.feed($0) { if case .line(let line) = $0 { lines.append(String(decoding: line, as: UTF8.self)) } }
            }
            pending += lines
        }
    }
}

/// Why the client would not connect to a socket.
struct WhenClientRefusal: Error, CustomStringConvertible {
    var reason: String
    var description: String { reason }
}
