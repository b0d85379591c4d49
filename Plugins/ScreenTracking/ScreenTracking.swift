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
    /// The records derived of each type (`DerivedScreenRecord.typeNames`' order) and not yet
    /// counted: counted at each flush, the pipeline's checkpoint, where each `host.count` per
    /// record took the host's locks twice and looked its name up twice (a twentieth of the
    /// plugin's time).
    @exclusivity(unchecked) private var unreported: [Int64] = [0, 0, 0]

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

    func flush() throws {
        for (i, n) in unreported.enumerated() where n > 0 { host.count(DerivedScreenRecord.typeNames[i], by: n) }
        for i in unreported.indices { unreported[i] = 0 }
    }

    deinit { try? flush() }

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
                for d in derived { unreported[d.typeIndex] += 1 }
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

    static let typeNames = ["screen", "screen_time", "diagnostic"]

    var typeIndex: Int {
        switch self {
        case .view: return 0
        case .time: return 1
        case .diagnostic: return 2
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
///
/// The screens with a phase and the stack are one array (those first, in the order each was
/// first given a phase, then the stack, bottom first), the phases two bits each beside it:
/// one allocation per session where the stack and the phases were two, the phases' of 24
/// bytes a screen, and grown by a quarter rather than double.
struct SessionScreens: Codable {
    enum Phase: String, Codable { case willAppear, didAppear, willDisappear, didDisappear }

    private enum CodingKeys: String, CodingKey {
        case stack, phase, removed, broken, current, currentOpen, currentSince
    }

    /// The screens with a phase (the first `phased`), then the navigation stack.
    private var screens: [String] = []
    /// The phases of the first 32 screens with one, two bits each (`Phase.all`'s order);
    /// those of the rest.
    private var phaseBits: UInt64 = 0
    private var laterPhases: [Phase] = []
    /// Screens removed indefinitely and not presented again since.
    var removed = SmallSet()
    /// Screens in a broken lifecycle sequence: their appearances are not views until they
    /// disappear or are presented again.
    var broken = SmallSet()
    var current: String?
    var currentSince: Double?
    var currentOpen = false
    /// How many of `screens` have a phase (last: it fills what the fields before leave of a
    /// session's 72 bytes).
    private var phasedCount: Int32 = 0
    private var phased: Int {
        get { Int(phasedCount) }
        set { phasedCount = Int32(newValue) }
    }

    init() {}

    /// The navigation stack, bottom first.
    var stack: ArraySlice<String> { screens[phased...] }

    /// Room for one more screen: a quarter more, at least one.
    private mutating func reserveOneMore() {
        if screens.count == screens.capacity { screens.reserveCapacity(screens.count + max(1, screens.count / 4)) }
    }

    private mutating func push(_ screen: String) {
        reserveOneMore()
        screens.append(screen)
    }

    private mutating func pop() { if screens.count > phased { screens.removeLast() } }

    /// The phase of `screen` (the first with that name), if it has one.
    func phase(of screen: String) -> Phase? {
        for i in 0..<phased where screens[i] == screen { return phase(at: i) }
        return nil
    }

    private func phase(at i: Int) -> Phase {
        i < 32 ? Phase.all[Int((phaseBits >> UInt64(2 * i)) & 3)] : laterPhases[i - 32]
    }

    mutating func setPhase(_ phase: Phase, of screen: String) {
        var i = 0
        while i < phased && screens[i] != screen { i += 1 }
        if i == phased { addPhased(screen, phase) } else { setPhase(phase, at: i) }
    }

    /// A screen given its first phase.
    private mutating func addPhased(_ screen: String, _ phase: Phase) {
        reserveOneMore()
        screens.insert(screen, at: phased)
        if phased >= 32 { laterPhases.append(phase) }
        phased += 1
        setPhase(phase, at: phased - 1)
    }

    private mutating func setPhase(_ phase: Phase, at i: Int) {
        if i < 32 {
            let shift = UInt64(2 * i)
            phaseBits = phaseBits & ~(3 << shift) | UInt64(phase.code) << shift
        } else {
            laterPhases[i - 32] = phase
        }
    }

    /// The phases as a `SmallMap`, in order.
    private var phaseMap: SmallMap<Phase> {
        SmallMap(pairs: (0..<phased).map { .init(key: screens[$0], value: phase(at: $0)) })
    }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let stack = try c.decode([String].self, forKey: .stack)
        for pair in try c.decode(SmallMap<Phase>.self, forKey: .phase).pairs { addPhased(pair.key, pair.value) }
        for screen in stack { push(screen) }
        removed = try c.decode(SmallSet.self, forKey: .removed)
        broken = try c.decode(SmallSet.self, forKey: .broken)
        current = try c.decodeIfPresent(String.self, forKey: .current)
        currentOpen = try c.decode(Bool.self, forKey: .currentOpen)
        currentSince = try c.decodeIfPresent(Double.self, forKey: .currentSince)
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(Array(stack), forKey: .stack)
        try c.encode(phaseMap, forKey: .phase)
        try c.encode(removed, forKey: .removed)
        try c.encode(broken, forKey: .broken)
        try c.encodeIfPresent(current, forKey: .current)
        try c.encode(currentOpen, forKey: .currentOpen)
        try c.encodeIfPresent(currentSince, forKey: .currentSince)
    }

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
            screens.removeSubrange(phased...)
            push(screen)
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("push") || action.isString("present") {
            guard let screen else { return }
            push(screen)
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("replace") {
            guard let screen else { return }
            pop()
            push(screen)
            appear(screen, via: "navigation", at: r, &out)
        } else if action.isString("dismiss") || action.isString("pop") {
            pop()
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
        let before = phase(of: screen)
        if status.isString("willAppear") {
            if r.flag(.isBeingPresentedInitially) {
                removed.remove(screen)
                broken.remove(screen)
            } else if removed.contains(screen) {
                problem("reappears after being removed indefinitely, without being presented again", screen, r, &out)
                broken.insert(screen)
            }
            setPhase(.willAppear, of: screen)
        } else if status.isString("didAppear") {
            setPhase(.didAppear, of: screen)
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
            setPhase(.willDisappear, of: screen)
        } else if status.isString("didDisappear") {
            if before != .willDisappear { problem("didDisappear without willDisappear", screen, r, &out) }
            setPhase(.didDisappear, of: screen)
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
    private(set) var pairs: [Pair] = []

    init() {}

    init(pairs: [Pair]) { self.pairs = pairs }

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
        // As a `[String]` and a `SmallMap<Phase>` wrote them.
        writer.write(UInt64(screens.count - phased))
        for screen in stack { writer.write(screen) }
        writer.write(UInt64(phased))
        for i in 0..<phased {
            writer.write(screens[i])
            phase(at: i).encode(to: &writer)
        }
        removed.encode(to: &writer)
        broken.encode(to: &writer)
        writer.write(current)
        writer.write(currentOpen)
        writer.write(currentSince)
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        let stack = try reader.read([String].self)
        for pair in try SmallMap<Phase>(from: &reader).pairs { addPhased(pair.key, pair.value) }
        for screen in stack { push(screen) }
        removed = try SmallSet(from: &reader)
        broken = try SmallSet(from: &reader)
        current = try reader.read(String?.self)
        currentOpen = try reader.read(Bool.self)
        currentSince = try reader.read(Double?.self)
    }
}

extension SessionScreens.Phase: CompactCodable {
    static let all: [Self] = [.willAppear, .didAppear, .willDisappear, .didDisappear]

    /// Where it is in `all`.
    var code: Int {
        switch self {
        case .willAppear: return 0
        case .didAppear: return 1
        case .willDisappear: return 2
        case .didDisappear: return 3
        }
    }

    func encode(to writer: inout CompactWriter) { writer.write(UInt64(code)) }

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
