import Foundation
import WhendSystem
import WhendWire

/// Where crash-reports keeps its reports, and how they are named: shared by the plugin and by
/// `whenctl crashes`.
package enum CrashReportStore {
    package static func directory(pluginState: String) -> String { pluginState + "/reports" }

    /// The plugin's state directory under whend's: `<state>/plugins/crash-reports`.
    package static func directory(stateDirectory: String) -> String {
        directory(pluginState: stateDirectory + "/plugins/crash-reports")
    }

    package static func fileName(seq: UInt64, kind: String) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + "-" + kind + ".json"
    }
}

/// Written beside, synced and renamed (`DurableFile`): a reader, or whend after a power cut,
/// never sees half a file.
package func writeFileAtomically(_ bytes: [UInt8], to path: String) throws {
    try DurableFile.replace(path, with: bytes)
}

/// The session index session-recorder keeps and `whenctl sessions` reads. The plugin keeps it
/// as its state, saved with its pipeline's cursor; every so often it exports it to
/// `sessions.json` (with the `_seq` it is complete through), and `whenctl sessions` completes
/// that export from the journal, so that the listing is always as new as the journal. A
/// `sessions.log` of changes after the export, which earlier versions wrote, is still read.
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

    struct Snapshot: Codable {
        var indexedThrough: UInt64
        var sessions: [Entry]
    }

    struct Change: Codable {
        var seq: UInt64
        var app: String
        var session: String
        var type: String
        var time: String
    }

    /// By session: the digest of app and session, so that a record finds its entry without
    /// building strings.
    package private(set) var entries: [SessionDigest: Entry] = [:]
    package private(set) var indexedThrough: UInt64 = 0
    package let directory: String
    /// The apps of the sessions indexed so far, each once: a session's `app` is this copy,
    /// not a string of its own (one of 64 bytes per session where a name passes 15 bytes;
    /// a few apps have thousands of sessions).
    private var apps: [String] = []

    /// `app`, as the copy kept in `apps` when there is one.
    private mutating func sharedApp(_ app: String) -> String {
        if let kept = apps.first(where: { $0 == app }) { return kept }
        if apps.count < 64 { apps.append(app) }
        return app
    }

    package static func directory(stateDirectory: String) -> String { stateDirectory + "/plugins/session-recorder" }

    /// An index built elsewhere (a plugin's saved state).
    package init(directory: String, indexedThrough: UInt64, entries: [SessionDigest: Entry]) {
        self.directory = directory
        self.indexedThrough = indexedThrough
        self.entries = entries
    }

    /// Reads the export and replays the log after it, if an earlier version left one.
    package init(directory: String) {
        self.directory = directory
        if let data = FileManager.default.contents(atPath: directory + "/sessions.json"),
            let snapshot = try? JSONDecoder().decode(Snapshot.self, from: data)
        {
            indexedThrough = snapshot.indexedThrough
            for e in snapshot.sessions { entries[SessionDigest(app: e.app, session: e.session)] = e }
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
        if let index = entries.index(forKey: key) {
            entries.values[index].lastSeq = seq
            if !now.isEmpty { entries.values[index].lastTime = now }
            entries.values[index].counts.add(type)
        } else {
            entries[key] = Entry(
                app: sharedApp(app()), session: sessionID(), firstSeq: seq, lastSeq: seq, firstTime: now,
                lastTime: now, counts: [type: 1])
        }
        return true
    }

    /// The last session indexed through `apply(seq:session:app:sessionID:type:time:)` with a
    /// JSON time, where it is in `entries`, and its newest time not yet made a `String` (the
    /// JSON value as stored; empty for none): a session's records come in runs, and each one
    /// cost a lookup by hash and a `String` of its time, allocated, that the next replaced.
    private var pendingKey: SessionDigest?
    private var pendingIndex: [SessionDigest: Entry].Index?
    private var pendingTime: [UInt8] = []

    /// Gives the last session indexed its newest time: before `entries` is read for its times,
    /// or changed other than by `apply`.
    package mutating func settle() {
        guard let index = pendingIndex else { return }
        if !pendingTime.isEmpty {
            let now = pendingTime.withUnsafeBufferPointer { JSONValue(raw: $0).string ?? "" }
            if !now.isEmpty { entries.values[index].lastTime = now }
            pendingTime.removeAll(keepingCapacity: true)
        }
        pendingKey = nil
        pendingIndex = nil
    }

    /// `apply(seq:session:app:sessionID:type:time:)` with the time as a JSON value as stored (a
    /// string counts, anything else is no time): the same index, its newest time kept as bytes
    /// until `settle()`.
    @discardableResult
    package mutating func apply(
        seq: UInt64, session key: SessionDigest, app: () -> String, sessionID: () -> String, type: String,
        time: JSONValue?
    ) -> Bool {
        guard seq > indexedThrough else { return false }
        if key != pendingKey {
            settle()
            guard let index = entries.index(forKey: key) else {
                return apply(
                    seq: seq, session: key, app: app, sessionID: sessionID, type: type,
                    time: { time?.kind == .string ? time?.string ?? "" : "" })
            }
            pendingKey = key
            pendingIndex = index
        }
        indexedThrough = seq
        let index = pendingIndex!
        entries.values[index].lastSeq = seq
        // Only a string that is not empty replaces the last time (an empty one is no time).
        if let time, time.kind == .string, time.raw.count > 2 {
            pendingTime.removeAll(keepingCapacity: true)
            pendingTime.append(contentsOf: time.raw)
        }
        entries.values[index].counts.add(type)
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

    /// The snapshot as `Snapshot`'s Codable form reads it, written directly: JSONEncoder took a
    /// fifth of a replay's time for an index of 10,000 sessions; sorting the entries themselves
    /// (copying each) and a writer per entry, most of what was left.
    func snapshotJSON() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64 + entries.count * 224)
        out += #"{"indexedThrough":"#.utf8
        JSONBytes.appendDecimal(indexedThrough, to: &out)
        out += #","sessions":["#.utf8
        for (n, index) in mostRecentFirst().enumerated() {
            let e = entries[index].value
            out += (n > 0 ? #",{"app":"# : #"{"app":"#).utf8
            appendJSONString(e.app.utf8, to: &out)
            out += #","counts":{"#.utf8
            for (j, (type, count)) in e.counts.enumerated() {
                if j > 0 { out.append(UInt8(ascii: ",")) }
                appendJSONString(type.utf8, to: &out)
                out.append(UInt8(ascii: ":"))
                JSONBytes.appendDecimal(UInt64(count), to: &out)
            }
            out += #"},"firstSeq":"#.utf8
            JSONBytes.appendDecimal(e.firstSeq, to: &out)
            out += #","firstTime":"#.utf8
            appendJSONString(e.firstTime.utf8, to: &out)
            out += #","lastSeq":"#.utf8
            JSONBytes.appendDecimal(e.lastSeq, to: &out)
            out += #","lastTime":"#.utf8
            appendJSONString(e.lastTime.utf8, to: &out)
            out += #","session":"#.utf8
            appendJSONString(e.session.utf8, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out += "]}".utf8
        return out
    }

    /// Where each session is, most recent first. Sorted as plain numbers: a sort of the entries
    /// themselves copied (and retained) each one.
    package func mostRecentFirst() -> [[SessionDigest: Entry].Index] {
        var order: [(lastSeq: UInt64, index: [SessionDigest: Entry].Index)] = []
        order.reserveCapacity(entries.count)
        var i = entries.startIndex
        while i != entries.endIndex {
            order.append((entries[i].value.lastSeq, i))
            entries.formIndex(after: &i)
        }
        order.sort { $0.lastSeq > $1.lastSeq }
        return order.map(\.index)
    }

    /// The sessions, most recent first.
    package var sessions: [Entry] { mostRecentFirst().map { entries[$0].value } }

    /// Keeps the `limit` most recently active sessions.
    mutating func trim(to limit: Int) {
        settle()
        guard entries.count > limit else { return }
        let cut = entries[mostRecentFirst()[limit - 1]].value.lastSeq
        entries = entries.filter { $0.value.lastSeq >= cut }
    }
}

/// A session's records counted by type: the few types a session has (five in `make bench`'s
/// journeys), in a sorted array rather than a dictionary: one allocation of ~160 bytes where a
/// dictionary's header, bitmap and eight buckets took ~256, for every session indexed. Reads,
/// saves and exports as `[String: Int]` did, in the same order.
package struct TypeCounts: Codable, Equatable, Sendable, Sequence, ExpressibleByDictionaryLiteral {
    private struct Pair: Equatable, Sendable {
        var type: String
        var count: Int
    }

    /// By type, ascending: each type once.
    private var pairs: [Pair] = []

    package init() {}

    package init(dictionaryLiteral elements: (String, Int)...) {
        for (type, count) in elements { self[type] = count }
    }

    package var count: Int { pairs.count }
    package var keys: [String] { pairs.map(\.type) }
    package var values: [Int] { pairs.map(\.count) }

    private func position(of type: String) -> (index: Int, found: Bool) {
        var low = 0
        var high = pairs.count
        while low < high {
            let middle = (low + high) / 2
            if pairs[middle].type < type { low = middle + 1 } else { high = middle }
        }
        return (low, low < pairs.count && pairs[low].type == type)
    }

    package subscript(type: String) -> Int? {
        get {
            let (index, found) = position(of: type)
            return found ? pairs[index].count : nil
        }
        set {
            let (index, found) = position(of: type)
            switch (newValue, found) {
            case (let count?, true): pairs[index].count = count
            case (let count?, false): pairs.insert(Pair(type: type, count: count), at: index)
            case (nil, true): pairs.remove(at: index)
            case (nil, false): break
            }
        }
    }

    /// One more record of `type`.
    package mutating func add(_ type: String) {
        let (index, found) = position(of: type)
        if found { pairs[index].count += 1 } else { pairs.insert(Pair(type: type, count: 1), at: index) }
    }

    package func makeIterator() -> some IteratorProtocol<(key: String, value: Int)> {
        pairs.lazy.map { (key: $0.type, value: $0.count) }.makeIterator()
    }

    package init(from decoder: any Decoder) throws {
        for (type, count) in try [String: Int](from: decoder) { self[type] = count }
    }

    package func encode(to encoder: any Encoder) throws {
        try Dictionary(uniqueKeysWithValues: pairs.map { ($0.type, $0.count) }).encode(to: encoder)
    }
}

/// Keeps a `SessionIndex` and exports it to `sessions.json` every `exportEvery` records
/// indexed (at least eight per session kept, so that an export's cost per record stays the same
/// however many sessions there are) and when closed.
package final class SessionIndexExport {
    /// Unchecked exclusivity: its plugin instance calls it on one thread at a time, for every
    /// record.
    @exclusivity(unchecked) private var kept: SessionIndex
    /// The index, its last session's newest time given to it.
    package var index: SessionIndex {
        get {
            kept.settle()
            return kept
        }
        set { kept = newValue }
    }
    @exclusivity(unchecked) private var sinceExport = 0
    private let exportEvery: Int
    private let maxSessions: Int

    package init(directory: String, exportEvery: Int = 1_000_000, maxSessions: Int = 100_000) throws {
        try DurableFile.createDirectory(directory)
        kept = SessionIndex(directory: directory)
        self.exportEvery = exportEvery
        self.maxSessions = maxSessions
    }

    /// Indexes a record. `app`, `session` and `time` are JSON values as stored; true when the
    /// index is due for an export.
    package func record(
        seq: UInt64, session key: SessionDigest, app: JSONValue, session: JSONValue, type: String, time: JSONValue?
    ) -> Bool {
        guard
            kept.apply(
                seq: seq, session: key, app: { app.string ?? "" }, sessionID: { session.string ?? "" }, type: type,
                time: time)
        else { return false }
        sinceExport += 1
        if kept.entries.count > maxSessions + maxSessions / 10 + 1 { kept.trim(to: maxSessions) }
        return sinceExport >= max(exportEvery, 8 * kept.entries.count)
    }

    /// Writes `sessions.json` (synced, renamed into place), then drops a log an earlier
    /// version left, which the export now holds.
    package func export() throws {
        kept.trim(to: maxSessions)
        try writeFileAtomically(kept.snapshotJSON(), to: kept.directory + "/sessions.json")
        sinceExport = 0
        let log = kept.directory + "/sessions.log"
        if FileManager.default.fileExists(atPath: log) { try? FileManager.default.removeItem(atPath: log) }
    }
}
