import Foundation
import WhendSystem
import WhendWire

/// The session index session-recorder keeps and `whenctl sessions` reads. The plugin keeps it
/// as its state, saved with its pipeline's cursor; every so often it exports it to
/// `sessions.json` (with the `_seq` it is complete through), and `whenctl sessions` completes
/// that export from the journal, so that the listing is always as new as the journal. A
/// `sessions.log` of changes after the export, which earlier versions wrote, is still read.
///
/// Under a limit (`maxSessions`, the plugin's `max_sessions`), the index forgets sessions by one
/// rule, applied as each record is indexed (`apply`), whoever indexes it: past the limit and a
/// tenth more, the least recently active down to the limit (a session that comes back starts
/// afresh). It is listed (`sessions`) as the limit's most recently active. The export holds the
/// limit and every session the index keeps, so that a reader completing it from the journal
/// indexes what the plugin does, and lists what the plugin would export.
///
/// Each session is kept compact (`Kept`), its `Entry` made when read: its session id and times
/// inline, its counts by type as numbers through one table of the type names, in one array
/// with a table of where each session is. A session as an `Entry` in a dictionary took ~580
/// bytes (four strings on the heap, an array of counts, and the dictionary's empty buckets
/// for each one full); kept so, ~130.
package struct SessionIndex {
    package struct Entry: Codable, Equatable, Sendable {
        package var app: String
        package var session: String
        package var firstSeq: UInt64
        package var lastSeq: UInt64
        package var firstTime: String
        package var lastTime: String
        package var counts: TypeCounts
        package var records: Int { counts.values.reduce(0, +) }

        package init(
            app: String, session: String, firstSeq: UInt64, lastSeq: UInt64, firstTime: String, lastTime: String,
            counts: TypeCounts
        ) {
            self.app = app
            self.session = session
            self.firstSeq = firstSeq
            self.lastSeq = lastSeq
            self.firstTime = firstTime
            self.lastTime = lastTime
            self.counts = counts
        }
    }

    struct Change: Codable {
        var seq: UInt64
        var app: String
        var session: String
        var type: String
        var time: String
    }

    /// One session as kept. What does not fit the compact forms (a long session id, a time
    /// not written as `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`, more than eight types) is in `spilled`.
    struct Kept {
        var key: SessionDigest
        var firstSeq: UInt64
        var lastSeq: UInt64
        var firstTime: PackedTime
        var lastTime: PackedTime
        var app: String
        var session: InlineText
        var counts: InlineCounts
    }

    /// What of a session does not fit `Kept`.
    struct Spilled {
        var session = ""
        var firstTime = ""
        var lastTime = ""
        var counts = TypeCounts()
    }

    /// Where each session is in `kept`: by the digest of app and session, so that a record
    /// finds its entry without building strings.
    private var slots: [SessionDigest: Int32] = [:]
    private(set) var kept: [Kept] = []
    private var spilled: [SessionDigest: Spilled] = [:]
    private(set) var types = TypeTable()
    package private(set) var indexedThrough: UInt64 = 0
    package let directory: String
    /// How many sessions are listed (none: all); past it and a tenth more, the least recently
    /// active are forgotten, down to it. At least 1.
    package var maxSessions: Int?
    /// The apps of the sessions indexed so far, each once: a session's `app` is this copy,
    /// not a string of its own (one of 64 bytes per session where a name passes 15 bytes;
    /// a few apps have thousands of sessions).
    private var apps: [String] = []

    /// `app`, as the copy kept in `apps` when there is one.
    private mutating func sharedApp(_ app: String) -> String {
        // By bytes: Swift's `==` takes "é" and "e\u{301}" for one app, which the journal keeps apart.
        if let kept = apps.first(where: { $0.utf8.elementsEqual(app.utf8) }) { return kept }
        if apps.count < 64 { apps.append(app) }
        return app
    }

    package static func directory(stateDirectory: String) -> String { stateDirectory + "/plugins/session-recorder" }

    /// An index built elsewhere (a plugin's saved state).
    package init(directory: String, indexedThrough: UInt64, entries: [SessionDigest: Entry]) {
        self.directory = directory
        self.indexedThrough = indexedThrough
        for (key, e) in entries { insert(e, key: key) }
    }

    /// The same index, kept in `directory`.
    package func moved(to directory: String) -> SessionIndex {
        var index = SessionIndex(directory: directory, indexedThrough: indexedThrough, entries: [:])
        index.slots = slots
        index.kept = kept
        index.spilled = spilled
        index.types = types
        index.apps = apps
        index.maxSessions = maxSessions
        return index
    }

    /// Reads the export and replays the log after it, if an earlier version left one.
    package init(directory: String) {
        self.directory = directory
        if let data = FileManager.default.contents(atPath: directory + "/sessions.json"),
            let snapshot = data.withUnsafeBytes({ Self.readExport($0.bindMemory(to: UInt8.self)) })
        {
            indexedThrough = snapshot.indexedThrough
            maxSessions = snapshot.maxSessions.map { max(1, $0) }
            for e in snapshot.sessions + (snapshot.sessionsBeyondMax ?? []) { insert(e.entry, key: e.key) }
        }
        if let log = FileManager.default.contents(atPath: directory + "/sessions.log") {
            let decoder = JSONDecoder()
            for line in log.split(separator: 0x0A) {
                if let c = try? decoder.decode(Change.self, from: line) {
                    apply(
                        seq: c.seq, session: SessionDigest(app: c.app, session: c.session), app: { c.app },
                        sessionID: { c.session }, type: c.type, time: { c.time })
                }
            }
        }
    }

    /// How many sessions are kept (listed or not).
    package var count: Int { kept.count }

    /// The session at `position` (0..<count) and its digest.
    package func entry(at position: Int) -> (key: SessionDigest, value: Entry) {
        let k = kept[position]
        let spill = spilled[k.key]
        var counts = TypeCounts()
        if k.counts.isSpilled {
            counts = spill?.counts ?? TypeCounts()
        } else {
            k.counts.forEach { type, n in counts[types.name(type)] = n }
        }
        return (
            k.key,
            Entry(
                app: k.app, session: k.session.string ?? spill?.session ?? "", firstSeq: k.firstSeq,
                lastSeq: k.lastSeq, firstTime: k.firstTime.string ?? spill?.firstTime ?? "",
                lastTime: k.lastTime.string ?? spill?.lastTime ?? "", counts: counts)
        )
    }

    /// The session of `key`, if indexed.
    package func entry(for key: SessionDigest) -> Entry? {
        slots[key].map { entry(at: Int($0)).value }
    }

    /// Adds `e` as the session of `key` (replacing one there).
    private mutating func insert(_ e: Entry, key: SessionDigest) {
        settle()
        var spill = Spilled()
        var spills = false
        let session =
            InlineText(e.session)
            ?? {
                spill.session = e.session
                spills = true
                return InlineText.spilled
            }()
        func time(_ text: String, _ spilledText: inout String) -> PackedTime {
            if let time = PackedTime(text) { return time }
            spilledText = text
            spills = true
            return .spilled
        }
        let firstTime = time(e.firstTime, &spill.firstTime)
        let lastTime = time(e.lastTime, &spill.lastTime)
        var counts = InlineCounts()
        for (type, n) in e.counts {
            if !counts.isSpilled, let t = types.index(of: type), counts.set(t, n, names: types) { continue }
            counts = .spilled
            spill.counts = e.counts
            spills = true
            break
        }
        let k = Kept(
            key: key, firstSeq: e.firstSeq, lastSeq: e.lastSeq, firstTime: firstTime, lastTime: lastTime,
            app: sharedApp(e.app), session: session, counts: counts)
        if let slot = slots[key] {
            kept[Int(slot)] = k
        } else {
            slots[key] = Int32(kept.count)
            kept.append(k)
        }
        spilled[key] = spills ? spill : nil
    }

    /// `count(_:at:)` the type of a record as stored (a string's text, else "").
    private mutating func count(stored type: JSONValue?, at slot: Int) {
        if !kept[slot].counts.isSpilled, let t = types.index(ofStored: type), kept[slot].counts.add(t, names: types) {
            return
        }
        count(type?.string ?? "", at: slot)
    }

    /// One more record of `type` for the session at `slot`.
    private mutating func count(_ type: String, at slot: Int) {
        if !kept[slot].counts.isSpilled, let t = types.index(of: type), kept[slot].counts.add(t, names: types) {
            return
        }
        let key = kept[slot].key
        if !kept[slot].counts.isSpilled {
            var counts = TypeCounts()
            kept[slot].counts.forEach { t, n in counts[types.name(t)] = n }
            kept[slot].counts = .spilled
            spilled[key, default: Spilled()].counts = counts
        }
        spilled[key, default: Spilled()].counts.add(type)
    }

    /// Sets the newest time of the session at `slot` (not empty).
    private mutating func setLastTime(_ time: String, at slot: Int) {
        if let packed = PackedTime(time) {
            if kept[slot].lastTime == .spilled { spilled[kept[slot].key]?.lastTime = "" }
            kept[slot].lastTime = packed
        } else {
            kept[slot].lastTime = .spilled
            spilled[kept[slot].key, default: Spilled()].lastTime = time
        }
    }

    /// Indexes one record; false if it was indexed already (a record handled again). The
    /// strings are asked for only when the session is new (app, session) or when kept (time).
    @discardableResult
    package mutating func apply(
        seq: UInt64, session key: SessionDigest, app: () -> String, sessionID: () -> String, type: String,
        time: () -> String
    ) -> Bool {
        guard seq > indexedThrough else { return false }
        settle()
        indexedThrough = seq
        let now = time()
        if let slot = slots[key] {
            kept[Int(slot)].lastSeq = seq
            if !now.isEmpty { setLastTime(now, at: Int(slot)) }
            count(type, at: Int(slot))
        } else {
            insert(
                Entry(
                    app: app(), session: sessionID(), firstSeq: seq, lastSeq: seq, firstTime: now, lastTime: now,
                    counts: [type: 1]), key: key)
            forgetBeyondLimit()
        }
        return true
    }

    /// The one rule by which the index forgets, for the plugin and its readers alike: past the
    /// limit and a tenth more (a sort of every session each time a tenth of them have come),
    /// the least recently active, down to the limit.
    private mutating func forgetBeyondLimit() {
        if let limit = maxSessions, kept.count > limit + limit / 10 + 1 { trim(to: limit) }
    }

    /// The last session indexed through `apply(seq:session:app:sessionID:type:time:)` with a
    /// JSON time, where it is in `kept`, and its newest time not yet kept (the JSON value as
    /// stored; empty for none): a session's records come in runs, and each one cost a lookup
    /// by hash and its time made, that the next replaced.
    private var pendingKey: SessionDigest?
    private var pendingSlot = -1
    private var pendingTime: [UInt8] = []

    /// Gives the last session indexed its newest time: before the index is read for its
    /// times, or changed other than by `apply`.
    package mutating func settle() {
        guard pendingSlot >= 0 else { return }
        if !pendingTime.isEmpty {
            let packed = pendingTime.withUnsafeBufferPointer { raw -> PackedTime? in
                // A string without escapes: its bytes between the quotes are the time.
                guard !raw.contains(UInt8(ascii: "\\")) else { return nil }
                return PackedTime(UnsafeBufferPointer(rebasing: raw[1..<raw.count - 1]))
            }
            if let packed {
                if kept[pendingSlot].lastTime == .spilled { spilled[kept[pendingSlot].key]?.lastTime = "" }
                kept[pendingSlot].lastTime = packed
            } else {
                let now = pendingTime.withUnsafeBufferPointer { JSONValue(raw: $0).string ?? "" }
                if !now.isEmpty { setLastTime(now, at: pendingSlot) }
            }
            pendingTime.removeAll(keepingCapacity: true)
        }
        pendingKey = nil
        pendingSlot = -1
    }

    /// `apply(seq:session:app:sessionID:type:time:)` with the type and time as JSON values as
    /// stored (a string counts, anything else is "" for a type and no time): the same index,
    /// its newest time kept as bytes until `settle()`.
    @discardableResult
    package mutating func apply(
        seq: UInt64, session key: SessionDigest, app: () -> String, sessionID: () -> String, type: JSONValue?,
        time: JSONValue?
    ) -> Bool {
        guard seq > indexedThrough else { return false }
        if key != pendingKey {
            settle()
            guard let slot = slots[key] else {
                return apply(
                    seq: seq, session: key, app: app, sessionID: sessionID, type: type?.string ?? "",
                    time: { time?.kind == .string ? time?.string ?? "" : "" })
            }
            pendingKey = key
            pendingSlot = Int(slot)
        }
        indexedThrough = seq
        kept[pendingSlot].lastSeq = seq
        // Only a string that is not empty replaces the last time (an empty one is no time).
        if let time, time.kind == .string, time.raw.count > 2 {
            pendingTime.removeAll(keepingCapacity: true)
            pendingTime.append(contentsOf: time.raw)
        }
        count(stored: type, at: pendingSlot)
        return true
    }
    /// Indexes a record as the journal stores it (for a reader completing the export from the
    /// journal): its `app`, `session`, `type` and time (`ts`, else `_rt`), as the plugin reads them.
    package mutating func apply(stored line: UnsafeBufferPointer<UInt8>, seq: UInt64) {
        var app: JSONValue?
        var session: JSONValue?
        var type: JSONValue?
        var ts: JSONValue?
        var receivedAt: JSONValue?
        var scanner = JSONScanner(line)
        do {
            try scanner.scanObject { member throws(WireError) in
                let key = UnsafeBufferPointer(rebasing: line[member.key])
                let value = JSONValue(raw: UnsafeBufferPointer(rebasing: line[member.value]))
                func named(_ k: StaticString) -> Bool {
                    JSONBytes.equal(key, UnsafeBufferPointer(start: k.utf8Start, count: k.utf8CodeUnitCount))
                }
                // The first occurrence wins, as the plugin reads a record.
                if named("app") {
                    app = app ?? value
                } else if named("session") {
                    session = session ?? value
                } else if named("type") {
                    type = type ?? value
                } else if named("ts") {
                    ts = ts ?? value
                } else if named("_rt") {
                    receivedAt = receivedAt ?? value
                }
            }
        } catch {
            return
        }
        guard let app, let session, session.stringContents?.isEmpty == false else { return }
        let time = ts ?? receivedAt
        apply(
            seq: seq, session: SessionDigest(app: app, session: session), app: { app.string ?? "" },
            sessionID: { session.string ?? "" }, type: type?.string ?? "",
            time: { time?.kind == .string ? time?.string ?? "" : "" })
    }

    /// Where each session is (for `entry(at:)`), most recent first. Sorted as plain numbers.
    package func mostRecentFirst() -> [Int] {
        var order: [(lastSeq: UInt64, position: Int)] = []
        order.reserveCapacity(kept.count)
        for i in kept.indices { order.append((kept[i].lastSeq, i)) }
        order.sort { $0.lastSeq > $1.lastSeq }
        return order.map(\.position)
    }

    /// The sessions listed, most recent first: at most `maxSessions`.
    package var sessions: [Entry] {
        mostRecentFirst().prefix(maxSessions ?? .max).map { entry(at: $0).value }
    }

    /// Every session kept, most recent first: those listed, then those beyond the limit.
    package var allSessions: [Entry] { mostRecentFirst().map { entry(at: $0).value } }

    /// Keeps the `limit` most recently active sessions.
    mutating func trim(to limit: Int) {
        settle()
        guard kept.count > limit else { return }
        let cut = kept[mostRecentFirst()[limit - 1]].lastSeq
        kept.removeAll { $0.lastSeq < cut }
        slots.removeAll(keepingCapacity: true)
        for (i, k) in kept.enumerated() { slots[k.key] = Int32(i) }
        spilled = spilled.filter { slots[$0.key] != nil }
    }
}
