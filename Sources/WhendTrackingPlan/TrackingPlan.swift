import Foundation
import WhendSystem
import WhendWire

/// A tracking plan (docs/tracking-plan.md): the schema of each `When` event's params, the
/// screen names apps may use, and per app what differs. Compiled once when it is loaded; a
/// check reads the event's bytes where they lie.
package final class TrackingPlan: @unchecked Sendable {
    /// What applies to one app (or to all): events, and screens if they are checked.
    struct Rules: Sendable {
        var events = EventTable()
        /// Whether a `When` name the plan does not list passes.
        var unplannedEvents = false
        /// Exact screen names; nil with no patterns either: screens are not checked.
        var screens: ScreenTable?
        var screenPatterns: [Pattern] = []

        var checksScreens: Bool { screens != nil || !screenPatterns.isEmpty }
    }

    let schemas: SchemaTable
    /// The plan's rules, then each app's, in `apps`' order. Unchecked Sendable: written
    /// once here, only read after; raw storage, so that a check borrows them where they lie
    /// rather than copying them (and counting references every connection's thread shares).
    let ruleStorage: UnsafeMutableBufferPointer<Rules>
    /// Each app the plan names, to its place in `ruleStorage` after the plan's own (found by
    /// hash: a plan of 100,000 apps, scanned, cost each event 36 ms).
    let apps: EventTable
    /// How many `When` names the plan lists, all apps together (for status lines).
    package let eventCount: Int
    /// A digest of the plan's text (SipHash-128, both words): a reload says whether the plan
    /// changed by comparing them.
    package let digest: [UInt64]
    /// What checking one byte of an event may cost at most, in automaton steps: each byte
    /// of a string is searched by one pattern of a schema, or by every screen pattern of one
    /// app's rules. A check costs at most about that times the line's length.
    let patternStepsPerByte: Int

    private init(
        schemas: SchemaTable, rules: Rules, apps: [(name: [UInt8], rules: Rules)], eventCount: Int, digest: [UInt64],
        largestPatternSteps: Int
    ) {
        self.schemas = schemas
        self.digest = digest
        patternStepsPerByte = ([rules] + apps.map(\.rules)).reduce(largestPatternSteps) { most, rules in
            max(most, rules.screenPatterns.reduce(0) { $0 + $1.size })
        }
        ruleStorage = .allocate(capacity: 1 + apps.count)
        _ = ruleStorage.initialize(from: [rules] + apps.map(\.rules))
        var table = EventTable()
        for (i, app) in apps.enumerated() { _ = table.insert(app.name, i) }
        self.apps = table
        self.eventCount = eventCount
    }

    deinit {
        _ = ruleStorage.deinitialize()
        ruleStorage.deallocate()
    }

    /// Steps of pattern search past which a check is worth moving off the thread that serves
    /// other connections: about 10 ms here (a step costs about 5 ns).
    package static let longCheckSteps = 2_000_000

    /// Lines longer than this may take long to check (`longCheckSteps`): their patterns could
    /// hold every other connection served by the same thread meanwhile.
    package var longCheckLineBytes: Int { patternStepsPerByte > 0 ? Self.longCheckSteps / patternStepsPerByte : .max }

    /// The plan's own rules (those of an app it does not name).
    var baseRules: UnsafePointer<Rules> { UnsafePointer(ruleStorage.baseAddress!) }

    /// Reads and compiles a plan file; an error names the line and the reason.
    package static func load(path: String) throws(PlanError) -> TrackingPlan {
        let bytes: [UInt8]
        do {
            bytes = try ConfiguredFile.read(path, limit: maximumSize)
        } catch {
            throw PlanError(offset: 0, reason: "cannot read it: \(error.reason)")
        }
        return try parse(bytes)
    }

    /// The largest plan file read: thousands of events with their schemas fit in a fraction.
    package static let maximumSize = 16 * 1024 * 1024

    /// Compiles a plan from its text.
    package static func parse(_ bytes: [UInt8]) throws(PlanError) -> TrackingPlan {
        do {
            var hasher = SipHash128()
            hasher.write(bytes)
            let (high, low) = hasher.finalize()
            return try compile(try PlanDocument.parse(bytes), digest: [high, low])
        } catch {
            var located = error.located(in: bytes)
            located.reason = located.reason.replacingOccurrences(of: "the line is not valid JSON", with: "not JSON")
            throw located
        }
    }

    static let topKeys = ["$schema", "$comment", "description", "events", "unplannedEvents", "screens", "apps"]
    static let appKeys = ["$comment", "description", "events", "unplannedEvents", "screens"]

    private static func compile(_ document: PlanDocument, digest: [UInt64]) throws(PlanError) -> TrackingPlan {
        guard case .object(let members) = document.value else {
            throw PlanError(offset: document.offset, reason: "a plan is a JSON object with \"events\"")
        }
        var compiler = SchemaCompiler()
        var count = 0
        let base = try rules(members, allowed: topKeys, inheriting: Rules(), compiler: &compiler, count: &count)
        var apps: [(name: [UInt8], rules: Rules)] = []
        if let appsValue = members.first(where: { $0.key == "apps" })?.value {
            guard case .object(let entries) = appsValue.value else {
                throw PlanError(offset: appsValue.offset, reason: "apps: must be an object, one member per app")
            }
            for (app, value) in entries {
                guard case .object(let appMembers) = value.value else {
                    throw PlanError(offset: value.offset, reason: "apps.\(app): must be an object")
                }
                apps.append(
                    (
                        Array(app.utf8),
                        try rules(appMembers, allowed: appKeys, inheriting: base, compiler: &compiler, count: &count)
                    ))
            }
        }
        return TrackingPlan(
            schemas: SchemaTable(compiler.nodes), rules: base, apps: apps, eventCount: count, digest: digest,
            largestPatternSteps: compiler.largestPatternSteps)
    }

    /// An app's section replaces each of `events`, `unplannedEvents` and `screens` it sets;
    /// the rest it inherits.
    private static func rules(
        _ members: [(key: String, value: PlanDocument)], allowed: [String], inheriting base: Rules,
        compiler: inout SchemaCompiler, count: inout Int
    ) throws(PlanError) -> Rules {
        var rules = base
        for (key, value) in members {
            guard allowed.contains(key) else {
                throw PlanError(
                    offset: value.offset,
                    reason: "\"\(key)\" is not part of a plan here; the keys are \(allowed.joined(separator: ", "))")
            }
            switch key {
            case "events":
                guard case .object(let events) = value.value else {
                    throw PlanError(offset: value.offset, reason: "events: must be an object, a schema per When name")
                }
                var table = EventTable()
                for (name, schema) in events {
                    guard isWhenName(name) else {
                        throw PlanError(
                            offset: schema.offset,
                            reason: "events: \"\(name)\" is not a When name ([A-Za-z_][A-Za-z0-9_]*, at most 255 bytes)"
                        )
                    }
                    let node = try compiler.compile(schema)
                    guard table.insert(Array(name.utf8), node) else {
                        throw PlanError(offset: schema.offset, reason: "events: \"\(name)\" appears twice")
                    }
                    count += 1
                }
                rules.events = table
            case "unplannedEvents":
                guard case .string(let s) = value.value, s == "allow" || s == "violation" else {
                    throw PlanError(offset: value.offset, reason: "unplannedEvents: must be \"allow\" or \"violation\"")
                }
                rules.unplannedEvents = s == "allow"
            case "screens":
                (rules.screens, rules.screenPatterns) = try screens(value, compiler: &compiler)
            case "apps":
                break  // compiled once the plan's own rules are
            default:
                // `$schema`, `$comment`, `description`: text, as the plan's JSON Schema says.
                guard case .string = value.value else {
                    throw PlanError(offset: value.offset, reason: "\(key): must be a string")
                }
            }
        }
        return rules
    }

    private static func screens(_ value: PlanDocument, compiler: inout SchemaCompiler) throws(PlanError) -> (
        ScreenTable?, [Pattern]
    ) {
        func fail(_ at: PlanDocument, _ reason: String) -> PlanError {
            PlanError(offset: at.offset, reason: "screens: \(reason)")
        }
        let shape = "must be an object with \"names\" (a list of screen names) and/or \"patterns\""
        guard case .object(let members) = value.value else { throw fail(value, shape) }
        var names: ScreenTable?
        var patterns: [Pattern] = []
        for (key, list) in members {
            if key == "$comment" || key == "description" {
                guard case .string = list.value else { throw fail(list, "\(key) must be a string") }
                continue
            }
            guard case .array(let items) = list.value else { throw fail(list, "\(key) must be a list of strings") }
            var strings: [String] = []
            var seen = Set<[UInt8]>()
            for item in items {
                guard case .string(let s) = item.value, !s.isEmpty else {
                    throw fail(item, "\(key) must be a list of non-empty strings")
                }
                guard seen.insert(Array(s.utf8)).inserted else { throw fail(item, "\(key) lists \"\(s)\" twice") }
                strings.append(s)
            }
            switch key {
            case "names":
                names = ScreenTable(strings.map { Array($0.utf8) })
            case "patterns":
                for (item, source) in zip(items, strings) {
                    do {
                        patterns.append(try compiler.pattern(source))
                    } catch {
                        throw fail(item, error.reason)
                    }
                }
            default:
                throw fail(list, shape)
            }
        }
        return (names ?? (patterns.isEmpty ? ScreenTable([]) : nil), patterns)
    }

    static func isWhenName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard let first = bytes.first, bytes.count <= 255 else { return false }
        func letter(_ b: UInt8) -> Bool { (b | 0x20 >= 0x61 && b | 0x20 <= 0x7A) || b == 0x5F }
        return letter(first) && bytes.allSatisfy { letter($0) || ($0 >= 0x30 && $0 <= 0x39) }
    }
}

/// Names of a plan (its `When` names, its apps) to what they stand for: open addressing over a
/// hash of the name's bytes, the names in one byte arena, so that finding one builds no key and
/// touches no reference count (every connection's thread reads the one table).
struct EventTable: Sendable {
    private struct Slot {
        /// 0: empty.
        var hash: UInt64 = 0
        var start: Int32 = 0
        var length: Int32 = 0
        var node: Int32 = 0
    }
    private var slots: [Slot] = []
    private var arena: [UInt8] = []
    private(set) var count = 0

    /// False if the name is there already.
    mutating func insert(_ name: [UInt8], _ node: Int) -> Bool {
        if name.withUnsafeBufferPointer({ find($0) }) != nil { return false }
        if (count + 1) * 2 > slots.count { grow() }
        let start = arena.count
        arena.append(contentsOf: name)
        place(Slot(hash: Self.hash(name), start: Int32(start), length: Int32(name.count), node: Int32(node)))
        count += 1
        return true
    }

    private mutating func place(_ slot: Slot) {
        var i = Int(truncatingIfNeeded: slot.hash) & (slots.count - 1)
        while slots[i].hash != 0 { i = (i + 1) & (slots.count - 1) }
        slots[i] = slot
    }

    private mutating func grow() {
        let old = slots
        slots = Array(repeating: Slot(), count: max(16, old.count * 2))
        for slot in old where slot.hash != 0 { place(slot) }
    }

    func find(_ name: UnsafeBufferPointer<UInt8>) -> Int? {
        guard !slots.isEmpty else { return nil }
        let hash = Self.hash(name)
        return slots.withUnsafeBufferPointer { slots in
            arena.withUnsafeBufferPointer { arena in
                var i = Int(truncatingIfNeeded: hash) & (slots.count - 1)
                while slots[i].hash != 0 {
                    let slot = slots[i]
                    if slot.hash == hash, Int(slot.length) == name.count,
                        JSONBytes.equal(
                            UnsafeBufferPointer(rebasing: arena[Int(slot.start)..<Int(slot.start + slot.length)]), name)
                    {
                        return Int(slot.node)
                    }
                    i = (i + 1) & (slots.count - 1)
                }
                return nil
            }
        }
    }

    /// Every byte, eight at a time, mixed; never 0 (the empty slot). Equal hashes are told
    /// apart by the bytes. (Only the first and last eight once: names a plan generates, like
    /// `userTaps000123OnButton`, then all collided, and a reload of 20,000 took 20 s.)
    static func hash(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
        let n = bytes.count
        guard let base = bytes.baseAddress, n > 0 else { return 1 }
        var h = UInt64(n) &* 0x9E37_79B9_7F4A_7C15
        func mix(_ word: UInt64) {
            h = (h ^ word) &* 0xBF58_476D_1CE4_E5B9
            h ^= h >> 31
        }
        var i = 0
        while i + 8 <= n {
            mix(UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self))
            i += 8
        }
        if i < n {
            var last: UInt64 = 0
            while i < n {
                last = last << 8 | UInt64(base[i])
                i += 1
            }
            mix(last)
        }
        h = (h ^ (h >> 29)) &* 0x94D0_49BB_1331_11EB
        return (h ^ (h >> 32)) | 1
    }

    static func hash(_ bytes: [UInt8]) -> UInt64 { bytes.withUnsafeBufferPointer { hash($0) } }
}

/// The exact screen names of a plan, found the same way.
struct ScreenTable: Sendable {
    private var table = EventTable()

    init(_ names: [[UInt8]]) {
        for name in names { _ = table.insert(name, 0) }
    }

    func contains(_ name: UnsafeBufferPointer<UInt8>) -> Bool { table.find(name) != nil }
}
