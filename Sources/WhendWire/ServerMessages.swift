/// The lines the daemon writes on the event socket (PROTOCOL.md §3–§5).
package enum ServerMessage {
    package static func welcome(server: String, maxEventBytes: Int) -> [UInt8] {
        var out = Array("{\"welcome\":{\"protocol\":1,\"server\":".utf8)
        appendJSONString(server.utf8, to: &out)
        out.append(contentsOf: Array(",\"max_event_bytes\":\(maxEventBytes)}}\n".utf8))
        return out
    }

    package static func ack(_ line: UInt64) -> [UInt8] {
        Array("{\"ack\":\(line)}\n".utf8)
    }

    /// An error line; `event` is the event line's number, nil for errors about the connection.
    package static func error(_ error: WireError, event: UInt64?) -> [UInt8] {
        var out = Array("{\"error\":{".utf8)
        if let event { out.append(contentsOf: Array("\"event\":\(event),".utf8)) }
        out.append(contentsOf: Array("\"code\":\"\(error.code.rawValue)\",\"message\":".utf8))
        appendJSONString(error.message.utf8, to: &out)
        out.append(contentsOf: Array("}}\n".utf8))
        return out
    }
}
