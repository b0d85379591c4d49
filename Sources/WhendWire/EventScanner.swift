import Foundation

/// The event types of PROTOCOL.md §6.
package enum EventType: String, Sendable, CaseIterable {
    case lifecycle, when, navigation, screen, error

    /// The type named by raw (unescaped) bytes, without building a String.
    static func match(_ b: UnsafeBufferPointer<UInt8>) -> EventType? {
        switch b.count {
        case 4: return equal(b, "when") ? .when : nil
        case 5: return equal(b, "error") ? .error : nil
        case 6: return equal(b, "screen") ? .screen : nil
        case 9: return equal(b, "lifecycle") ? .lifecycle : nil
        case 10: return equal(b, "navigation") ? .navigation : nil
        default: return nil
        }
    }
}

/// The connection settings a hello line carries (PROTOCOL.md §3).
package struct Hello: Sendable, Equatable {
    /// Default `app`, decoded UTF-8.
    package var app: [UInt8]?
    /// Default `session`, decoded UTF-8.
    package var session: [UInt8]?
    package var acks: Bool
    /// The app and session as an event's own would be stored: string literals in canonical
    /// form, quotes included. Decoded UTF-8 has no way to say a lone surrogate (`\ud800`), which
    /// became U+FFFD where an event's own member kept its escape: one app, stored two ways.
    package var storedApp: [UInt8]?
    package var storedSession: [UInt8]?

    package init(app: [UInt8]? = nil, session: [UInt8]? = nil, acks: Bool = false) {
        self.app = app
        self.session = session
        self.acks = acks
        func literal(_ text: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            appendJSONString(text, to: &out)
            return out
        }
        storedApp = app.map(literal)
        storedSession = session.map(literal)
    }
}

/// Top-level keys the protocol gives a meaning to.
enum KnownKey: Int {
    case type, app, session, id, ts, user, context
    case screen, status, isBeingPresentedInitially, isBeingRemovedIndefinitely
    case name, params, when, action, message, fatal, stack

    /// The key as it appears on the wire (for messages; no reflection on the hot path).
    var name: String {
        switch self {
        case .type: "type"
        case .app: "app"
        case .session: "session"
        case .id: "id"
        case .ts: "ts"
        case .user: "user"
        case .context: "context"
        case .screen: "screen"
        case .status: "status"
        case .isBeingPresentedInitially: "isBeingPresentedInitially"
        case .isBeingRemovedIndefinitely: "isBeingRemovedIndefinitely"
        case .name: "name"
        case .params: "params"
        case .when: "when"
        case .action: "action"
        case .message: "message"
        case .fatal: "fatal"
        case .stack: "stack"
        }
    }

    static func match(_ k: UnsafeBufferPointer<UInt8>) -> KnownKey? {
        // Dispatch on length first: most keys are rejected by one comparison.
        switch k.count {
        case 2: return equal(k, "id") ? .id : equal(k, "ts") ? .ts : nil
        case 3: return equal(k, "app") ? .app : nil
        case 4:
            if equal(k, "type") { return .type }
            if equal(k, "user") { return .user }
            if equal(k, "name") { return .name }
            if equal(k, "when") { return .when }
            return nil
        case 5: return equal(k, "fatal") ? .fatal : equal(k, "stack") ? .stack : nil
        case 6:
            if equal(k, "screen") { return .screen }
            if equal(k, "status") { return .status }
            if equal(k, "params") { return .params }
            if equal(k, "action") { return .action }
            return nil
        case 7:
            return equal(k, "session")
                ? .session : equal(k, "context") ? .context : equal(k, "message") ? .message : nil
        case 25:
            return equal(k, "isBeingPresentedInitially") ? .isBeingPresentedInitially : nil
        case 26:
            return equal(k, "isBeingRemovedIndefinitely") ? .isBeingRemovedIndefinitely : nil
        default: return nil
        }
    }
}

@inlinable package func equal(_ a: UnsafeBufferPointer<UInt8>, _ s: StaticString) -> Bool {
    let n = s.utf8CodeUnitCount
    guard a.count == n else { return false }
    let p = s.utf8Start
    for i in 0..<n where a[i] != p[i] { return false }
    return true
}

/// One top-level member of an event line: where its key and value lie in the line.
package struct EventMember: Sendable {
    /// The key's raw bytes, quotes included, as they came.
    package var keyRange: Range<Int>
    /// The key, decoded (without quotes).
    var key: KnownKey?
    package var kind: JSONKind
    /// The value's raw bytes as they came (a valid JSON value).
    package var valueRange: Range<Int>
    /// For a string value: whether it holds escapes, as the scan found.
    var valueEscaped = false
    /// Whether the bytes from the key to the value's end are already `"key":value` in the
    /// canonical form whend stores (`appendCanonicalJSON`): no spaces, no escape written
    /// otherwise than that form writes it.
    package var canonical = true
}

/// A validated event line, as positions into the line it was scanned from.
///
/// Valid only while that line's bytes are: the encoder turns it into a stored record at once.
package struct ScannedEvent: Sendable {
    package var type: EventType
    package var members: [EventMember]
    /// Whether the event carries its own `app` and `session` (else the connection's apply).
    package var hasApp: Bool
    package var hasSession: Bool
    /// Where the fields that identify the event for de-duplication lie in the line: set only
    /// when the event has an `id`.
    package var app: StringValue?
    package var session: StringValue?
    package var id: StringValue?
    /// For a `when` in the Codable form: the member index of `when`, and the ranges of the case
    /// name (raw string contents) and its params object.
    package var codableWhen: (member: Int, name: Range<Int>, params: Range<Int>)?
    /// True for a plain-form `when` without `params`: the stored record gains `"params":{}`.
    package var needsEmptyParams: Bool
    /// Where `name`, `params`, `screen` and `app` lie, for a tracking plan.
    package var planFields = PlanFields()
}

/// A string value in a line: its contents between the quotes, and whether they hold escapes.
package struct StringValue: Sendable {
    package var contents: Range<Int>
    package var escaped: Bool

    package init(contents: Range<Int>, escaped: Bool) {
        self.contents = contents
        self.escaped = escaped
    }
}

/// What one non-empty line turned out to be.
package enum ScannedLine: Sendable {
    case empty
    case hello(Hello)
    /// A subscriber's first line (PROTOCOL.md §9): the connection reads records from now on.
    case subscribe(SubscribeRequest)
    case event(ScannedEvent)
}

/// Validates lines of the event protocol (PROTOCOL.md §2–§6) without building a JSON tree.
package enum EventScanner {
    /// Scans one line (without its `\n`; a trailing `\r` is tolerated).
    ///
    /// - Parameters:
    ///   - line: the line's bytes.
    ///   - helloAllowed: true for the connection's first non-empty line.
    /// - Returns: `.empty` for a blank line, `.hello` for a valid hello on the first line, else
    ///   the validated event.
    /// - Throws: a `WireError` with the §5 code for the first rule the line breaks.
    package static func scan(_ line: UnsafeBufferPointer<UInt8>, helloAllowed: Bool) throws(WireError) -> ScannedLine {
        var members: [EventMember] = []
        return try scan(line, helloAllowed: helloAllowed, reusing: &members)
    }

    /// The same, reusing `members` as scratch space so that a connection allocates nothing per
    /// event once its buffer has grown.
    package static func scan(
        _ line: UnsafeBufferPointer<UInt8>, helloAllowed: Bool, reusing members: inout [EventMember]
    ) throws(WireError) -> ScannedLine {
        var end = line.count
        while end > 0, line[end - 1] == 0x0D || line[end - 1] == 0x20 || line[end - 1] == 0x09 { end -= 1 }
        var start = 0
        while start < end, line[start] == 0x20 || line[start] == 0x09 { start += 1 }
        if start == end { return .empty }
        // Positions stay relative to `line` itself (the encoder copies from it), so only the
        // end is cut; the scanner starts after the leading blanks.
        let bytes = UnsafeBufferPointer(rebasing: line[0..<end])

        if let bad = firstInvalidUTF8Offset(bytes) {
            throw WireError(
                .invalidUTF8, "the line is not valid UTF-8 (byte \(bad + 1)); send JSON text encoded as UTF-8")
        }
        var s = JSONScanner(bytes)
        s.position = start
        guard bytes[start] == UInt8(ascii: "{") else {
            // Tell "valid JSON but not an object" apart from "not JSON".
            _ = try s.scanValue()
            s.skipWhitespace()
            guard s.atEnd else { throw s.syntaxError("unexpected data after the value") }
            throw WireError(
                .notAnObject, "an event must be a JSON object, like {\"type\":\"when\",\"name\":\"appStarted\"}")
        }

        members.removeAll(keepingCapacity: true)
        var seen: UInt32 = 0
        var reserved: String?
        var duplicate: String?
        try s.scanObject { m throws(WireError) in
            var known: KnownKey?
            var firstByte: UInt8?
            if m.keyHasEscapes {
                let decoded = decodeJSONString(UnsafeBufferPointer(rebasing: bytes[m.key]))
                firstByte = decoded.first
                known = decoded.withUnsafeBufferPointer { KnownKey.match($0) }
            } else {
                firstByte = m.key.isEmpty ? nil : bytes[m.key.lowerBound]
                known = KnownKey.match(UnsafeBufferPointer(rebasing: bytes[m.key]))
            }
            if firstByte == UInt8(ascii: "_"), reserved == nil { reserved = text(bytes, m.key) }
            if let known {
                let bit: UInt32 = 1 << UInt32(known.rawValue)
                if seen & bit != 0, duplicate == nil { duplicate = text(bytes, m.quotedKey) }
                seen |= bit
            }
            members.append(
                EventMember(
                    keyRange: m.quotedKey, key: known, kind: m.kind, valueRange: m.value,
                    valueEscaped: m.valueHasEscapes, canonical: m.canonical))
        }
        s.skipWhitespace()
        guard s.atEnd else { throw s.syntaxError("unexpected data after the object") }

        // A hello is an object whose single key is "hello".
        if members.count == 1, equal(UnsafeBufferPointer(rebasing: bytes[members[0].keyRange]), "\"hello\"") {
            guard helloAllowed else {
                throw WireError(
                    .misplacedHello, "a hello is only allowed as the first line of a connection; this line was ignored")
            }
            do {
                return .hello(try scanHello(bytes, members[0]))
            } catch {
                var e = error
                e.isAboutConnection = true
                throw e
            }
        }
        // A subscription is an object whose single key is "subscribe", on the first line.
        if members.count == 1, equal(UnsafeBufferPointer(rebasing: bytes[members[0].keyRange]), "\"subscribe\"") {
            guard helloAllowed else {
                throw WireError(
                    .misplacedHello,
                    "a subscription is only allowed as the first line of a connection; this line was ignored")
            }
            do {
                return .subscribe(try SubscribeRequest.scan(bytes, members[0]))
            } catch {
                var e = error
                e.isAboutConnection = true
                throw e
            }
        }
        if let reserved {
            throw WireError(
                .reservedField,
                "key \"\(reserved)\" begins with '_'; such fields are set by whend only; rename it or move it into \"context\""
            )
        }
        if let duplicate {
            throw WireError(.invalidField, "key \(duplicate) appears more than once; send each field once")
        }
        return .event(try validateEvent(bytes, members))
    }

    static func text(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }

    static func scanHello(_ bytes: UnsafeBufferPointer<UInt8>, _ member: EventMember) throws(WireError) -> Hello {
        guard member.kind == .object else {
            throw WireError(.invalidField, "\"hello\" must be an object like {\"protocol\":1,\"acks\":true}")
        }
        var hello = Hello()
        var s = JSONScanner(bytes)
        s.position = member.valueRange.lowerBound
        try s.scanObject(depth: 1) { m throws(WireError) in
            let key = UnsafeBufferPointer(rebasing: bytes[m.key])
            if equal(key, "protocol") {
                guard m.kind == .number else {
                    throw WireError(.invalidField, "hello \"protocol\" must be an integer; this daemon speaks 1")
                }
                let v = text(bytes, m.value)
                guard v == "1" else {
                    throw WireError(
                        .unsupportedProtocol, "the hello asked for protocol \(v); this daemon speaks protocol 1")
                }
            } else if equal(key, "app") {
                hello.app = try stringValue(bytes, m.kind, m.value, field: "hello app", max: 255)
                hello.storedApp = storedString(bytes, m.value)
            } else if equal(key, "session") {
                hello.session = try stringValue(bytes, m.kind, m.value, field: "hello session", max: 128)
                hello.storedSession = storedString(bytes, m.value)
            } else if equal(key, "acks") {
                guard m.kind == .bool else { throw WireError(.invalidField, "hello \"acks\" must be true or false") }
                hello.acks = bytes[m.value.lowerBound] == UInt8(ascii: "t")
            }
            // Other keys are ignored, so that later protocol additions do not break this daemon.
        }
        return hello
    }

    /// A validated string's literal as whend stores it (`appendCanonicalString`).
    static func storedString(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> [UInt8] {
        var out: [UInt8] = []
        let contents = UnsafeBufferPointer(rebasing: bytes[(range.lowerBound + 1)..<(range.upperBound - 1)])
        appendCanonicalString(contents, to: &out)
        return out
    }

    /// Decodes a string field and checks its length in bytes.
    static func stringValue(
        _ bytes: UnsafeBufferPointer<UInt8>, _ kind: JSONKind, _ range: Range<Int>, field: String, min: Int = 1,
        max: Int, escaped known: Bool? = nil
    ) throws(WireError) -> [UInt8] {
        let raw = try checkString(bytes, kind, range, field: field, min: min, max: max, escaped: known)
        return raw.escaped ? decodeJSONString(raw.contents) : Array(raw.contents)
    }

    /// Checks a string field's type and length in bytes without copying it.
    /// - Parameter known: whether the value holds escapes, when the scan said so already.
    /// - Returns: its raw contents (between the quotes) and whether they hold escapes.
    @inline(__always)
    static func checkString(
        _ bytes: UnsafeBufferPointer<UInt8>, _ kind: JSONKind, _ range: Range<Int>, field: String, min: Int = 1,
        max: Int, escaped known: Bool? = nil
    ) throws(WireError) -> (contents: UnsafeBufferPointer<UInt8>, escaped: Bool) {
        guard kind == .string else { throw WireError(.invalidField, "\"\(field)\" must be a string") }
        let raw = UnsafeBufferPointer(rebasing: bytes[(range.lowerBound + 1)..<(range.upperBound - 1)])
        let escaped = known ?? (raw.count > 0 && memchr(raw.baseAddress!, 0x5C, raw.count) != nil)
        let length = escaped ? decodeJSONString(raw).count : raw.count
        guard length >= min && length <= max else {
            throw WireError(.invalidField, "\"\(field)\" must be \(min)–\(max) bytes long; it is \(length)")
        }
        return (raw, escaped)
    }

}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 255 bytes: a Swift enum case name.
func isCaseName<C: Collection<UInt8>>(_ name: C) -> Bool {
    guard let first = name.first, name.count <= 255 else { return false }
    func letter(_ b: UInt8) -> Bool { (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x5F }
    guard letter(first) else { return false }
    return name.allSatisfy { letter($0) || ($0 >= 0x30 && $0 <= 0x39) }
}
