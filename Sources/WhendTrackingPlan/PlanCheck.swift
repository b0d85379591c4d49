import WhendWire

/// What a plan looks at in one event: where its fields lie in the line. Built from a line the
/// event scanner passed (`init(event:)`) or from a stored record (`init(record:)`).
package struct PlanSubject {
    package var type: EventType
    /// A `when`'s name (the plain form's `name`, or the Codable form's case name).
    package var name: StringValue?
    /// A `when`'s params object; nil: none were sent (`{}`).
    package var params: Range<Int>?
    /// The screen name: `screen`, or a `screen` event's `name`.
    package var screen: StringValue?
    package var app: StringValue?

    @inlinable
    package init(
        type: EventType, name: StringValue? = nil, params: Range<Int>? = nil, screen: StringValue? = nil,
        app: StringValue? = nil
    ) {
        self.type = type
        self.name = name
        self.params = params
        self.screen = screen
        self.app = app
    }

    /// From an event line the scanner passed: its type, the fields it found and, for a `when`
    /// in the Codable form, where its case name and params are. Inlinable: built in place at
    /// ingest, once per event.
    @inlinable
    package init(
        type: EventType, fields: PlanFields, codableWhen: (member: Int, name: Range<Int>, params: Range<Int>)?
    ) {
        self.init(type: type, app: fields.app)
        switch type {
        case .when:
            if let codable = codableWhen {
                name = StringValue(contents: codable.name, escaped: false)
                params = codable.params
            } else {
                name = fields.name
                params = fields.params
            }
            screen = fields.screen
        case .screen: screen = fields.name
        default: screen = fields.screen
        }
    }

    /// From a stored record (the journal holds the plain form); nil for a record of a type
    /// plugins derive, which no plan covers.
    package init?(record line: UnsafeBufferPointer<UInt8>) {
        var s = JSONScanner(line)
        var type: EventType?
        var name: StringValue?
        var params: Range<Int>?
        var screen: StringValue?
        var app: StringValue?
        func string(_ m: JSONScanner.Member) -> StringValue? {
            m.kind == .string
                ? StringValue(contents: (m.value.lowerBound + 1)..<(m.value.upperBound - 1), escaped: m.valueHasEscapes)
                : nil
        }
        do {
            try s.scanObject { m throws(WireError) in
                let key = UnsafeBufferPointer(rebasing: line[m.key])
                if equal(key, "type"), m.kind == .string {
                    let contents = UnsafeBufferPointer(
                        rebasing: line[(m.value.lowerBound + 1)..<(m.value.upperBound - 1)])
                    type = EventType(rawValue: String(decoding: contents, as: UTF8.self))
                } else if equal(key, "name") {
                    name = string(m)
                } else if equal(key, "params"), m.kind == .object {
                    params = m.value
                } else if equal(key, "screen") {
                    screen = string(m)
                } else if equal(key, "app") {
                    app = string(m)
                }
            }
        } catch {
            return nil
        }
        guard let type else { return nil }
        self.init(type: type, app: app)
        switch type {
        case .when:
            self.name = name
            self.params = params
            self.screen = screen
        case .screen: self.screen = name
        default: self.screen = screen
        }
    }
}

/// One event that broke the plan: which event, which rule, where, and why.
package struct PlanViolation: Sendable, Equatable, CustomStringConvertible {
    /// The `When` name, or the event's type for a screen name on another event.
    package var event: String
    package var rule: PlanRule
    /// `$.params.cart[2].price`, from the event's root.
    package var path: String
    package var detail: String
    /// Whether `event` is a name the plan chose (a planned `When` name, or an event type) rather
    /// than one a client did: only those may label counts, or clients would grow them at will.
    package var planned = true

    package var description: String { "\(event): \(path): \(detail) (rule \(rule.rawValue))" }
}

private let emptyParams: [UInt8] = Array("{}".utf8)

extension TrackingPlan {
    /// The rules for `app` (the event's own, else `defaultApp`: the hello's or the sender's).
    private func rules(
        for subject: PlanSubject, _ line: UnsafeBufferPointer<UInt8>, defaultApp: UnsafeBufferPointer<UInt8>?
    ) -> UnsafePointer<Rules> {
        guard ruleStorage.count > 1 else { return baseRules }
        if let app = subject.app {
            let raw = UnsafeBufferPointer(rebasing: line[app.contents])
            if app.escaped {
                let decoded = decodeJSONString(raw, keepingLoneSurrogates: true)
                return decoded.withUnsafeBufferPointer { rulesOf(app: $0) }
            }
            return rulesOf(app: raw)
        }
        return defaultApp.map { rulesOf(app: $0) } ?? baseRules
    }

    private func rulesOf(app: UnsafeBufferPointer<UInt8>) -> UnsafePointer<Rules> {
        guard let i = apps.find(app) else { return baseRules }
        return UnsafePointer(ruleStorage.baseAddress! + 1 + i)
    }

    /// Checks one event; nil when it keeps to the plan. Allocates nothing of its own then (a
    /// field with escapes aside; glibc's regexec allocates for each `pattern` it searches).
    package func check(
        _ subject: PlanSubject, in line: UnsafeBufferPointer<UInt8>, defaultApp: UnsafeBufferPointer<UInt8>? = nil
    ) -> PlanViolation? {
        let rules = rules(for: subject, line, defaultApp: defaultApp)
        if subject.type == .when, let name = subject.name {
            if let violation = checkWhen(name, subject.params, line, rules) { return violation }
        }
        guard rules.pointee.checksScreens, let screen = subject.screen else { return nil }
        let raw = UnsafeBufferPointer(rebasing: line[screen.contents])
        let known =
            screen.escaped
            ? decodeJSONString(raw, keepingLoneSurrogates: true).withUnsafeBufferPointer { Self.knows($0, rules) }
            : Self.knows(raw, rules)
        guard !known else { return nil }
        let shown = String(decoding: screen.escaped ? decodeJSONString(raw) : Array(raw), as: UTF8.self)
        var planned = true
        if subject.type == .when, let name = subject.name {
            let rawName = UnsafeBufferPointer(rebasing: line[name.contents])
            planned =
                (name.escaped
                    ? decodeJSONString(rawName, keepingLoneSurrogates: true).withUnsafeBufferPointer {
                        rules.pointee.events.find($0)
                    }
                    : rules.pointee.events.find(rawName)) != nil
        }
        return PlanViolation(
            event: subject.type == .when ? Self.text(subject.name, line) : subject.type.rawValue, rule: .screen,
            path: subject.type == .screen ? "$.name" : "$.screen",
            detail: "the screen \"\(shown)\" is not in the plan's screens", planned: planned)
    }

    private static func knows(_ screen: UnsafeBufferPointer<UInt8>, _ rules: UnsafePointer<Rules>) -> Bool {
        if rules.pointee.screens?.contains(screen) == true { return true }
        return rules.pointee.screenPatterns.contains { $0.matches(screen) }
    }

    private func checkWhen(
        _ name: StringValue, _ params: Range<Int>?, _ line: UnsafeBufferPointer<UInt8>, _ rules: UnsafePointer<Rules>
    ) -> PlanViolation? {
        let raw = UnsafeBufferPointer(rebasing: line[name.contents])
        let node =
            name.escaped
            ? decodeJSONString(raw, keepingLoneSurrogates: true).withUnsafeBufferPointer {
                rules.pointee.events.find($0)
            }
            : rules.pointee.events.find(raw)
        guard let node else {
            guard !rules.pointee.unplannedEvents else { return nil }
            return PlanViolation(
                event: Self.text(name, line), rule: .event, path: "$.name",
                detail: "\"\(Self.text(name, line))\" is not an event of the plan", planned: false)
        }
        let failure: SchemaFailure?
        if let params {
            failure = schemas.check(node, line, params)
        } else {
            failure = emptyParams.withUnsafeBufferPointer { schemas.check(node, $0, 0..<2) }
        }
        guard let failure else { return nil }
        return PlanViolation(
            event: Self.text(name, line), rule: failure.rule, path: failure.path(from: [.key(Array("params".utf8))]),
            detail: failure.detail)
    }

    package static func text(_ value: StringValue?, _ line: UnsafeBufferPointer<UInt8>) -> String {
        String(decoding: bytes(value, line), as: UTF8.self)
    }

    /// The string's bytes, unescaped.
    static func bytes(_ value: StringValue?, _ line: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        guard let value else { return [] }
        let raw = UnsafeBufferPointer(rebasing: line[value.contents])
        return value.escaped ? decodeJSONString(raw, keepingLoneSurrogates: true) : Array(raw)
    }

    /// Checks one JSON value against the schema of `event` alone (for tests and tools).
    package func check(params: UnsafeBufferPointer<UInt8>, event: String) -> PlanViolation? {
        guard let node = Array(event.utf8).withUnsafeBufferPointer({ baseRules.pointee.events.find($0) }) else {
            return PlanViolation(event: event, rule: .event, path: "$.name", detail: "not an event of the plan")
        }
        guard let failure = schemas.check(node, params, 0..<params.count) else { return nil }
        return PlanViolation(
            event: event, rule: failure.rule, path: failure.path(from: [.key(Array("params".utf8))]),
            detail: failure.detail)
    }
}
