/// A subscriber's first line (PROTOCOL.md §9): where its records start, and which it wants.
package struct SubscribeRequest: Sendable, Equatable {
    package enum Start: Sendable, Equatable {
        /// Records committed from now on.
        case now
        /// Every record the journal still holds.
        case oldest
        /// Records after this `_seq`: where a subscriber that saw it resumes.
        case after(UInt64)
        /// Records received at or after this time (microseconds since 1970).
        case since(Int64)
    }

    package var start: Start = .now
    /// Filters, decoded UTF-8; nil or empty for any.
    package var app: [UInt8]?
    package var session: [UInt8]?
    package var types: [String] = []
    package var names: [String] = []
    package var derived: Bool?
    package var pipeline: [UInt8]?

    package init() {}

    /// The keys a request may carry. Any other is refused (unlike a hello's), so that a
    /// misspelt filter is told rather than silently subscribing to everything.
    static let keys = ["after", "app", "derived", "from", "name", "pipeline", "protocol", "session", "since", "type"]

    /// Reads the object of `{"subscribe":{…}}` (the member `member` of the line `bytes`).
    static func scan(_ bytes: UnsafeBufferPointer<UInt8>, _ member: EventMember) throws(WireError)
        -> SubscribeRequest
    {
        guard member.kind == .object else {
            throw WireError(
                .invalidField, #"a subscription is an object, like {"subscribe":{"after":1200,"type":"when"}}"#)
        }
        var request = SubscribeRequest()
        var starts: [String] = []
        var named: Set<String> = []
        var s = JSONScanner(bytes)
        s.position = member.valueRange.lowerBound
        try s.scanObject(depth: 1) { m throws(WireError) in
            let key =
                m.keyHasEscapes
                ? String(decoding: decodeJSONString(UnsafeBufferPointer(rebasing: bytes[m.key])), as: UTF8.self)
                : EventScanner.text(bytes, m.key)
            // Which of two would count is no one's guess to make: a filter given twice is refused.
            guard named.insert(key).inserted else {
                throw WireError(.invalidField, "a subscription names \"\(key)\" twice; give it once")
            }
            let value = EventScanner.text(bytes, m.value)
            func string(max: Int) throws(WireError) -> [UInt8] {
                try EventScanner.stringValue(bytes, m.kind, m.value, field: "subscribe \(key)", max: max)
            }
            switch key {
            case "protocol":
                guard m.kind == .number else {
                    throw WireError(.invalidField, "subscribe \"protocol\" must be an integer; this daemon speaks 1")
                }
                guard value == "1" else {
                    throw WireError(
                        .unsupportedProtocol, "the subscription asked for protocol \(value); this daemon speaks 1")
                }
            case "from":
                starts.append(key)
                switch String(decoding: try string(max: 16), as: UTF8.self) {
                case "now": request.start = .now
                case "oldest": request.start = .oldest
                default: throw WireError(.invalidField, "subscribe \"from\" must be \"now\" or \"oldest\"")
                }
            case "after":
                starts.append(key)
                guard m.kind == .number, let seq = UInt64(value) else {
                    throw WireError(
                        .invalidField, "subscribe \"after\" must be a _seq: an integer, 0 or more; got \(value)")
                }
                request.start = .after(seq)
            case "since":
                starts.append(key)
                let text = try string(max: 64)
                guard isRFC3339(text), let instant = RFC3339.parse(text) else {
                    throw WireError(
                        .invalidField, "subscribe \"since\" must be an RFC 3339 time like 2026-11-21T13:35:00Z")
                }
                request.start = .since(instant.microseconds)
            case "app": request.app = try string(max: 255)
            case "session": request.session = try string(max: 128)
            case "pipeline": request.pipeline = try string(max: 255)
            case "type": request.types = try strings(bytes, m, field: key)
            case "name": request.names = try strings(bytes, m, field: key)
            case "derived":
                guard m.kind == .bool else {
                    throw WireError(.invalidField, "subscribe \"derived\" must be true or false")
                }
                request.derived = value == "true"
            default:
                throw WireError(
                    .invalidField,
                    "a subscription has no \"\(key)\"; it takes \(keys.joined(separator: ", "))")
            }
        }
        guard starts.count <= 1 else {
            throw WireError(
                .invalidField, "a subscription starts at one place; it gave \(starts.joined(separator: " and "))")
        }
        return request
    }

    /// A string, or a list of up to 256 strings.
    private static func strings(_ bytes: UnsafeBufferPointer<UInt8>, _ m: JSONScanner.Member, field: String)
        throws(WireError) -> [String]
    {
        let wrong = WireError(.invalidField, "subscribe \"\(field)\" must be a string or a list of up to 256 strings")
        func one(_ kind: JSONKind, _ range: Range<Int>) throws(WireError) -> String {
            String(
                decoding: try EventScanner.stringValue(bytes, kind, range, field: "subscribe \(field)", max: 255),
                as: UTF8.self)
        }
        if m.kind == .string { return [try one(m.kind, m.value)] }
        guard m.kind == .array else { throw wrong }
        var out: [String] = []
        var s = JSONScanner(bytes)
        s.position = m.value.lowerBound
        try s.scanArray(depth: 1) { kind, range throws(WireError) in
            guard out.count < 256 else { throw wrong }
            out.append(try one(kind, range))
        }
        // An empty list would pass nothing, and no filter at all passes everything: neither is
        // what a sender of [] is likely to mean, so it is told.
        guard !out.isEmpty else {
            throw WireError(
                .invalidField, "subscribe \"\(field)\" is an empty list, which passes nothing; leave it out for any")
        }
        return out
    }
}
