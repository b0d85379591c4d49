import WhendPluginSDK

/// Derives one `screen` record per real screen view from navigation, lifecycle and app-sent
/// `screen` events, a `screen_time` record when a viewed screen goes away, and a `diagnostic`
/// record for lifecycle sequences that break the rules. The rules are in docs/plugins.md ("The
/// built-in plugins"). Configuration: `{"max_sessions": 100000}`.
final class ScreenTracking: PersistentStatePlugin {
    static let name = "screen-tracking"
    static let version = "1.1.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    // Unchecked exclusivity on the properties every record touches: an instance is called on
    // one thread at a time, and the runtime's checks cost a twentieth of its time.
    @exclusivity(unchecked) private var sessionIDs = SessionIDCache()
    private let maxSessions: Int
    @exclusivity(unchecked) private var sessions: BoundedSessions<SessionScreens>
    /// Kept between records, with their capacity: most records derive nothing, and those that
    /// do should not allocate for it.
    @exclusivity(unchecked) private var derived: [DerivedScreenRecord] = []
    @exclusivity(unchecked) private var writer = JSONObjectWriter()

    /// Saved with the pipeline's cursor: every session's stack, phases and open view.
    var state: BoundedSessions<SessionScreens> {
        get { sessions }
        set { sessions = newValue.withLimit(maxSessions) }
    }

    init(host: PluginHost, configuration: [String: Any]) throws {
        self.host = host
        maxSessions = configuration["max_sessions"] as? Int ?? 100_000
        sessions = BoundedSessions(limit: maxSessions)
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        // Only these three kinds say anything about screens, and only as apps sent them; other
        // records pass untouched, read from the field index without decoding anything.
        if !record.isDerived, let type = record[.type] {
            let kind: SessionScreens.Kind? =
                type.isString("navigation")
                ? .navigation : type.isString("lifecycle") ? .lifecycle : type.isString("screen") ? .screen : nil
            if let kind {
                derived.removeAll(keepingCapacity: true)
                sessions.with(sessionIDs.id(of: record), seq: record.seq, make: SessionScreens.init) {
                    $0.apply(kind, record, deriving: &derived)
                }
                for d in derived {
                    d.encode(for: record, into: &writer)
                    try host.emit(writer)
                }
                for d in derived { host.count(d.typeName) }
            }
        }
        try next(record)
    }
}

/// A record screen-tracking derives. Keys are written in alphabetical order, the same for a
/// live pipeline and a replay.
enum DerivedScreenRecord {
    case view(name: String, previous: String?, via: StaticString)
    case time(name: String, seconds: Double?)
    case diagnostic(problem: StaticString, screen: String, cause: UInt64)

    var typeName: String {
        switch self {
        case .view: return "screen"
        case .time: return "screen_time"
        case .diagnostic: return "diagnostic"
        }
    }

    /// The record, with the cause's app, session, user and time, in `out` (emptied first).
    func encode(for cause: PluginRecord, into out: inout JSONObjectWriter) {
        out.removeAll()
        out.value("app", cause[.app])
        switch self {
        case .view(let name, let previous, let via):
            out.string("name", name)
            if let previous { out.string("previous", previous) } else { out.null("previous") }
            out.session(cause)
            out.value("ts", cause.time)
            out.string("type", "screen")
            out.value("user", cause[.user])
            out.string("via", via)
        case .time(let name, let seconds):
            out.string("name", name)
            if let seconds { out.number("seconds", seconds, fractionDigits: 3) }
            out.session(cause)
            out.value("ts", cause.time)
            out.string("type", "screen_time")
            out.value("user", cause[.user])
        case .diagnostic(let problem, let screen, let seq):
            out.number("cause_seq", seq)
            out.string("problem", problem)
            out.string("screen", screen)
            out.session(cause)
            if let status = cause[.status] { out.value("status", status) } else { out.string("status", "") }
            out.value("ts", cause.time)
            out.string("type", "diagnostic")
            out.value("user", cause[.user])
        }
    }
}

/// One session's screens: the navigation stack, each screen's lifecycle phase, and the view
/// that is open (the screen on show since its appearance was counted).
struct SessionScreens: Codable {
    enum Phase: String, Codable { case willAppear, didAppear, willDisappear, didDisappear }

    private enum CodingKeys: String, CodingKey {
        case stack, phase, removed, broken, current, currentOpen, currentSince
    }

    var stack: [String] = []
    var phase = SmallMap<Phase>()
    /// Screens removed indefinitely and not presented again since.
    var removed = SmallSet()
    /// Screens in a broken lifecycle sequence: their appearances are not views until they
    /// disappear or are presented again.
    var broken = SmallSet()
    var current: String?
    var currentOpen = false
    var currentSince: Double?

    enum Kind { case navigation, lifecycle, screen }

    /// Applies `r` to the session, appending what it derives to `out`.
    mutating func apply(_ kind: Kind, _ r: PluginRecord, deriving out: inout [DerivedScreenRecord]) {
        switch kind {
        case .navigation: navigate(r, &out)
        case .lifecycle: lifecycle(r, &out)
        case .screen: if let name = r.string(.name) { appear(name, via: "app", at: r, &out) }
        }
    }

    private mutating func navigate(_ r: PluginRecord, _ out: inout [DerivedScreenRecord]) {
        let screen = r.string(.screen)
        if let screen {
            removed.remove(screen)
            broken.remove(screen)
        }
        guard let action = r[.action] else { return }
        if action.isString("root") {
            guard let screen else { return }
            stack = [screen]
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("push") || action.isString("present") {
            guard let screen else { return }
            stack.append(screen)
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("replace") {
            guard let screen else { return }
            if !stack.isEmpty { stack.removeLast() }
            stack.append(screen)
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("dismiss") || action.isString("pop") {
            if !stack.isEmpty { stack.removeLast() }
            // The screen revealed is a screen view too (the flow-decoration proposal's case).
            if let revealed = stack.last {
                appear(revealed, via: "navigation", at: r, &out)
            } else if let current {
                disappear(current, at: r, &out)
            }
        }
    }

    private mutating func lifecycle(_ r: PluginRecord, _ out: inout [DerivedScreenRecord]) {
        guard let screen = r.string(.screen), let status = r[.status] else { return }
        let before = phase[screen]
        if status.isString("willAppear") {
            if r.flag(.isBeingPresentedInitially) {
                removed.remove(screen)
                broken.remove(screen)
            } else if removed.contains(screen) {
                problem("reappears after being removed indefinitely, without being presented again", screen, r, &out)
                broken.insert(screen)
            }
            phase[screen] = .willAppear
        } else if status.isString("didAppear") {
            phase[screen] = .didAppear
            if broken.contains(screen) {
                problem("appears after being removed indefinitely, without being presented again", screen, r, &out)
            } else if before != .willAppear {
                problem("didAppear without willAppear", screen, r, &out)
            } else {
                appear(screen, via: "lifecycle", at: r, &out)
            }
        } else if status.isString("willDisappear") {
            if before != .didAppear && before != .willAppear {
                problem("willDisappear of a screen that is not on show", screen, r, &out)
            }
            phase[screen] = .willDisappear
        } else if status.isString("didDisappear") {
            if before != .willDisappear { problem("didDisappear without willDisappear", screen, r, &out) }
            phase[screen] = .didDisappear
            broken.remove(screen)
            if r.flag(.isBeingRemovedIndefinitely) { removed.insert(screen) }
            disappear(screen, at: r, &out)
        }
    }

    /// `screen` is on show: a view, unless it is the view already open.
    private mutating func appear(
        _ screen: String, via: StaticString, at r: PluginRecord, _ out: inout [DerivedScreenRecord]
    ) {
        if current == screen && currentOpen { return }
        let previous = current
        if let current, currentOpen { close(current, at: r, &out) }
        out.append(.view(name: screen, previous: previous, via: via))
        current = screen
        currentOpen = true
        currentSince = r.seconds
    }

    private mutating func disappear(_ screen: String, at r: PluginRecord, _ out: inout [DerivedScreenRecord]) {
        if current == screen && currentOpen { close(screen, at: r, &out) }
    }

    private mutating func close(_ screen: String, at r: PluginRecord, _ out: inout [DerivedScreenRecord]) {
        var seconds: Double?
        if let since = currentSince, let now = r.seconds { seconds = max(0, now - since) }
        out.append(.time(name: screen, seconds: seconds))
        currentOpen = false
    }

    private mutating func problem(
        _ text: StaticString, _ screen: String, _ r: PluginRecord, _ out: inout [DerivedScreenRecord]
    ) {
        out.append(.diagnostic(problem: text, screen: screen, cause: r.seq))
    }
}

/// A session's few screens and their phases in a plain array: less memory than a dictionary
/// per session (a session sees a handful of screens), and no hashing.
struct SmallMap<Value: Codable>: Codable {
    private var pairs: [Pair] = []

    struct Pair: Codable {
        var key: String
        var value: Value
    }

    subscript(_ key: String) -> Value? {
        get { pairs.first { $0.key == key }?.value }
        set {
            if let i = pairs.firstIndex(where: { $0.key == key }) {
                if let newValue { pairs[i].value = newValue } else { pairs.remove(at: i) }
            } else if let newValue {
                pairs.append(Pair(key: key, value: newValue))
            }
        }
    }
}

/// A session's few screens in a plain array (see `SmallMap`).
struct SmallSet: Codable {
    private var members: [String] = []

    func contains(_ member: String) -> Bool { members.contains(member) }

    mutating func insert(_ member: String) { if !members.contains(member) { members.append(member) } }

    mutating func remove(_ member: String) { members.removeAll { $0 == member } }
}

/// As saved in a snapshot: the same fields as the `Codable` form, in a fixed order.
extension SessionScreens: CompactCodable {
    func encode(to writer: inout CompactWriter) {
        writer.write(stack)
        phase.encode(to: &writer)
        removed.encode(to: &writer)
        broken.encode(to: &writer)
        writer.write(current)
        writer.write(currentOpen)
        writer.write(currentSince)
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        stack = try reader.read([String].self)
        phase = try SmallMap(from: &reader)
        removed = try SmallSet(from: &reader)
        broken = try SmallSet(from: &reader)
        current = try reader.read(String?.self)
        currentOpen = try reader.read(Bool.self)
        currentSince = try reader.read(Double?.self)
    }
}

extension SessionScreens.Phase: CompactCodable {
    private static let all: [Self] = [.willAppear, .didAppear, .willDisappear, .didDisappear]

    func encode(to writer: inout CompactWriter) { writer.write(UInt64(Self.all.firstIndex(of: self)!)) }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        let index = try reader.read(UInt64.self)
        guard index < Self.all.count else { throw StateDamaged("no lifecycle phase \(index)") }
        self = Self.all[Int(index)]
    }
}

extension SmallMap: CompactCodable where Value: CompactCodable {
    func encode(to writer: inout CompactWriter) {
        writer.write(UInt64(pairs.count))
        for pair in pairs {
            writer.write(pair.key)
            pair.value.encode(to: &writer)
        }
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        for _ in 0..<(try reader.readCount()) {
            let key = try reader.read(String.self)
            pairs.append(Pair(key: key, value: try Value(from: &reader)))
        }
    }
}

extension SmallSet: CompactCodable {
    func encode(to writer: inout CompactWriter) { writer.write(members) }
    init(from reader: inout CompactReader) throws(StateDamaged) { members = try reader.read([String].self) }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(ScreenTracking.self) }
