import Dispatch
import Foundation
import WhendWire

/// whend's records as they are stored, from where a program asks and then live (PROTOCOL.md
/// §9): for tools, dashboards and tests that watch what apps send.
///
/// ```swift
/// for try await element in WhendSubscription(.init(start: .after(lastSeq), types: ["when"])) {
///     if case .record(let seq, let json) = element { handle(json); lastSeq = seq }
/// }
/// ```
///
/// Reading is pulled: nothing is read from whend until the loop asks, and whend never holds its
/// apps for a subscriber that lags. One that takes nothing for long is disconnected
/// (`Refused`, code `too_slow`) and resumes with `.after` the last `_seq` it saw — a record's,
/// a checkpoint's or the caught-up one's — which gives every record exactly once.
public struct WhendSubscription: AsyncSequence, Sendable {
    public struct Request: Sendable {
        public enum Start: Sendable {
            /// Records committed from now on.
            case now
            /// Every record the journal still holds.
            case oldest
            /// Records after this `_seq`.
            case after(UInt64)
            /// Records received at or after this time.
            case since(Date)
        }

        public var start: Start
        public var app: String?
        public var session: String?
        /// Record types: `when`, `screen`, … or a derived one such as `screen_time`.
        public var types: [String]
        /// `when` event names.
        public var names: [String]
        /// Only records a pipeline derived (true), or only apps' events (false).
        public var derived: Bool?
        public var pipeline: String?

        public init(
            start: Start = .now, app: String? = nil, session: String? = nil, types: [String] = [],
            names: [String] = [], derived: Bool? = nil, pipeline: String? = nil
        ) {
            self.start = start
            self.app = app
            self.session = session
            self.types = types
            self.names = names
            self.derived = derived
            self.pipeline = pipeline
        }

        var wire: SubscribeRequest {
            var r = SubscribeRequest()
            switch start {
            case .now: r.start = .now
            case .oldest: r.start = .oldest
            case .after(let seq): r.start = .after(seq)
            case .since(let date): r.start = .since(Int64(date.timeIntervalSince1970 * 1_000_000))
            }
            r.app = app.map { Array($0.utf8) }
            r.session = session.map { Array($0.utf8) }
            r.types = types
            r.names = names
            r.derived = derived
            r.pipeline = pipeline.map { Array($0.utf8) }
            return r
        }
    }

    public enum Element: Sendable, Equatable {
        /// A record as the journal stores it (one JSON object, UTF-8).
        case record(seq: UInt64, json: Data)
        /// Everything stored through `seq` was sent: records from here on are live.
        case caughtUp(seq: UInt64)
        /// Every record through `seq` was examined (the filters skipped the rest).
        case checkpoint(seq: UInt64)
        /// Records `from`…`through` were deleted by retention before they could be sent.
        case gap(from: UInt64, through: UInt64)
    }

    /// whend refused the subscription, or ended it: its error code and why.
    public struct Refused: Error, Sendable, CustomStringConvertible {
        public var code: String
        public var message: String
        public var description: String { "\(code): \(message)" }
    }

    public let request: Request
    /// The event socket; nil for the one WhenClient finds (PROTOCOL.md §1).
    public let socketPath: String?

    public init(_ request: Request = Request(), socketPath: String? = nil) {
        self.request = request
        self.socketPath = socketPath
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(request.wire, path: socketPath ?? SocketLocation.eventSocket())
    }

    /// Reads on a queue of its own, one element each time it is asked.
    public final class Iterator: AsyncIteratorProtocol, @unchecked Sendable {
        // Unchecked: `reader` and `failure` are touched only on `queue`, one read at a time.
        private let queue = DispatchQueue(label: "whend-subscription")
        private let request: SubscribeRequest
        private let path: String
        private var reader: SubscriptionReader?
        private var finished = false

        init(_ request: SubscribeRequest, path: String) {
            self.request = request
            self.path = path
        }

        deinit {
            let reader = self.reader
            queue.async { reader?.close() }
        }

        public func next() async throws -> Element? {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Element?, Error>) in
                queue.async { [self] in
                    do {
                        continuation.resume(returning: try read())
                    } catch {
                        finished = true
                        continuation.resume(throwing: error)
                    }
                }
            }
        }

        private func read() throws -> Element? {
            guard !finished else { return nil }
            if reader == nil { reader = try SubscriptionReader(path: path, request: request) }
            while let event = try reader?.next() {
                switch event {
                case .subscribed: continue
                case .record(let seq, let line): return .record(seq: seq, json: Data(line))
                case .caughtUp(let seq): return .caughtUp(seq: seq)
                case .checkpoint(let seq): return .checkpoint(seq: seq)
                case .gap(let from, let through): return .gap(from: from, through: through)
                case .error(let code, let message): throw Refused(code: code, message: message)
                }
            }
            finished = true
            return nil
        }
    }
}
