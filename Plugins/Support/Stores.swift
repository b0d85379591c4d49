import Foundation
import WhendWire

/// Where crash-reports keeps its reports, and how they are named: shared by the plugin and by
/// `whenctl crashes`.
public enum CrashReportStore {
    public static func directory(pluginState: String) -> String { pluginState + "/reports" }

    /// The plugin's state directory under whend's: `<state>/plugins/crash-reports`.
    public static func directory(stateDirectory: String) -> String {
        directory(pluginState: stateDirectory + "/plugins/crash-reports")
    }

    public static func fileName(seq: UInt64, kind: String) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + "-" + kind + ".json"
    }
}

/// Written beside, synced and renamed (`DurableFile`): a reader, or whend after a power cut,
/// never sees half a file.
public func writeFileAtomically(_ bytes: [UInt8], to path: String) throws {
    try DurableFile.replace(path, with: bytes)
}

/// The session index session-recorder keeps and `whenctl sessions` reads: a snapshot
/// (`sessions.json`) and a log of changes since (`sessions.log`, one line per record indexed).
/// session-recorder writes the log before it lets the pipeline's cursor pass the records, so
/// that the index never lags the cursor.
public struct SessionIndex {
    public struct Entry: Codable, Equatable, Sendable {
        public var app: String
        public var session: String
        public var firstSeq: UInt64
        public var lastSeq: UInt64
        public var firstTime: String
        public var lastTime: String
        public var counts: [String: Int]
        public var records: Int { counts.values.reduce(0, +) }
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
    public private(set) var entries: [SessionDigest: Entry] = [:]
    public private(set) var indexedThrough: UInt64 = 0
    public let directory: String

    public static func directory(stateDirectory: String) -> String { stateDirectory + "/plugins/session-recorder" }

    /// Reads the snapshot and replays the log after it.
    public init(directory: String) {
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
    public mutating func apply(
        seq: UInt64, session key: SessionDigest, app: () -> String, sessionID: () -> String, type: String,
        time: () -> String
    ) -> Bool {
        guard seq > indexedThrough else { return false }
        indexedThrough = seq
        let now = time()
        if let index = entries.index(forKey: key) {
            entries.values[index].lastSeq = seq
            if !now.isEmpty { entries.values[index].lastTime = now }
            entries.values[index].counts[type, default: 0] += 1
        } else {
            entries[key] = Entry(
                app: app(), session: sessionID(), firstSeq: seq, lastSeq: seq, firstTime: now, lastTime: now,
                counts: [type: 1])
        }
        return true
    }

    /// The snapshot as `Snapshot`'s Codable form reads it, written directly: JSONEncoder took a
    /// fifth of a replay's time for an index of 10,000 sessions.
    func snapshotJSON() -> [UInt8] {
        var out = Array(#"{"indexedThrough":"#.utf8)
        appendDecimal(indexedThrough, to: &out)
        out += #","sessions":["#.utf8
        for (i, e) in sessions.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            var entry = JSONObjectWriter(capacity: 256)
            entry.string("app", e.app)
            var counts = Array("{".utf8)
            for (j, (type, n)) in e.counts.sorted(by: { $0.key < $1.key }).enumerated() {
                if j > 0 { counts.append(UInt8(ascii: ",")) }
                appendJSONString(type.utf8, to: &counts)
                counts.append(UInt8(ascii: ":"))
                appendDecimal(UInt64(n), to: &counts)
            }
            counts.append(UInt8(ascii: "}"))
            entry.raw("counts", counts)
            entry.number("firstSeq", e.firstSeq)
            entry.string("firstTime", e.firstTime)
            entry.number("lastSeq", e.lastSeq)
            entry.string("lastTime", e.lastTime)
            entry.string("session", e.session)
            out += entry.bytes
        }
        out += "]}".utf8
        return out
    }

    /// The sessions, most recent first.
    public var sessions: [Entry] { entries.values.sorted { $0.lastSeq > $1.lastSeq } }

    /// Keeps the `limit` most recently active sessions.
    mutating func trim(to limit: Int) {
        guard entries.count > limit else { return }
        let cut = entries.values.map(\.lastSeq).sorted(by: >)[limit - 1]
        entries = entries.filter { $0.value.lastSeq >= cut }
    }
}

/// Writes a `SessionIndex`: a line per record to the log, buffered until `flush()`, and a fresh
/// snapshot (then an empty log) every `compactEvery` lines.
public final class SessionIndexWriter {
    public private(set) var index: SessionIndex
    private var log: Int32 = -1
    private var buffer: [UInt8] = []
    private var linesSinceSnapshot = 0
    private let compactEvery: Int
    private let maxSessions: Int

    public init(directory: String, compactEvery: Int = 200_000, maxSessions: Int = 100_000) throws {
        try DurableFile.createDirectory(directory)
        index = SessionIndex(directory: directory)
        self.compactEvery = compactEvery
        self.maxSessions = maxSessions
        try snapshot()
    }

    deinit { if log >= 0 { close(log) } }

    /// Indexes a record; its log line is written by the next `flush()`. `app`, `session` and
    /// `time` are JSON string values as stored (quotes included).
    public func record(
        seq: UInt64, session key: SessionDigest, app: JSONValue, session: JSONValue, type: String, time: JSONValue?
    ) throws {
        let timeText = { time?.string ?? "" }
        guard
            index.apply(
                seq: seq, session: key, app: { app.string ?? "" }, sessionID: { session.string ?? "" }, type: type,
                time: timeText)
        else { return }
        // Written straight into the buffer, keys as `Change` decodes them.
        buffer += #"{"app":"#.utf8
        buffer += app.raw
        buffer += #","seq":"#.utf8
        appendDecimal(seq, to: &buffer)
        buffer += #","session":"#.utf8
        buffer += session.raw
        buffer += #","time":"#.utf8
        if let time, time.kind == .string { buffer += time.raw } else { buffer += #""""#.utf8 }
        buffer += #","type":"#.utf8
        appendJSONString(type.utf8, to: &buffer)
        buffer += "}\n".utf8
        linesSinceSnapshot += 1
        // A snapshot costs the whole index: taken after at least four lines per session, its
        // cost per record stays the same however many sessions there are.
        if linesSinceSnapshot >= max(compactEvery, 4 * index.entries.count)
            || index.entries.count > maxSessions + maxSessions / 10 + 1
        {
            try snapshot()
        }
    }

    public var buffered: Int { buffer.count }

    /// Writes the buffered log lines. Throws when the file system refuses them; they stay
    /// buffered for the next attempt.
    public func flush() throws {
        var done = 0
        while done < buffer.count {
            let n = buffer.withUnsafeBytes { write(log, $0.baseAddress! + done, $0.count - done) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                buffer.removeFirst(done)
                throw CocoaError(
                    .fileWriteUnknown,
                    userInfo: [NSFilePathErrorKey: index.directory + "/sessions.log", "errno": errno])
            }
            done += n
        }
        buffer.removeAll(keepingCapacity: true)
    }

    /// A new snapshot, renamed into place, then the log started again (what is buffered is
    /// in the snapshot already).
    public func snapshot() throws {
        index.trim(to: maxSessions)
        try writeFileAtomically(index.snapshotJSON(), to: index.directory + "/sessions.json")
        if log >= 0 { close(log) }
        let logPath = index.directory + "/sessions.log"
        log = open(logPath, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o644)
        guard log >= 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: logPath, "errno": errno])
        }
        buffer.removeAll(keepingCapacity: true)
        linesSinceSnapshot = 0
    }
}
