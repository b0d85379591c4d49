import Foundation

extension EventScanner {
    static func validateEvent(_ bytes: UnsafeBufferPointer<UInt8>, _ members: [EventMember]) throws(WireError)
        -> ScannedEvent
    {
        // Where each known key is among the members; on the stack, not the heap.
        var index = InlineArray<18, Int32>(repeating: -1)
        for (i, m) in members.enumerated() { if let k = m.key { index[k.rawValue] = Int32(i) } }
        func member(_ k: KnownKey) -> EventMember? {
            let i = index[k.rawValue]
            return i < 0 ? nil : members[Int(i)]
        }
        func string(_ k: KnownKey, max: Int = 255) throws(WireError) -> [UInt8]? {
            guard let m = member(k) else { return nil }
            return try stringValue(bytes, m.kind, m.valueRange, field: k.name, max: max, escaped: m.valueEscaped)
        }
        /// Checks a string field without copying it; true if present.
        func check(_ k: KnownKey, max: Int = 255) throws(WireError) -> Bool {
            guard let m = member(k) else { return false }
            _ = try checkString(bytes, m.kind, m.valueRange, field: k.name, max: max, escaped: m.valueEscaped)
            return true
        }
        /// A required string field, checked without copying it.
        func requirePresent(_ k: KnownKey, _ type: String, max: Int = 255) throws(WireError) {
            guard try check(k, max: max) else { throw WireError(.missingField, "\(type) event needs \"\(k.name)\"") }
        }
        func require(_ k: KnownKey, _ type: String, max: Int = 255) throws(WireError) -> String {
            guard let m = member(k) else {
                throw WireError(.missingField, "\(type) event needs \"\(k.name)\"")
            }
            let raw = try checkString(bytes, m.kind, m.valueRange, field: k.name, max: max, escaped: m.valueEscaped)
            return raw.escaped
                ? String(decoding: decodeJSONString(raw.contents), as: UTF8.self)
                : String(decoding: raw.contents, as: UTF8.self)
        }
        func kind(_ k: KnownKey, _ expected: JSONKind, _ description: String) throws(WireError) {
            if let m = member(k), m.kind != expected {
                throw WireError(.invalidField, "\"\(k.name)\" must be \(description)")
            }
        }
        func isTrue(_ k: KnownKey) -> Bool {
            guard let m = member(k) else { return false }
            return bytes[m.valueRange.lowerBound] == UInt8(ascii: "t")
        }

        guard let typeMember = member(.type) else {
            throw WireError(
                .missingField, "every event needs \"type\": one of lifecycle, when, navigation, screen, error")
        }
        let typeRaw = try checkString(
            bytes, typeMember.kind, typeMember.valueRange, field: "type", max: 64, escaped: typeMember.valueEscaped)
        guard
            let type = typeRaw.escaped
                ? EventType(rawValue: String(decoding: decodeJSONString(typeRaw.contents), as: UTF8.self))
                : EventType.match(typeRaw.contents)
        else {
            throw WireError(
                .unknownType,
                "type \"\(String(decoding: typeRaw.contents, as: UTF8.self))\" is not one of lifecycle, when, navigation, screen, error"
            )
        }

        // Fields every event may carry. Their values are copied only for de-duplication.
        func located(_ k: KnownKey, max: Int) throws(WireError) -> StringValue? {
            guard let m = member(k) else { return nil }
            let raw = try checkString(bytes, m.kind, m.valueRange, field: k.name, max: max, escaped: m.valueEscaped)
            return StringValue(
                contents: (m.valueRange.lowerBound + 1)..<(m.valueRange.upperBound - 1), escaped: raw.escaped)
        }
        let app = try located(.app, max: 255)
        let session = try located(.session, max: 128)
        let id = try located(.id, max: 128)
        let hasApp = app != nil
        let hasSession = session != nil
        _ = try check(.user)
        if let m = member(.ts) {
            let raw = try checkString(bytes, m.kind, m.valueRange, field: "ts", max: 64, escaped: m.valueEscaped)
            let valid = raw.escaped ? isRFC3339(decodeJSONString(raw.contents)) : isRFC3339(raw.contents)
            guard valid else {
                let value = raw.escaped ? decodeJSONString(raw.contents) : Array(raw.contents)
                throw WireError(
                    .invalidField,
                    "\"ts\" must be an RFC 3339 time like 2026-11-21T13:35:00.123Z; got \"\(String(decoding: value, as: UTF8.self))\""
                )
            }
        }
        try kind(.context, .object, "an object")

        var event = ScannedEvent(
            type: type, members: members, hasApp: hasApp, hasSession: hasSession, app: id == nil ? nil : app,
            session: id == nil ? nil : session, id: id,
            codableWhen: nil, needsEmptyParams: false)
        event.planFields = planFields(members, index)
        switch type {
        case .lifecycle:
            try requirePresent(.screen, "lifecycle")
            let status = try require(.status, "lifecycle", max: 32)
            let appearing = status == "willAppear" || status == "didAppear"
            guard appearing || status == "willDisappear" || status == "didDisappear" else {
                throw WireError(
                    .invalidField,
                    "\"status\" must be willAppear, didAppear, willDisappear or didDisappear; got \"\(status)\"")
            }
            try kind(.isBeingPresentedInitially, .bool, "true or false")
            try kind(.isBeingRemovedIndefinitely, .bool, "true or false")
            if isTrue(.isBeingPresentedInitially) && !appearing {
                throw WireError(
                    .invalidField,
                    "\"isBeingPresentedInitially\" can be true only on willAppear or didAppear, not on \(status)")
            }
            if isTrue(.isBeingRemovedIndefinitely) && appearing {
                throw WireError(
                    .invalidField,
                    "\"isBeingRemovedIndefinitely\" can be true only on willDisappear or didDisappear, not on \(status)"
                )
            }
        case .when:
            _ = try check(.screen)
            try kind(.params, .object, "an object")
            if index[KnownKey.when.rawValue] >= 0 {
                let w = Int(index[KnownKey.when.rawValue])
                guard member(.name) == nil else {
                    throw WireError(
                        .invalidField, "send either \"name\" (with \"params\") or \"when\" (the Codable form), not both"
                    )
                }
                guard member(.params) == nil else {
                    throw WireError(
                        .invalidField,
                        "the Codable form carries its params inside \"when\"; drop the separate \"params\"")
                }
                event.codableWhen = try scanCodableWhen(bytes, members[w], member: w)
            } else {
                guard let name = try string(.name) else {
                    throw WireError(.missingField, "when event needs \"name\" (or \"when\", the Codable form)")
                }
                guard isCaseName(name) else {
                    throw WireError(
                        .invalidField,
                        "\"name\" must match [A-Za-z_][A-Za-z0-9_]*; got \"\(String(decoding: name, as: UTF8.self))\"")
                }
                event.needsEmptyParams = member(.params) == nil
            }
        case .navigation:
            let action = try require(.action, "navigation", max: 32)
            switch action {
            case "root", "push", "present", "replace": try requirePresent(.screen, "navigation \(action)")
            case "dismiss", "pop": _ = try check(.screen)
            default:
                throw WireError(
                    .invalidField, "\"action\" must be root, push, present, replace, dismiss or pop; got \"\(action)\"")
            }
            try kind(.params, .object, "an object")
        case .screen:
            try requirePresent(.name, "screen")
        case .error:
            guard let m = member(.message) else { throw WireError(.missingField, "error event needs \"message\"") }
            guard m.kind == .string else { throw WireError(.invalidField, "\"message\" must be a string") }
            try kind(.fatal, .bool, "true or false")
            _ = try check(.name)
            _ = try check(.screen)
            if let stack = member(.stack) {
                guard stack.kind == .array, try arrayHoldsOnlyStrings(bytes, stack.valueRange) else {
                    throw WireError(.invalidField, "\"stack\" must be an array of strings, innermost frame first")
                }
            }
        }
        return event
    }

    static func scanCodableWhen(
        _ bytes: UnsafeBufferPointer<UInt8>, _ m: EventMember, member: Int
    ) throws(WireError) -> (member: Int, name: Range<Int>, params: Range<Int>) {
        let shape =
            "\"when\" must be an object with exactly one key, the case name, whose value is an object, like {\"userTypesNewEmail\":{\"userEmail\":\"a@example.com\"}}"
        guard m.kind == .object else { throw WireError(.invalidField, shape) }
        var s = JSONScanner(bytes)
        s.position = m.valueRange.lowerBound + 1
        s.skipWhitespace()
        guard s.peek() == UInt8(ascii: "\"") else { throw WireError(.invalidField, shape) }
        let (nameRange, escaped) = try s.scanString()
        try s.expect(UInt8(ascii: ":"), "':'")
        let (kind, params) = try s.scanValue(depth: 2)
        s.skipWhitespace()
        guard kind == .object, s.peek() == UInt8(ascii: "}") else { throw WireError(.invalidField, shape) }
        let name = UnsafeBufferPointer(rebasing: bytes[nameRange])
        guard !escaped, name.count <= 255, isCaseName(name) else {
            throw WireError(
                .invalidField,
                "the case name in \"when\" must match [A-Za-z_][A-Za-z0-9_]*; got \"\(text(bytes, nameRange))\"")
        }
        return (member, nameRange, params)
    }

    static func arrayHoldsOnlyStrings(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) throws(WireError)
        -> Bool
    {
        var s = JSONScanner(bytes)
        s.position = range.lowerBound + 1
        s.skipWhitespace()
        if s.peek() == UInt8(ascii: "]") { return true }
        while true {
            let (kind, _) = try s.scanValue(depth: 2)
            guard kind == .string else { return false }
            s.skipWhitespace()
            guard let b = s.peek() else { return false }
            s.position += 1
            if b == UInt8(ascii: "]") { return true }
        }
    }
}
