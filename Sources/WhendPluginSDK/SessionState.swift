import WhendWire

/// A session's identity, from a record's `app` and `session`.
public typealias SessionID = SessionDigest

extension SessionDigest {
    public init(_ record: PluginRecord) { self.init(app: record[.app], session: record[.session]) }
}

/// Per-session state with a bound: at most `limit` sessions are kept; past it, the least
/// recently seen tenth is forgotten (a session that comes back starts afresh). A plugin's memory
/// is then bounded by its configuration, whatever the number of sessions clients open.
public struct BoundedSessions<State> {
    public private(set) var states: [SessionID: (state: State, seen: UInt64)] = [:]
    public let limit: Int

    public init(limit: Int) { self.limit = max(1, limit) }

    public var count: Int { states.count }

    /// Runs `body` on the state of `key` (made by `make` if new), marking it seen at `seq`.
    public mutating func with<R>(_ key: SessionID, seq: UInt64, make: () -> State, _ body: (inout State) -> R) -> R {
        let result: R
        if let index = states.index(forKey: key) {
            // In place: no copy of the state on the way in or out.
            result = body(&states.values[index].state)
            states.values[index].seen = seq
        } else {
            var state = make()
            result = body(&state)
            states[key] = (state, seq)
            if states.count > limit { forgetOldest() }
        }
        return result
    }

    private mutating func forgetOldest() {
        let cut = states.values.map(\.seen).sorted()[limit / 10]
        states = states.filter { $0.value.seen > cut }
    }
}
