import BuiltinPluginSupport
import Foundation
import WhendPluginSDK

/// Keeps the last records of each session as breadcrumbs and, on a fatal `error` (or on every
/// `error` with `"on_every_error": true`), writes a crash report: a JSON file under
/// `<state>/reports/` with the error, app, session, the screen on show and the breadcrumbs,
/// oldest first. Like the seed's crash-reporting middleware, which catches what `next` throws,
/// it also reports the failure of a plugin after it in its pipeline (and passes the failure on,
/// so the pipeline retries). A report is named after the `_seq` that caused it, so a record
/// handled again after a restart rewrites the same report rather than adding one.
/// Configuration: `{"breadcrumbs": 100, "on_every_error": false, "max_sessions": 10000}`.
final class CrashReports: WhendPlugin {
    static let name = "crash-reports"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    private let breadcrumbLimit: Int
    private let onEveryError: Bool
    private let directory: String
    private var sessions: BoundedSessions<Trail>

    struct Trail {
        var breadcrumbs: [[String: Any]] = []
        var screen: String?
    }

    init(host: PluginHost, configuration: [String: Any]) throws {
        self.host = host
        breadcrumbLimit = max(1, configuration["breadcrumbs"] as? Int ?? 100)
        onEveryError = configuration["on_every_error"] as? Bool ?? false
        sessions = BoundedSessions(limit: configuration["max_sessions"] as? Int ?? 10_000)
        directory = CrashReportStore.directory(pluginState: host.stateDirectory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        let fields = RecordFields(try record.object(), seq: record.seq)
        let key = SessionKey(fields)
        let limit = breadcrumbLimit
        let trail = sessions.with(key, seq: record.seq, make: Trail.init) { trail -> Trail in
            let before = trail
            if let screen = Self.screen(shownBy: fields) { trail.screen = screen }
            if fields.origin == nil || fields.type == "screen" {
                trail.breadcrumbs.append(Self.breadcrumb(fields))
                if trail.breadcrumbs.count > limit { trail.breadcrumbs.removeFirst(trail.breadcrumbs.count - limit) }
            }
            return before
        }
        if fields.type == "error", fields.origin == nil, fields.flag("fatal") || onEveryError {
            try write(kind: "error", fields: fields, trail: trail, error: Self.errorPart(fields))
        }
        do {
            try next(record)
        } catch {
            try? write(
                kind: "plugin_failure", fields: fields, trail: trail,
                error: ["message": "a plugin after crash-reports failed on _seq \(record.seq): \(error)"])
            throw error
        }
    }

    private func write(kind: String, fields: RecordFields, trail: Trail, error: [String: Any]) throws {
        var report: [String: Any] = [
            "kind": kind, "seq": fields.seq, "app": fields.app, "session": fields.session, "time": fields.time,
            "error": error, "breadcrumbs": trail.breadcrumbs,
        ]
        if let screen = (fields.type == "error" ? fields["screen"] : nil) ?? trail.screen { report["screen"] = screen }
        if let user = fields["user"] { report["user"] = user }
        let name = CrashReportStore.fileName(seq: fields.seq, kind: kind)
        try writeFileAtomically(jsonBytes(report), to: directory + "/" + name)
        host.count("reports_\(kind)")
        host.log(
            .warning, "crash report \(name): \(fields.app)/\(fields.session) on \(report["screen"] ?? "no screen")")
    }

    /// The screen a record says is on show.
    static func screen(shownBy r: RecordFields) -> String? {
        switch r.type {
        case "screen": return r["name"]
        case "lifecycle": return r["status"] == "didAppear" ? r["screen"] : nil
        case "navigation":
            return ["root", "push", "present", "replace"].contains(r["action"] ?? "") ? r["screen"] : nil
        default: return nil
        }
    }

    static func breadcrumb(_ r: RecordFields) -> [String: Any] {
        var crumb: [String: Any] = ["seq": r.seq, "type": r.type, "time": r.time]
        for key in ["name", "screen", "status", "action", "params", "message"] { crumb[key] = r.object[key] }
        return crumb
    }

    static func errorPart(_ r: RecordFields) -> [String: Any] {
        var error: [String: Any] = [:]
        for key in ["message", "name", "screen", "stack", "fatal"] { error[key] = r.object[key] }
        return error
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(CrashReports.self) }
