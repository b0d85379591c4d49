import Foundation

extension SubscribeRequest {
    /// The request as its first line (PROTOCOL.md §9), `\n` included.
    package var line: [UInt8] {
        var members: [String] = []
        func string(_ bytes: [UInt8]) -> String {
            var out: [UInt8] = []
            appendJSONString(bytes, to: &out)
            return String(decoding: out, as: UTF8.self)
        }
        func list(_ values: [String]) -> String {
            "[" + values.map { string(Array($0.utf8)) }.joined(separator: ",") + "]"
        }
        switch start {
        case .now: members.append(#""from":"now""#)
        case .oldest: members.append(#""from":"oldest""#)
        case .after(let seq): members.append(#""after":\#(seq)"#)
        case .since(let micros):
            members.append(#""since":"# + string(Array(Self.rfc3339(micros: max(0, micros)).utf8)))
        }
        if let app { members.append(#""app":"# + string(app)) }
        if let session { members.append(#""session":"# + string(session)) }
        if !types.isEmpty { members.append(#""type":"# + list(types)) }
        if !names.isEmpty { members.append(#""name":"# + list(names)) }
        if let derived { members.append(#""derived":\#(derived)"#) }
        if let pipeline { members.append(#""pipeline":"# + string(pipeline)) }
        return Array((#"{"subscribe":{"# + members.joined(separator: ",") + "}}\n").utf8)
    }
}

extension SubscribeRequest {
    /// RFC 3339 UTC text of a time in microseconds since 1970, for a request's `since`.
    static func rfc3339(micros: Int64) -> String {
        var t = time_t(micros / 1_000_000)
        var parts = tm()
        gmtime_r(&t, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec),
            Int(micros % 1_000_000))
    }
}

/// A subscriber's end of a subscription (PROTOCOL.md §9), line by line, blocking: what
/// `whenctl tail -f` and WhenClient's `WhendSubscription` read.
package final class SubscriptionReader: @unchecked Sendable {
    // Unchecked: one reader at a time (`whenctl tail -f`'s thread, a WhenClient iterator's queue).
    package enum Event: Equatable {
        /// whend took the request; records follow `after` (nil: the oldest, or from a time).
        case subscribed(after: UInt64?)
        /// A record as the journal stores it, without its `\n`.
        case record(seq: UInt64, line: [UInt8])
        case caughtUp(seq: UInt64)
        case checkpoint(seq: UInt64)
        case gap(from: UInt64, through: UInt64)
        /// whend refused the subscription or ended it, and why; the connection is closed.
        case error(code: String, message: String)
    }

    private let socket: BlockingSocket
    private var framer = LineFramer(maxLineBytes: 64 << 20)
    private var ready: [Event] = []
    private var ended = false

    /// Connects to whend's event socket at `path` and sends `request`.
    package init(path: String, request: SubscribeRequest) throws {
        socket = try BlockingSocket(path: path)
        try socket.send(request.line)
    }

    /// The next event; nil once whend closed the connection.
    package func next() throws -> Event? {
        while ready.isEmpty {
            if ended { return nil }
            let chunk = try socket.receive()
            if chunk.isEmpty {
                // What came after the last newline is a line whend did not finish (it closed,
                // or was killed, mid-write): not a record, which a reader would take and resume
                // after. It comes whole on the next subscription.
                ended = true
            } else {
                chunk.withUnsafeBufferPointer { buffer in framer.feed(buffer) { piece in take(piece) } }
            }
        }
        return ready.removeFirst()
    }

    /// Stops reading: whend sees the connection end.
    package func close() { socket.finishSending() }

    private func take(_ piece: LineFramer.Piece) {
        guard case .line(let line) = piece, !line.isEmpty else { return }
        if let event = Self.event(line) { ready.append(event) }
    }

    /// One line from whend, read; nil for a line this reader does not know (later additions).
    package static func event(_ line: UnsafeBufferPointer<UInt8>) -> Event? {
        let prefix = Array(#"{"_seq":"#.utf8)
        if line.starts(with: prefix) {
            var seq: UInt64 = 0
            for b in line.dropFirst(prefix.count) {
                guard b >= 0x30 && b <= 0x39 else { break }
                seq = seq &* 10 &+ UInt64(b - 0x30)
            }
            return .record(seq: seq, line: Array(line))
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(buffer: line)) as? [String: Any],
            let (key, value) = object.first, object.count == 1, let fields = value as? [String: Any]
        else { return nil }
        func number(_ name: String) -> UInt64? { (fields[name] as? NSNumber).map { $0.uint64Value } }
        switch key {
        case "subscribed": return .subscribed(after: number("after"))
        case "caught_up": return number("seq").map { .caughtUp(seq: $0) }
        case "checkpoint": return number("seq").map { .checkpoint(seq: $0) }
        case "gap": return number("from").flatMap { from in number("through").map { .gap(from: from, through: $0) } }
        case "error": return .error(code: fields["code"] as? String ?? "", message: fields["message"] as? String ?? "")
        default: return nil
        }
    }
}
