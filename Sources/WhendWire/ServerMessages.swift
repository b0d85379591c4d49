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

    // MARK: Subscriptions (PROTOCOL.md §9)

    /// The answer to a subscription: records follow from `_seq` `after + 1` (nil: the oldest
    /// the journal holds, or the first received since the time asked for).
    package static func subscribed(server: String, after: UInt64?) -> [UInt8] {
        var out = Array("{\"subscribed\":{\"protocol\":1,\"server\":".utf8)
        appendJSONString(server.utf8, to: &out)
        if let after { out.append(contentsOf: Array(",\"after\":\(after)".utf8)) }
        out.append(contentsOf: Array("}}\n".utf8))
        return out
    }

    /// Every record through `seq` was examined and those wanted were sent: the subscriber is
    /// live from here on. Sent once.
    package static func caughtUp(seq: UInt64) -> [UInt8] { Array("{\"caught_up\":{\"seq\":\(seq)}}\n".utf8) }

    /// Every record through `seq` was examined (filters skipped those not sent): resuming with
    /// `after` set to it misses nothing and repeats nothing.
    package static func checkpoint(seq: UInt64) -> [UInt8] { Array("{\"checkpoint\":{\"seq\":\(seq)}}\n".utf8) }

    /// Records `from`…`through` are gone from the journal (retention deleted them) before the
    /// subscriber read them.
    package static func gap(from: UInt64, through: UInt64) -> [UInt8] {
        Array("{\"gap\":{\"from\":\(from),\"through\":\(through)}}\n".utf8)
    }
}
