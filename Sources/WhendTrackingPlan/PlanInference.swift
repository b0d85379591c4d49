import WhendWire

/// A plan proposed from records already stored (`whenctl plan infer`): for each `When` name,
/// how often each top-level param was present and with which types, and a schema that every
/// one of those records keeps to; the screen names seen. A starting point for a person to
/// tighten (patterns, bounds, enums), not a contract by itself.
package struct PlanInference {
    package struct Property {
        package var present = 0
        /// By JSON Schema type name: integer, number (with a fraction), string, boolean, null,
        /// object, array.
        package var types: [String: Int] = [:]
    }

    package struct Event {
        package var count = 0
        package var properties: [[UInt8]: Property] = [:]
    }

    // Keyed by the names' bytes, as whend compares them: two spellings Unicode deems
    // equivalent (a precomposed é and e with a combining accent) are two names, and a plan
    // that listed one would refuse the other.
    package private(set) var events: [[UInt8]: Event] = [:]
    package private(set) var screens: [[UInt8]: Int] = [:]

    package init() {}

    /// Takes one stored record; records of other types than a plan covers are left aside.
    package mutating func add(record line: UnsafeBufferPointer<UInt8>) {
        guard let subject = PlanSubject(record: line) else { return }
        if let screen = subject.screen { screens[TrackingPlan.bytes(screen, line), default: 0] += 1 }
        guard subject.type == .when, let name = subject.name else { return }
        let eventName = TrackingPlan.bytes(name, line)
        var event = events[eventName] ?? Event()
        event.count += 1
        if let params = subject.params {
            var s = JSONScanner(UnsafeBufferPointer(rebasing: line[..<params.upperBound]))
            s.position = params.lowerBound
            // A key written twice is present once; each of its types is counted once, and all
            // are proposed, since a check holds every copy to the plan.
            var seen: [[UInt8]: Set<String>] = [:]
            try? s.scanObject { m throws(WireError) in
                let raw = UnsafeBufferPointer(rebasing: line[m.key])
                let key = m.keyHasEscapes ? decodeJSONString(raw, keepingLoneSurrogates: true) : Array(raw)
                let type = Self.typeName(m.kind, UnsafeBufferPointer(rebasing: line[m.value]))
                if seen[key] == nil { event.properties[key, default: Property()].present += 1 }
                if seen[key, default: []].insert(type).inserted { event.properties[key]!.types[type, default: 0] += 1 }
            }
        }
        events[eventName] = event
    }

    static func typeName(_ kind: JSONKind, _ raw: UnsafeBufferPointer<UInt8>) -> String {
        switch kind {
        case .string: "string"
        case .bool: "boolean"
        case .null: "null"
        case .object: "object"
        case .array: "array"
        case .number:
            !raw.contains { $0 == UInt8(ascii: ".") || $0 | 0x20 == UInt8(ascii: "e") }
                || JSONValue(raw: raw).double.map { $0.isFinite && $0.rounded(.towardZero) == $0 } == true
                ? "integer" : "number"
        }
    }

    /// The proposed plan, as JSON text a plan file can hold (names sorted, two-space indents).
    package func plan() -> String { proposal().plan }

    /// The proposed plan, and what it leaves unchecked that the records hold, and why: names a
    /// plan cannot spell (half a surrogate pair, which no UTF-8 text holds), events with more
    /// params than a plan may list, and what would make the plan larger than a plan file may be
    /// (the params of the events that take most room, then the screens). The plan still passes
    /// every record it came from.
    package func proposal() -> (plan: String, notes: [String]) {
        var notes: [String] = []
        // Each event: its name's line, then its params' schema, or `bare` when they are left out.
        let bare = "\n    }"
        var entries: [(name: [UInt8], head: String, params: String)] = []
        // `When` names are identifiers (the wire's rule): a plan can name every one.
        for name in Self.sorted(events.keys) {
            let event = events[name]!
            let head = "    \(Self.quoted(name)): {\n      \"type\": \"object\""
            let keys = Self.sorted(event.properties.keys)
            let nameable = keys.filter(Self.nameable)
            guard nameable.count <= SchemaCompiler.maxProperties else {
                notes.append(
                    "\(Self.text(name)): \(keys.count) params, over the \(SchemaCompiler.maxProperties) a plan may list: its params are left unchecked"
                )
                entries.append((name, head, bare))
                continue
            }
            var out = ",\n      \"properties\": {"
            for (j, key) in nameable.enumerated() {
                out +=
                    (j == 0 ? "\n" : ",\n")
                    + "        \(Self.quoted(key)): {\"type\": \(Self.types(event.properties[key]!))}"
            }
            out += nameable.isEmpty ? "},\n" : "\n      },\n"
            // A plan's `required` names at most 64 (TrackingPlan); more would make a plan whend refuses.
            let required = nameable.filter { event.properties[$0]!.present == event.count }.prefix(64)
            out += "      \"required\": [\(required.map(Self.quoted).joined(separator: ", "))],\n"
            if nameable.count < keys.count {
                notes.append(
                    "\(Self.text(name)): \(keys.count - nameable.count) param name(s) with half a surrogate pair, which a plan cannot name: other params are allowed"
                )
                out += "      \"additionalProperties\": true\n    }"
            } else {
                out += "      \"additionalProperties\": false\n    }"
            }
            entries.append((name, head, out))
        }
        var screenList = ""
        if screens.keys.contains(where: { !Self.nameable($0) }) {
            notes.append(
                "a screen name with half a surrogate pair, which a plan cannot name: screens are left unchecked")
        } else if !screens.isEmpty {
            screenList = ",\n  \"screens\": {\"names\": [\n"
            screenList += Self.sorted(screens.keys).map { "    " + Self.quoted($0) }.joined(separator: ",\n")
            screenList += "\n  ]}"
        }
        // Within what a plan file may hold (with room for the braces and commas around).
        let limit = TrackingPlan.maximumSize - 64
        var size = entries.reduce(screenList.utf8.count) { $0 + $1.head.utf8.count + $1.params.utf8.count + 2 }
        let widest = entries.indices.sorted { entries[$0].params.utf8.count > entries[$1].params.utf8.count }
        for i in widest where size > limit && entries[i].params != bare {
            size -= entries[i].params.utf8.count - bare.utf8.count
            entries[i].params = bare
            notes.append(
                "\(Self.text(entries[i].name)): its params are left unchecked, or the plan would be over the \(TrackingPlan.maximumSize >> 20) MiB a plan file may be"
            )
        }
        if size > limit, !screenList.isEmpty {
            screenList = ""
            notes.append(
                "screens are left unchecked, or the plan would be over the \(TrackingPlan.maximumSize >> 20) MiB a plan file may be"
            )
        }
        var out = "{\n  \"events\": {"
        for (i, entry) in entries.enumerated() { out += (i == 0 ? "\n" : ",\n") + entry.head + entry.params }
        out += entries.isEmpty ? "}" : "\n  }"
        return (out + screenList + "\n}\n", notes)
    }

    /// Whether a plan can spell a name: a plan is UTF-8 text, and half a surrogate pair (kept
    /// as its three bytes, as whend compares names) is none.
    static func nameable(_ bytes: [UInt8]) -> Bool { String(decoding: bytes, as: UTF8.self).utf8.elementsEqual(bytes) }

    /// The types seen, as a schema's `type`: integer is dropped where number is there (it
    /// covers it).
    private static func types(_ property: Property) -> String {
        var names = Set(property.types.keys)
        if names.contains("number") { names.remove("integer") }
        let sorted = names.sorted()
        return sorted.count == 1 ? quoted(sorted[0]) : "[" + sorted.map(quoted).joined(separator: ", ") + "]"
    }

    /// Per event and param: how often present, and which types how often.
    package func statistics() -> String {
        var out = ""
        for name in Self.sorted(events.keys) {
            let event = events[name]!
            out += "\(Self.text(name)): \(event.count) event\(event.count == 1 ? "" : "s")\n"
            for key in Self.sorted(event.properties.keys) {
                let p = event.properties[key]!
                let types = p.types.sorted { ($1.value, $0.key) < ($0.value, $1.key) }
                    .map { "\($0.key) \(Self.percent($0.value, of: p.present))" }.joined(separator: ", ")
                out += "  \(Self.text(key)): present \(Self.percent(p.present, of: event.count)); \(types)\n"
            }
        }
        if !screens.isEmpty {
            out += "screens: \(screens.count) name\(screens.count == 1 ? "" : "s")\n"
            let byCount = screens.sorted {
                $0.value != $1.value ? $0.value > $1.value : $0.key.lexicographicallyPrecedes($1.key)
            }
            for (screen, count) in byCount {
                out += "  \(Self.text(screen)): \(count)\n"
            }
        }
        return out
    }

    static func percent(_ part: Int, of whole: Int) -> String {
        guard whole > 0 else { return "0 %" }
        let p = Double(part) * 100 / Double(whole)
        return p == p.rounded() || p >= 10 ? "\(Int(p.rounded())) %" : "\((p * 10).rounded() / 10) %"
    }

    static func quoted(_ s: String) -> String { quoted(Array(s.utf8)) }

    static func quoted(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        appendJSONString(bytes, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    static func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    /// Names in the order of their bytes: the same for two names Unicode deems equivalent
    /// every time, where String's order would not tell them apart.
    static func sorted(_ names: some Sequence<[UInt8]>) -> [[UInt8]] {
        names.sorted { $0.lexicographicallyPrecedes($1) }
    }
}
