import BuiltinPluginSupport
import Foundation
import WhendPluginSDK
import WhendWire

/// Derives one `screen` record per real screen view from navigation, lifecycle and app-sent
/// `screen` events, a `screen_time` record when a viewed screen goes away, and a `diagnostic`
/// record for lifecycle sequences that break the rules. The rules are in the README ("The
/// built-in plugins"). Configuration: `{"max_sessions": 100000}`.
final class ScreenTracking: WhendPlugin {
    static let name = "screen-tracking"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    private var sessions: BoundedSessions<SessionScreens>

    init(host: PluginHost, configuration: [String: Any]) throws {
        self.host = host
        sessions = BoundedSessions(limit: configuration["max_sessions"] as? Int ?? 100_000)
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        // Only these three kinds say anything about screens; other records pass untouched,
        // told apart by WhendWire's scanner without decoding them.
        if ["navigation", "lifecycle", "screen"].contains((try? StoredRecord.scan(record.bytes))?.type ?? "") {
            let fields = RecordFields(try record.object(), seq: record.seq)
            if fields.origin == nil {
                var derived: [[String: Any]] = []
                sessions.with(SessionKey(fields), seq: record.seq, make: SessionScreens.init) { state in
                    derived = state.apply(fields)
                }
                for d in derived {
                    var out = d
                    out["app"] = fields.app
                    if !fields.session.isEmpty { out["session"] = fields.session }
                    if let user = fields["user"] { out["user"] = user }
                    out["ts"] = fields.time
                    try host.emit(jsonBytes(out))
                    host.count(d["type"] as? String ?? "derived")
                }
            }
        }
        try next(record)
    }
}

/// One session's screens: the navigation stack, each screen's lifecycle phase, and the view
/// that is open (the screen on show since its appearance was counted).
struct SessionScreens {
    enum Phase { case willAppear, didAppear, willDisappear, didDisappear }

    var stack: [String] = []
    var phase: [String: Phase] = [:]
    /// Screens removed indefinitely and not presented again since.
    var removed: Set<String> = []
    /// Screens in a broken lifecycle sequence: their appearances are not views until they
    /// disappear or are presented again.
    var broken: Set<String> = []
    var current: String?
    var currentOpen = false
    var currentSince: Double?

    private var out: [[String: Any]] = []

    mutating func apply(_ r: RecordFields) -> [[String: Any]] {
        out = []
        switch r.type {
        case "navigation": navigate(r)
        case "lifecycle": lifecycle(r)
        case "screen": if let name = r["name"] { appear(name, via: "app", at: r) }
        default: break
        }
        return out
    }

    private mutating func navigate(_ r: RecordFields) {
        let screen = r["screen"]
        if let screen {
            removed.remove(screen)
            broken.remove(screen)
        }
        switch r["action"] {
        case "root":
            guard let screen else { return }
            stack = [screen]
            appear(screen, via: "navigation", at: r)
        case "push", "present":
            guard let screen else { return }
            stack.append(screen)
            appear(screen, via: "navigation", at: r)
        case "replace":
            guard let screen else { return }
            if !stack.isEmpty { stack.removeLast() }
            stack.append(screen)
            appear(screen, via: "navigation", at: r)
        case "dismiss", "pop":
            if !stack.isEmpty { stack.removeLast() }
            // The screen revealed is a screen view too (the flow-decoration proposal's case).
            if let revealed = stack.last {
                appear(revealed, via: "navigation", at: r)
            } else if let current {
                disappear(current, at: r)
            }
        default: break
        }
    }

    private mutating func lifecycle(_ r: RecordFields) {
        guard let screen = r["screen"], let status = r["status"] else { return }
        let before = phase[screen]
        switch status {
        case "willAppear":
            if r.flag("isBeingPresentedInitially") {
                removed.remove(screen)
                broken.remove(screen)
            } else if removed.contains(screen) {
                problem("reappears after being removed indefinitely, without being presented again", screen, r)
                broken.insert(screen)
            }
            phase[screen] = .willAppear
        case "didAppear":
            phase[screen] = .didAppear
            if broken.contains(screen) {
                problem("appears after being removed indefinitely, without being presented again", screen, r)
            } else if before != .willAppear {
                problem("didAppear without willAppear", screen, r)
            } else {
                appear(screen, via: "lifecycle", at: r)
            }
        case "willDisappear":
            if before != .didAppear && before != .willAppear {
                problem("willDisappear of a screen that is not on show", screen, r)
            }
            phase[screen] = .willDisappear
        case "didDisappear":
            if before != .willDisappear { problem("didDisappear without willDisappear", screen, r) }
            phase[screen] = .didDisappear
            broken.remove(screen)
            if r.flag("isBeingRemovedIndefinitely") { removed.insert(screen) }
            disappear(screen, at: r)
        default: break
        }
    }

    /// `screen` is on show: a view, unless it is the view already open.
    private mutating func appear(_ screen: String, via: String, at r: RecordFields) {
        if current == screen && currentOpen { return }
        let previous = current
        if let current, currentOpen { close(current, at: r) }
        out.append(["type": "screen", "name": screen, "previous": previous ?? NSNull(), "via": via])
        current = screen
        currentOpen = true
        currentSince = r.seconds
    }

    private mutating func disappear(_ screen: String, at r: RecordFields) {
        if current == screen && currentOpen { close(screen, at: r) }
    }

    private mutating func close(_ screen: String, at r: RecordFields) {
        var record: [String: Any] = ["type": "screen_time", "name": screen]
        if let since = currentSince, let now = r.seconds {
            record["seconds"] = (max(0, now - since) * 1000).rounded() / 1000
        }
        out.append(record)
        currentOpen = false
    }

    private mutating func problem(_ text: String, _ screen: String, _ r: RecordFields) {
        out.append([
            "type": "diagnostic", "problem": text, "screen": screen, "status": r["status"] ?? "", "cause_seq": r.seq,
        ])
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(ScreenTracking.self) }
