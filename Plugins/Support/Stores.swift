import Foundation

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

/// Written beside and renamed: a reader never sees half a file.
public func writeFileAtomically(_ bytes: [UInt8], to path: String) throws {
    let temporary = path + ".tmp"
    try Data(bytes).write(to: URL(fileURLWithPath: temporary))
    guard rename(temporary, path) == 0 else {
        throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
    }
}

/// The session index session-recorder keeps and `whenctl sessions` reads: a snapshot
/// (`sessions.json`) and a log of changes since (`sessions.log`, one line per record indexed,
/// written before the record is passed on, so that the index never lags the pipeline's cursor).
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

    public private(set) var entries: [SessionKey: Entry] = [:]
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
            for e in snapshot.sessions { entries[SessionKey(app: e.app, session: e.session)] = e }
        }
        if let log = FileManager.default.contents(atPath: directory + "/sessions.log") {
            let decoder = JSONDecoder()
            for line in log.split(separator: 0x0A) {
                if let change = try? decoder.decode(Change.self, from: line) { apply(change) }
            }
        }
    }

    /// Indexes one record; false if it was indexed already (a record handled again).
    @discardableResult
    mutating func apply(_ c: Change) -> Bool {
        guard c.seq > indexedThrough else { return false }
        indexedThrough = c.seq
        let key = SessionKey(app: c.app, session: c.session)
        var entry =
            entries[key]
            ?? Entry(
                app: c.app, session: c.session, firstSeq: c.seq, lastSeq: c.seq, firstTime: c.time, lastTime: c.time,
                counts: [:])
        entry.lastSeq = c.seq
        if !c.time.isEmpty { entry.lastTime = c.time }
        entry.counts[c.type, default: 0] += 1
        entries[key] = entry
        return true
    }

    /// The sessions, most recent first.
    public var sessions: [Entry] { entries.values.sorted { $0.lastSeq > $1.lastSeq } }

    /// Keeps the `limit` most recently active sessions.
    mutating func trim(to limit: Int) {
        guard entries.count > limit else { return }
        let keep = Set(sessions.prefix(limit).map { SessionKey(app: $0.app, session: $0.session) })
        entries = entries.filter { keep.contains($0.key) }
    }
}

/// Writes a `SessionIndex`: a line per record to the log, and a fresh snapshot (then an empty
/// log) every `compactEvery` lines.
public final class SessionIndexWriter {
    public private(set) var index: SessionIndex
    private var log: FileHandle?
    private var linesSinceSnapshot = 0
    private let compactEvery: Int
    private let maxSessions: Int

    public init(directory: String, compactEvery: Int = 50_000, maxSessions: Int = 100_000) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        index = SessionIndex(directory: directory)
        self.compactEvery = compactEvery
        self.maxSessions = maxSessions
        try snapshot()
    }

    deinit { try? log?.close() }

    public func record(seq: UInt64, app: String, session: String, type: String, time: String) throws {
        let change = SessionIndex.Change(seq: seq, app: app, session: session, type: type, time: time)
        guard index.apply(change) else { return }
        var line = try JSONEncoder().encode(change)
        line.append(0x0A)
        try log?.write(contentsOf: line)
        linesSinceSnapshot += 1
        if linesSinceSnapshot >= compactEvery { try snapshot() }
    }

    /// A new snapshot, renamed into place, then the log started again.
    public func snapshot() throws {
        index.trim(to: maxSessions)
        let snapshot = SessionIndex.Snapshot(indexedThrough: index.indexedThrough, sessions: index.sessions)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try writeFileAtomically(
            Array(try encoder.encode(snapshot)), to: index.directory + "/sessions.json")
        try? log?.close()
        let logPath = index.directory + "/sessions.log"
        FileManager.default.createFile(atPath: logPath, contents: nil)
        log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        linesSinceSnapshot = 0
    }
}
