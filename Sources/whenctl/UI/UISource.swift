import BuiltinPluginSupport
import Foundation
import NIOCore
import WhendControl
import WhendJournal
import WhendWire

/// What the page shows, from where this user may read it: records through subscriptions on the
/// event socket, status and metrics through the control socket (`ControlOptions`, as every
/// whenctl command asks), sessions and crash reports from the state directory.
struct UISource: Sendable {
    let control: ControlOptions
    let eventSocket: String
    let sampler: UISampler
    let stateDirectory: String

    func overview() -> [String: Any] { sampler.overview() }

    func metrics() throws -> String {
        let answer = try control.answer(.metrics, timeout: 10)
        guard answer.ok else { throw Failure(answer.error ?? "whend refused metrics") }
        return answer.metrics ?? ""
    }

    /// The events whend refused lately (`whenctl rejections`), or why they cannot be shown:
    /// `{"available": false, "reason": …}`, from a whend that does not know the command too.
    func rejections() -> [String: Any] {
        let answer: ControlAnswer
        do {
            answer = try control.answer(.rejections, timeout: 10)
        } catch {
            return ["available": false, "reason": "\(error)"]
        }
        guard answer.ok else {
            let error = answer.error ?? ""
            if error.contains("unknown command") {
                return ["available": false, "reason": "not available from this whend (it has no rejections command)"]
            }
            return ["available": false, "reason": error.isEmpty ? "whend refused rejections" : error]
        }
        let list =
            (try? JSONEncoder().encode(answer.rejections ?? [])).flatMap { try? JSONSerialization.jsonObject(with: $0) }
            ?? []
        return ["available": true, "rejections": list]
    }

    /// The tracking plan's violations (`whenctl plan violations`), or why they cannot be shown.
    func planViolations() -> [String: Any] {
        let answer: ControlAnswer
        do {
            answer = try control.answer(.planViolations, timeout: 10)
        } catch {
            return ["available": false, "reason": "\(error)"]
        }
        guard answer.ok, let report = answer.planViolations else {
            let error = answer.error ?? ""
            if error.contains("unknown command") || answer.ok {
                return ["available": false, "reason": "not available from this whend (it has no tracking plan)"]
            }
            return ["available": false, "reason": error.isEmpty ? "whend refused plan-violations" : error]
        }
        let object = (try? JSONEncoder().encode(report)).flatMap { try? JSONSerialization.jsonObject(with: $0) }
        return ["available": true, "report": object ?? [:]]
    }

    /// session-recorder's sessions, most recent first (at most 500), or why there are none.
    func sessions(app: String?) -> [String: Any] {
        let index: SessionIndex
        do {
            let journal = JournalDirectory(stateDirectory: stateDirectory)
            index = try currentSessionIndex(
                stateDirectory: stateDirectory,
                journal: FileManager.default.fileExists(atPath: journal.path) ? journal : nil
            ) { _ in }
        } catch {
            return ["sessions": [], "problem": "\(error)"]
        }
        let encoder = JSONEncoder()
        // Listed as session-recorder lists them (and whenctl sessions): under its max_sessions.
        let listed = index.sessions
        let sessions = listed.filter { app == nil || app == "" || $0.app == app }.prefix(500)
            .compactMap { entry -> Any? in
                (try? encoder.encode(entry)).flatMap { try? JSONSerialization.jsonObject(with: $0) }
            }
        return ["sessions": Array(sessions), "count": listed.count, "indexed_through": index.indexedThrough]
    }

    private var crashDirectory: String { CrashReportStore.directory(stateDirectory: stateDirectory) }

    private func crashFiles() -> [(file: String, path: String)] {
        CrashReportStore.reports(stateDirectory: stateDirectory)
    }

    /// crash-reports' reports, newest first: `{"reports": [{seq, kind, app, session, time, screen, message}]}`.
    func crashes() -> [String: Any] {
        var reports: [[String: Any]] = []
        for (file, path) in crashFiles().reversed() {
            guard let data = FileManager.default.contents(atPath: path),
                let r = foundationObject(data)
            else { continue }
            let error = r["error"] as? [String: Any] ?? [:]
            reports.append([
                "file": file, "seq": r["seq"] ?? 0, "kind": r["kind"] ?? "", "app": r["app"] ?? "",
                "session": r["session"] ?? "", "time": r["time"] ?? "", "screen": r["screen"] ?? NSNull(),
                "message": error["message"] ?? "", "breadcrumbs": (r["breadcrumbs"] as? [Any])?.count ?? 0,
            ])
        }
        var out: [String: Any] = ["reports": reports, "directory": crashDirectory]
        if reports.isEmpty, !FileManager.default.fileExists(atPath: crashDirectory) {
            out["problem"] =
                "no crash reports in \(crashDirectory): the crash-reports plugin writes them (pipeline `crashes`)"
        }
        return out
    }

    /// One report as crash-reports wrote it, breadcrumbs and all.
    func crash(seq: UInt64) -> [String: Any]? {
        let prefix = String(CrashReportStore.fileName(seq: seq, kind: "").dropLast(5))
        guard let report = crashFiles().first(where: { $0.file.hasPrefix(prefix) }),
            let data = FileManager.default.contents(atPath: report.path)
        else { return nil }
        return foundationObject(data)
    }

    /// The journal's last `_seq`: as whend's status said it lately, else as a subscription from
    /// now says where it starts (for a user the control socket does not serve).
    func lastSeq() async throws -> UInt64 {
        if let last = sampler.lastSeq { return last }
        var last: UInt64 = 0
        try await UISubscription.read(socket: eventSocket, request: SubscribeRequest()) { item in
            if case .line(let line) = item, case .subscribed(let after) = UISubscription.event(line) {
                last = after ?? 0
            }
            return false
        }
        return last
    }

    enum RecordLookup {
        case found([UInt8])
        case missing(String)
    }

    /// The record `seq`, as stored: the first a subscription after `seq - 1` gives.
    func record(seq: UInt64) async throws -> RecordLookup {
        var result = RecordLookup.missing("no record #\(seq): the journal does not hold it (yet, or any more)")
        var request = SubscribeRequest()
        request.start = .after(seq - 1)
        do {
            try await UISubscription.read(socket: eventSocket, request: request) { item in
                guard case .line(let line) = item else { return false }
                switch UISubscription.event(line) {
                case .record(let got, let line):
                    if got == seq { result = .found(line) }
                    return false
                case .subscribed, nil:
                    return true
                case .error(_, let message):
                    result = .missing(message)
                    return false
                case .caughtUp, .checkpoint, .gap:
                    return false
                }
            }
        } catch {
            return .missing("cannot reach whend at \(eventSocket) (\(error))")
        }
        return result
    }

    /// The screen flow of `app` (every app's when nil), as `whenctl flow` builds it: screen-tracking's
    /// views, each naming its previous screen; a session without any, from the app's own screen
    /// events in order. `{"apps", "app_views": {app: screen records}, "nodes": [{name, views}], "edges": [{from, to, count}], "problem"?}`.
    func flow(app: String?) async throws -> [String: Any] {
        struct Edge: Hashable {
            var from: String
            var to: String
        }
        var derived: [Edge: Int] = [:]
        var derivedSessions: Set<String> = []
        var appViews: [String: [String]] = [:]
        var apps: [String: Int] = [:]
        var problem: String?
        var request = SubscribeRequest()
        request.start = .oldest
        request.types = ["screen"]
        request.app = app.map { Array($0.utf8) }
        do {
            try await UISubscription.read(socket: eventSocket, request: request, idle: .seconds(60)) { item in
                guard case .line(let line) = item else { return true }
                switch UISubscription.event(line) {
                case .record(_, let line):
                    guard let r = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any],
                        let name = r["name"] as? String
                    else { return true }
                    let recordApp = r["app"] as? String ?? ""
                    apps[recordApp, default: 0] += 1
                    let session = recordApp + "\u{0}" + (r["session"] as? String ?? "")
                    if r["_origin"] as? String == "screen-tracking" {
                        derived[Edge(from: r["previous"] as? String ?? "(start)", to: name), default: 0] += 1
                        derivedSessions.insert(session)
                    } else if r["_origin"] == nil {
                        appViews[session, default: []].append(name)
                    }
                    return true
                case .error(_, let message):
                    problem = message
                    return false
                case .caughtUp:
                    return false
                case .subscribed, .checkpoint, .gap, nil:
                    return true
                }
            }
        } catch {
            problem = "cannot reach whend at \(eventSocket) (\(error))"
        }
        var edges = derived
        for (session, views) in appViews where !derivedSessions.contains(session) {
            for (i, name) in views.enumerated() {
                edges[Edge(from: i == 0 ? "(start)" : views[i - 1], to: name), default: 0] += 1
            }
        }
        var views: [String: Int] = [:]
        for (edge, count) in edges { views[edge.to, default: 0] += count }
        if edges.keys.contains(where: { $0.from == "(start)" }) { views["(start)", default: 0] += 0 }
        var out: [String: Any] = [
            "apps": apps.keys.sorted(), "app_views": apps,
            "nodes": views.sorted { $0.key < $1.key }.map { ["name": $0.key, "views": $0.value] },
            "edges": edges.sorted { $0.value > $1.value }.map {
                ["from": $0.key.from, "to": $0.key.to, "count": $0.value]
            },
        ]
        if let problem { out["problem"] = problem }
        return out
    }
}
