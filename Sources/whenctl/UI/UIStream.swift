import Foundation
import Hummingbird
import NIOCore

/// `/api/stream`: a subscription as Server-Sent Events. Each record is an event whose `id` is its
/// `_seq`, and so are `caught_up` and `checkpoint` (their `seq`): a browser's EventSource that
/// reconnects sends the last as `Last-Event-ID`, and the subscription resumes with `after` set to
/// it, every record the filters pass exactly once (PROTOCOL.md §9).
///
/// Query: where to start — `after=SEQ`, `since=RFC3339`, `from=now|oldest` (default now); the
/// filters — `app`, `session`, `type` and `name` (comma-separated lists), `derived=true|false`,
/// `pipeline`. Events: records (the default event type, data as stored), `subscribed`,
/// `caught_up`, `checkpoint`, `gap`, and `problem` (`{"code","message"}`: whend's error, or whend
/// out of reach), after which the stream ends and the browser tries again.
enum UIStream {
    static func response(query: [String: String], lastEventID: String?, source: UISource) -> Response {
        let subscription: [UInt8]
        do {
            subscription = try UISubscription.line(self.subscription(query, lastEventID: lastEventID))
        } catch {
            return UIServer.text(.badRequest, "whenctl ui: \(error)")
        }
        let socket = source.eventSocket
        let body = ResponseBody { writer in
            try await writer.write(ByteBuffer(string: "retry: 2000\n\n"))
            do {
                try await UISubscription.read(socket: socket, line: subscription) { item in
                    switch item {
                    case .idle:
                        // A comment: a browser gone is found out by the write that fails.
                        do {
                            try await writer.write(ByteBuffer(string: ": idle\n\n"))
                        } catch {
                            throw SSEWriteFailed(underlying: error)
                        }
                        return true
                    case .line(let line):
                        return try await forward(line, to: &writer)
                    }
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

    /// Writes one of whend's lines as an event; false once the stream should end.
    private static func forward(_ line: ByteBuffer, to writer: inout any ResponseBodyWriter) async throws -> Bool {
        var out = ByteBuffer()
        var goOn = true
        switch UISubscriptionLine(line) {
        case .record(let seq, var line):
            out.writeString("id: \(seq)\ndata: ")
            out.writeBuffer(&line)
            out.writeString("\n\n")
        case .control(let kind, let object, let seen):
            if kind == "error" {
                out = event("problem", object)
                goOn = false
            } else {
                out = event(kind, object, id: seen)
            }
        case .unreadable:
            return true
        }
        do { try await writer.write(out) } catch { throw SSEWriteFailed(underlying: error) }
        return goOn
    }

    static func event(_ name: String, _ object: [String: Any], id: UInt64? = nil) -> ByteBuffer {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        var text = "event: \(name)\n"
        if let id { text += "id: \(id)\n" }
        return ByteBuffer(string: text + "data: " + String(decoding: data, as: UTF8.self) + "\n\n")
    }

    /// The `subscribe` object for the query; `Last-Event-ID` (a browser resuming) wins over
    /// where the query says to start.
    static func subscription(_ query: [String: String], lastEventID: String?) throws -> [String: Any] {
        var request: [String: Any] = [:]
        func value(_ key: String) -> String? {
            query[key].flatMap { $0.isEmpty ? nil : $0 }
        }
        func seq(_ text: String, _ what: String) throws -> UInt64 {
            guard let n = UInt64(text) else { throw Failure("\(what) takes a _seq (a whole number); got \(text)") }
            return n
        }
        if let last = lastEventID.flatMap({ $0.isEmpty ? nil : $0 }) {
            request["after"] = try seq(last, "Last-Event-ID")
        } else if let after = value("after") {
            request["after"] = try seq(after, "after")
        } else if let since = value("since") {
            request["since"] = since
        } else {
            request["from"] = value("from") ?? "now"
        }
        for key in ["app", "session", "pipeline"] {
            if let v = value(key) { request[key] = v }
        }
        for key in ["type", "name"] {
            if let v = value(key) {
                request[key] = v.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
                    !$0.isEmpty
                }
            }
        }
        if let derived = value("derived") {
            guard derived == "true" || derived == "false" else {
                throw Failure("derived takes true or false; got \(derived)")
            }
            request["derived"] = derived == "true"
        }
        return request
    }
}
