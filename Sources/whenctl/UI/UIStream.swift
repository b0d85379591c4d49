import Foundation
import Hummingbird
import NIOCore
import WhendWire

/// `/api/stream`: a subscription as Server-Sent Events. Each record is an event whose `id` is its
/// `_seq`, and so are `caught_up` and `checkpoint` (their `seq`): a browser's EventSource that
/// reconnects sends the last as `Last-Event-ID`, and the subscription resumes with `after` set to
/// it, every record the filters pass exactly once (PROTOCOL.md §9).
///
/// Query: where to start — `recent=N` (the last N records), `after=SEQ`, `since=RFC3339`,
/// `from=now|oldest` (default now); the
/// filters — `app`, `session`, `type` and `name` (comma-separated lists), `derived=true|false`,
/// `pipeline`. Events: records (the default event type, data as stored), `subscribed`,
/// `caught_up`, `checkpoint`, `gap`, and `problem` (`{"code","message"}`: whend's error, or whend
/// out of reach), after which the stream ends and the browser tries again.
enum UIStream {
    static func response(query: [String: String], lastEventID: String?, source: UISource) -> Response {
        let subscription: SubscribeRequest
        do {
            subscription = try self.subscription(query, lastEventID: lastEventID)
        } catch {
            return UIServer.text(.badRequest, "whenctl ui: \(error)")
        }
        let socket = source.eventSocket
        // `recent=N`: the last N records, wherever the journal is now (unless resuming).
        let recent = lastEventID.flatMap { $0.isEmpty ? nil : $0 } == nil ? query["recent"].flatMap(UInt64.init) : nil
        let body = ResponseBody { writer in
            try await writer.write(ByteBuffer(string: "retry: 2000\n\n"))
            var subscription = subscription
            do {
                if let recent {
                    let last = try await source.lastSeq()
                    subscription.start = .after(last > recent ? last - recent : 0)
                }
                try await UISubscription.read(socket: socket, request: subscription) { item in
                    let (out, goOn): (ByteBuffer, Bool)
                    switch item {
                    case .idle:
                        // A comment: a browser gone is found out by the write that fails.
                        (out, goOn) = (ByteBuffer(string: ": idle\n\n"), true)
                    case .line(let line):
                        guard let event = UISubscription.event(line) else { return true }
                        (out, goOn) = self.event(for: event)
                    }
                    do { try await writer.write(out) } catch { throw SSEWriteFailed(underlying: error) }
                    return goOn
                }
            } catch let error as SSEWriteFailed {
                throw error.underlying
            } catch {
                let message = "cannot reach whend at \(socket) (\(error)); trying again"
                try await writer.write(event("problem", ["code": "unreachable", "message": message]))
            }
            try await writer.finish(nil)
        }
        return Response(
            status: .ok,
            headers: [.contentType: "text/event-stream", .cacheControl: "no-store"],
            body: body)
    }

    /// A failed write to the browser, told apart from a failure to reach whend.
    private struct SSEWriteFailed: Error { let underlying: any Error }

    /// One of whend's lines as an event, and whether the stream goes on after it.
    private static func event(for event: SubscriptionReader.Event) -> (ByteBuffer, Bool) {
        switch event {
        case .record(let seq, let line):
            var out = ByteBuffer()
            out.writeString("id: \(seq)\ndata: ")
            out.writeBytes(line)
            out.writeString("\n\n")
            return (out, true)
        case .subscribed(let after):
            return (self.event("subscribed", after.map { ["after": $0] } ?? [:]), true)
        case .caughtUp(let seq):
            return (self.event("caught_up", ["seq": seq], id: seq), true)
        case .checkpoint(let seq):
            return (self.event("checkpoint", ["seq": seq], id: seq), true)
        case .gap(let from, let through):
            return (self.event("gap", ["from": from, "through": through]), true)
        case .error(let code, let message):
            return (self.event("problem", ["code": code, "message": message]), false)
        }
    }

    static func event(_ name: String, _ object: [String: Any], id: UInt64? = nil) -> ByteBuffer {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        var text = "event: \(name)\n"
        if let id { text += "id: \(id)\n" }
        return ByteBuffer(string: text + "data: " + String(decoding: data, as: UTF8.self) + "\n\n")
    }

    /// The subscription for the query; `Last-Event-ID` (a browser resuming) wins over where the
    /// query says to start.
    static func subscription(_ query: [String: String], lastEventID: String?) throws -> SubscribeRequest {
        var request = SubscribeRequest()
        func value(_ key: String) -> String? {
            query[key].flatMap { $0.isEmpty ? nil : $0 }
        }
        func seq(_ text: String, _ what: String) throws -> UInt64 {
            guard let n = UInt64(text) else { throw Failure("\(what) takes a _seq (a whole number); got \(text)") }
            return n
        }
        func list(_ text: String?) -> [String] {
            (text ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        if let last = lastEventID.flatMap({ $0.isEmpty ? nil : $0 }) {
            request.start = .after(try seq(last, "Last-Event-ID"))
        } else if let after = value("after") {
            request.start = .after(try seq(after, "after"))
        } else if let since = value("since") {
            guard let instant = RFC3339.parse(Array(since.utf8)) else {
                throw Failure("since takes an RFC 3339 time (2026-01-31T12:00:00Z); got \(since)")
            }
            request.start = .since(instant.microseconds)
        } else {
            switch value("from") ?? "now" {
            case "now": request.start = .now
            case "oldest": request.start = .oldest
            case let other: throw Failure("from takes now or oldest; got \(other)")
            }
        }
        request.app = value("app").map { Array($0.utf8) }
        request.session = value("session").map { Array($0.utf8) }
        request.pipeline = value("pipeline").map { Array($0.utf8) }
        request.types = list(value("type"))
        request.names = list(value("name"))
        if let derived = value("derived") {
            guard derived == "true" || derived == "false" else {
                throw Failure("derived takes true or false; got \(derived)")
            }
            request.derived = derived == "true"
        }
        return request
    }
}
