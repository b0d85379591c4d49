import BuiltinPluginSupport
import WhendPluginSDK

/// Indexes sessions — app, session, first and last `_seq`, time span, counts by type — so that
/// `whenctl sessions` lists them at once and a session's records are read from its first `_seq`
/// rather than by scanning the whole journal. Configuration: `{"max_sessions": 100000}`.
final class SessionRecorder: WhendPlugin {
    static let name = "session-recorder"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let writer: SessionIndexWriter

    init(host: PluginHost, configuration: [String: Any]) throws {
        writer = try SessionIndexWriter(
            directory: host.stateDirectory, maxSessions: configuration["max_sessions"] as? Int ?? 100_000)
        host.log(.info, "\(writer.index.entries.count) sessions indexed through _seq \(writer.index.indexedThrough)")
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        let fields = RecordFields(try record.object(), seq: record.seq)
        if !fields.session.isEmpty {
            try writer.record(
                seq: record.seq, app: fields.app, session: fields.session, type: fields.type, time: fields.time)
        }
        try next(record)
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(SessionRecorder.self) }
