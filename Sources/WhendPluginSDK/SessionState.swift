import Foundation
import WhendWire

/// A session's identity, from a record's `app` and `session`.
public typealias SessionID = SessionDigest

extension SessionDigest {
    public init(_ record: PluginRecord) { self.init(app: record[.app], session: record[.session]) }
}

/// The last session's identity, kept: a session's records come in runs (about 18 in a row in
/// `make bench`'s journal), and each identity costs a SipHash of both fields. Compared as
/// stored, quotes and escapes included: two spellings of one session only miss the cache.
public struct SessionIDCache {
    private var app: [UInt8] = []
    private var session: [UInt8] = []
    private var last: SessionID?

    public init() {}

    /// `SessionID(record)`, without hashing when the record is of the last session asked for.
    public mutating func id(of record: PluginRecord) -> SessionID {
        let app = record[.app]
        let session = record[.session]
        if let last, Self.same(app, as: self.app), Self.same(session, as: self.session) { return last }
        let id = SessionID(app: app, session: session)
        Self.keep(app, in: &self.app)
        Self.keep(session, in: &self.session)
        last = id
        return id
    }

    /// Empty for no field: a stored value is never empty (a string has its quotes).
    private static func same(_ value: JSONValue?, as kept: [UInt8]) -> Bool {
        guard let value else { return kept.isEmpty }
        return kept.withUnsafeBufferPointer { JSONBytes.equal($0, value.raw) }
    }

    private static func keep(_ value: JSONValue?, in kept: inout [UInt8]) {
        kept.removeAll(keepingCapacity: true)
        if let value { kept.append(contentsOf: value.raw) }
    }
}

/// Per-session state with a bound: at most `limit` sessions are kept; past it, the least
/// recently seen tenth is forgotten (a session that comes back starts afresh). A plugin's memory
/// is then bounded by its configuration, whatever the number of sessions clients open.
///
/// Inlinable, so that a plugin's use of it is specialised for its state type: a generic call
/// across the library boundary looked up tuple metadata at run time for every record.
@frozen public struct BoundedSessions<State> {
    /// Where each session's entry is in `slots`.
    @usableFromInline var slots: [SessionID: Int] = [:]
    /// The sessions, in no order, contiguous: forgetting the oldest reads when each was last
    /// seen without copying (and retaining) any state, which a dictionary of entries did.
    @usableFromInline var entries: [Entry] = []
    public let limit: Int
    /// The last session asked for and its slot (-1 for none): a session's records come in runs,
    /// and each lookup in `slots` costs a hash of the digest.
    @usableFromInline var lastID = SessionID(low: 0, high: 0)
    @usableFromInline var lastSlot = -1

    @usableFromInline struct Entry {
        @usableFromInline var id: SessionID
        @usableFromInline var state: State
        @usableFromInline var seen: UInt64
        @inlinable init(id: SessionID, state: State, seen: UInt64) {
            self.id = id
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
        if lastSlot >= 0, lastID == key {
            entries[lastSlot].seen = seq
            return body(&entries[lastSlot].state)
        }
        if let slot = slots[key] {
            lastID = key
            lastSlot = slot
            // In place: no copy of the state on the way in or out.
            entries[slot].seen = seq
            return body(&entries[slot].state)
        }
        var state = make()
        let result = body(&state)
        insert(Entry(id: key, state: state, seen: seq))
        if entries.count > limit { forgetOldest() }
        return result
    }

    @inlinable mutating func insert(_ entry: Entry) {
        lastSlot = -1
        if let slot = slots[entry.id] {
            entries[slot] = entry
        } else {
            slots[entry.id] = entries.count
            entries.append(entry)
        }
    }

    /// The same sessions under another limit (a restored state under the configuration in force).
    public func withLimit(_ limit: Int) -> BoundedSessions {
        var copy = BoundedSessions(limit: limit)
        copy.slots = slots
        copy.entries = entries
        while copy.entries.count > copy.limit { copy.forgetOldest() }
        return copy
    }

    /// Forgets the least recently seen tenth, compacting the rest in place.
    ///
    /// Through the buffers: reading an array's element, or its `swapAt`, copies entries (a
    /// retain and a release of each state's storage, cold in memory by then), which made this
    /// 6 % of a crash-reports replay; a buffer's subscript reads in place, its `swapAt` moves.
    @inlinable mutating func forgetOldest() {
        lastSlot = -1
        var seen: [UInt64] = []
        seen.reserveCapacity(entries.count)
        entries.withUnsafeBufferPointer { buffer in
            for i in buffer.indices { seen.append(buffer[i].seen) }
        }
        seen.sort()
        let cut = seen[min(limit / 10, seen.count - 1)]
        let kept = entries.withUnsafeMutableBufferPointer { buffer in
            var kept = 0
            for i in buffer.indices {
                if buffer[i].seen <= cut {
                    slots.removeValue(forKey: buffer[i].id)
                    continue
                }
                if kept != i {
                    buffer.swapAt(kept, i)
                    slots[buffer[kept].id] = kept
                }
                kept += 1
            }
            return kept
        }
        entries.removeLast(entries.count - kept)
    }

    /// The sessions' slots in the order last seen (then by digest): the same state saves the
    /// same bytes. Sorted as plain numbers: where this is not specialised for the state's type,
    /// a sort of the entries themselves copied each state through its value witnesses.
    @usableFromInline func orderSeen() -> [Int] {
        var order: [(seen: UInt64, low: UInt64, high: UInt64, slot: Int)] = []
        order.reserveCapacity(entries.count)
        for i in entries.indices { order.append((entries[i].seen, entries[i].id.low, entries[i].id.high, i)) }
        order.sort { ($0.seen, $0.low, $0.high) < ($1.seen, $1.low, $1.high) }
        return order.map(\.slot)
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
        for s in try c.decode([Saved].self, forKey: .sessions) { insert(Entry(id: s.id, state: s.state, seen: s.seen)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(limit, forKey: .limit)
        // In the order last seen, so that the same state writes the same bytes.
        try c.encode(
            orderSeen().map { Saved(id: entries[$0].id, seen: entries[$0].seen, state: entries[$0].state) },
            forKey: .sessions)
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
        for i in orderSeen() {
            let entry = entries[i]
            emit(Array(try encoder.encode(Saved(id: entry.id, seen: entry.seen, state: entry.state))) + [0x0A])
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
            insert(Entry(id: s.id, state: s.state, seen: s.seen))
        }
    }
}
