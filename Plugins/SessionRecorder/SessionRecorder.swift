import BuiltinPluginSupport
import Foundation
import WhendPluginSDK

/// Indexes sessions — app, session, first and last `_seq`, time span, counts by type — so that
/// `whenctl sessions` lists them at once and a session's records are read from its first `_seq`
/// rather than by scanning the whole journal. Configuration: `{"max_sessions": 100000}`.
///
/// The index is the plugin's state, saved with its pipeline's cursor (so a restart resumes it
/// exactly), and exported to `sessions.json` every so often and when the plugin closes;
/// `whenctl sessions` completes the export from the journal.
final class SessionRecorder: PersistentStatePlugin {
    static let name = "session-recorder"
    static let version = "2.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    // Unchecked exclusivity on the properties every record touches: an instance is called on
    // one thread at a time, and the runtime's checks cost a twentieth of its time.
    @exclusivity(unchecked) private var sessionIDs = SessionIDCache()
    private let index: SessionIndexExport

    var state: SavedSessionIndex {
        get { SavedSessionIndex(index: index.index) }
        set {
            index.index = newValue.index.moved(to: index.index.directory)
        }
    }

    init(host: PluginHost, configuration: [String: Any]) throws {
        self.host = host
        index = try SessionIndexExport(
            directory: host.stateDirectory, maxSessions: configuration["max_sessions"] as? Int ?? 100_000)
        host.log(.info, "\(index.index.count) sessions indexed through _seq \(index.index.indexedThrough)")
        // At once if there is none yet: readers find the index, and complete it from the journal.
        if !FileManager.default.fileExists(atPath: host.stateDirectory + "/sessions.json") { export() }
    }

    deinit { export() }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        if let app = record[.app], let session = record[.session], session.stringContents?.isEmpty == false,
            index.record(
                seq: record.seq, session: sessionIDs.id(of: record), app: app, session: session,
                type: record[.type], time: record.time)
        {
            export()
        }
        try next(record)
    }

    /// The export is for readers, who complete it from the journal: one that fails is said and
    /// tried again at the next, never a reason to hold the pipeline.
    private func export() {
        do {
            try index.export()
        } catch {
            host.log(.error, "session-recorder: cannot write \(index.index.directory)/sessions.json: \(error)")
        }
    }
}

/// The index as saved with the pipeline's cursor: compact, each session's strings and counts.
struct SavedSessionIndex: Codable, CompactCodable {
    var index: SessionIndex

    init(index: SessionIndex) { self.index = index }

    func encode(to writer: inout CompactWriter) {
        writer.write(index.indexedThrough)
        writer.write(UInt64(index.count))
        // Most recent first: the same index saves the same bytes.
        for position in index.mostRecentFirst() {
            let (key, e) = index.entry(at: position)
            key.encode(to: &writer)
            writer.write(e.app)
            writer.write(e.session)
            writer.write(e.firstSeq)
            writer.write(e.lastSeq)
            writer.write(e.firstTime)
            writer.write(e.lastTime)
            writer.write(UInt64(e.counts.count))
            for (type, n) in e.counts {
                writer.write(type)
                writer.write(n)
            }
        }
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        let through = try reader.read(UInt64.self)
        let count = try reader.readCount()
        var entries: [SessionDigest: SessionIndex.Entry] = [:]
        entries.reserveCapacity(count)
        for _ in 0..<count {
            let key = try SessionDigest(from: &reader)
            let app = try reader.read(String.self)
            let session = try reader.read(String.self)
            let firstSeq = try reader.read(UInt64.self)
            let lastSeq = try reader.read(UInt64.self)
            let firstTime = try reader.read(String.self)
            let lastTime = try reader.read(String.self)
            var counts = TypeCounts()
            for _ in 0..<(try reader.readCount()) { counts[try reader.read(String.self)] = try reader.read(Int.self) }
            entries[key] = SessionIndex.Entry(
                app: app, session: session, firstSeq: firstSeq, lastSeq: lastSeq, firstTime: firstTime,
                lastTime: lastTime, counts: counts)
        }
        index = SessionIndex(directory: "", indexedThrough: through, entries: entries)
    }

    private enum CodingKeys: String, CodingKey { case indexedThrough, sessions }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        var entries: [SessionDigest: SessionIndex.Entry] = [:]
        for e in try c.decode([SessionIndex.Entry].self, forKey: .sessions) {
            entries[SessionDigest(app: e.app, session: e.session)] = e
        }
        index = SessionIndex(
            directory: "", indexedThrough: try c.decode(UInt64.self, forKey: .indexedThrough), entries: entries)
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(index.indexedThrough, forKey: .indexedThrough)
        try c.encode(index.allSessions, forKey: .sessions)
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(SessionRecorder.self) }
