import Foundation
import WhendWire

/// A session's identity, from a record's `app` and `session`.
public typealias SessionID = SessionDigest

extension SessionDigest {
    public init(_ record: PluginRecord) { self.init(app: record[.app], session: record[.session]) }
}

/// Per-session state with a bound: at most `limit` sessions are kept; past it, the least
/// recently seen tenth is forgotten (a session that comes back starts afresh). A plugin's memory
/// is then bounded by its configuration, whatever the number of sessions clients open.
///
/// Inlinable, so that a plugin's use of it is specialised for its state type: a generic call
/// across the library boundary looked up tuple metadata at run time for every record.
@frozen public struct BoundedSessions<State> {
    @usableFromInline var entries: [SessionID: Entry] = [:]
    public let limit: Int

    @usableFromInline struct Entry {
        @usableFromInline var state: State
        @usableFromInline var seen: UInt64
        @inlinable init(state: State, seen: UInt64) {
            self.state = state
            self.seen = seen
        }
    }

    @inlinable public init(limit: Int) { self.limit = max(1, limit) }

    @inlinable public var count: Int { entries.count }

    /// Runs `body` on the state of `key` (made by `make` if new), marking it seen at `seq`.
    @inlinable public mutating func with<R>(
        _ key: SessionID, seq: UInt64, make: () -> State, _ body: (inout State) -> R
    ) -> R {
        let result: R
        if let index = entries.index(forKey: key) {
            // In place: no copy of the state on the way in or out.
            result = body(&entries.values[index].state)
            entries.values[index].seen = seq
        } else {
            var state = make()
            result = body(&state)
            entries[key] = Entry(state: state, seen: seq)
            if entries.count > limit { forgetOldest() }
        }
        return result
    }

    /// The same sessions under another limit (a restored state under the configuration in force).
    public func withLimit(_ limit: Int) -> BoundedSessions {
        var copy = BoundedSessions(limit: limit)
        copy.entries = entries
        while copy.entries.count > copy.limit { copy.forgetOldest() }
        return copy
    }

    @inlinable mutating func forgetOldest() {
        let cut = entries.values.map(\.seen).sorted()[limit / 10]
        // In place: a filtered copy copied every session kept, each time.
        var forgotten: [SessionID] = []
        forgotten.reserveCapacity(limit / 10 + 1)
        for (id, entry) in entries where entry.seen <= cut { forgotten.append(id) }
        for id in forgotten { entries.removeValue(forKey: id) }
    }
}

/// Saved as a list of sessions, each with its digest, when it was last seen and its state.
/// One session as saved: its digest, when last seen, its state.
struct SavedSession<State: Codable>: Codable {
    var id: SessionID
    var seen: UInt64
    var state: State
}

extension BoundedSessions: Codable where State: Codable {
    typealias Saved = SavedSession<State>

    private enum Keys: String, CodingKey { case limit, sessions }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        self.init(limit: try c.decode(Int.self, forKey: .limit))
        for s in try c.decode([Saved].self, forKey: .sessions) { entries[s.id] = Entry(state: s.state, seen: s.seen) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(limit, forKey: .limit)
        // In the order last seen, so that the same state writes the same bytes.
        let saved = entries.map { Saved(id: $0.key, seen: $0.value.seen, state: $0.value.state) }
            .sorted { ($0.seen, $0.id.low, $0.id.high) < ($1.seen, $1.id.low, $1.id.high) }
        try c.encode(saved, forKey: .sessions)
    }
}

/// A state saved as lines, one piece at a time, so that saving a large state does not build
/// all of it as one tree in memory first (JSONEncoder's way: three times the state's size).
public protocol LineSnapshot {
    /// Hands the state over as lines of bytes, each ending in a newline.
    func snapshotLines(_ emit: ([UInt8]) -> Void) throws
    init(snapshotLines: [UInt8]) throws
}

extension BoundedSessions: LineSnapshot where State: Codable {
    private struct Header: Codable { var limit: Int }

    /// A header line, then one line per session (its digest, when last seen, its state), in
    /// the order last seen: the same state writes the same bytes.
    public func snapshotLines(_ emit: ([UInt8]) -> Void) throws {
        let encoder = JSONEncoder()
        emit(Array(try encoder.encode(Header(limit: limit))) + [0x0A])
        let order = entries.keys.sorted {
            let a = entries[$0]!.seen
            let b = entries[$1]!.seen
            return (a, $0.low, $0.high) < (b, $1.low, $1.high)
        }
        for id in order {
            let entry = entries[id]!
            emit(Array(try encoder.encode(Saved(id: id, seen: entry.seen, state: entry.state))) + [0x0A])
        }
    }

    public init(snapshotLines bytes: [UInt8]) throws {
        let decoder = JSONDecoder()
        var lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: true)[...]
        guard let first = lines.popFirst() else {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "no header"))
        }
        self.init(limit: try decoder.decode(Header.self, from: Data(first)).limit)
        for line in lines {
            let s = try decoder.decode(Saved.self, from: Data(line))
            entries[s.id] = Entry(state: s.state, seen: s.seen)
        }
    }
}
