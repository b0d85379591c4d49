import WhendWire

/// The fields of a stored record (PROTOCOL.md §7) that readers filter and index on.
///
/// Scanning validates the whole line as one JSON object, so a reader that gets a
/// `StoredRecord` knows the line is sound.
package struct StoredRecord: Sendable, Equatable {
    package var seq: UInt64?
    /// `_rt` in microseconds since 1970.
    package var receivedMicros: Int64?
    package var type: String?
    /// A `when` event's name (its `name`), decoded.
    package var name: String?
    package var app: [UInt8]?
    package var session: [UInt8]?
    package var id: [UInt8]?
    /// The de-duplication identity, when the record carries an `id` (and an `app`), from the
    /// strings as stored (`DedupKey`): `app`, `session` and `id` above are decoded, and decoding
    /// makes one of strings that differ.
    package var dedupKey: DedupKey?
    /// Whether a pipeline derived the record (it carries `_origin`, which only whend writes):
    /// a resend of a client's event is never one of these.
    package var isDerived = false
    /// A derived record's `_origin` (the stage that derived it) and `_pipeline`, decoded, and
    /// its `_cause`. Read by whend's own scanner: Foundation's parser refuses values whend
    /// stores (an unpaired surrogate's escape, a number past a Double), and a reader of
    /// derived records that skipped those would take what was derived for not derived.
    package var origin: [UInt8]?
    package var pipeline: [UInt8]?
    package var cause: UInt64?

    package init() {}

    /// Scans one stored line.
    /// - Throws: `WireError` (`invalid_json`, `not_an_object`, `invalid_utf8`) when the line is
    ///   not one JSON object.
    package static func scan(_ line: UnsafeBufferPointer<UInt8>) throws(WireError) -> StoredRecord {
        if let bad = firstInvalidUTF8Offset(line) {
            throw WireError(.invalidUTF8, "not UTF-8 at byte \(bad + 1)")
        }
        var s = JSONScanner(line)
        s.skipWhitespace()
        guard s.peek() == UInt8(ascii: "{") else { throw WireError(.notAnObject, "the line is not a JSON object") }
        var record = StoredRecord()
        // The contents of the `app`, `session` and `id` strings, for the key.
        var keyParts: (app: Range<Int>?, session: Range<Int>?, id: Range<Int>?) = (nil, nil, nil)
        try s.scanObject { m throws(WireError) in
            let key = UnsafeBufferPointer(rebasing: line[m.key])
            let inner =
                m.kind == .string
                ? UnsafeBufferPointer(rebasing: line[(m.value.lowerBound + 1)..<(m.value.upperBound - 1)]) : nil
            func decoded() -> [UInt8]? {
                guard let inner else { return nil }
                return inner.contains(UInt8(ascii: "\\")) ? decodeJSONString(inner) : Array(inner)
            }
            if equal(key, "_seq"), m.kind == .number {
                record.seq = JSONBytes.parseUInt(UnsafeBufferPointer(rebasing: line[m.value]))
            } else if equal(key, "_rt"), let inner {
                record.receivedMicros = RFC3339.parse(inner)?.microseconds
            } else if equal(key, "type") {
                record.type = decoded().map { String(decoding: $0, as: UTF8.self) }
            } else if equal(key, "name") {
                record.name = decoded().map { String(decoding: $0, as: UTF8.self) }
            } else if equal(key, "app") {
                record.app = decoded()
                keyParts.app = inner.map { _ in (m.value.lowerBound + 1)..<(m.value.upperBound - 1) }
            } else if equal(key, "session") {
                record.session = decoded()
                keyParts.session = inner.map { _ in (m.value.lowerBound + 1)..<(m.value.upperBound - 1) }
            } else if equal(key, "id") {
                record.id = decoded()
                keyParts.id = inner.map { _ in (m.value.lowerBound + 1)..<(m.value.upperBound - 1) }
            } else if equal(key, "_origin") {
                record.isDerived = true
                record.origin = decoded()
            } else if equal(key, "_pipeline") {
                record.pipeline = decoded()
            } else if equal(key, "_cause"), m.kind == .number {
                record.cause = JSONBytes.parseUInt(UnsafeBufferPointer(rebasing: line[m.value]))
            }
        }
        s.skipWhitespace()
        guard s.atEnd else { throw s.syntaxError("unexpected data after the object") }
        if let app = keyParts.app, let id = keyParts.id {
            var builder = DedupKey.Builder()
            func add(_ range: Range<Int>) {
                let raw = UnsafeBufferPointer(rebasing: line[range])
                builder.add(string: raw, escaped: raw.contains(UInt8(ascii: "\\")))
            }
            add(app)
            if let session = keyParts.session {
                add(session)
            } else {
                builder.add(UnsafeBufferPointer(start: nil, count: 0))
            }
            add(id)
            record.dedupKey = builder.finish(hasSession: keyParts.session != nil)
        }
        return record
    }
}

/// Builds derived records as the journal stores them, one after another: the plugin's members,
/// checked (`IngestRewrite.appendDerivedBody`), then whend's trusted ones,
/// `"_origin":…[,"_pipeline":…],"_cause":N,"_rt":"T"`. The daemon and `whenctl replay` build
/// them the same way, so that both store the same bytes.
package struct DerivedRecordBuilder {
    private let pipeline: String?
    private var origin = ""
    /// The trusted members of the last record; its first `prefixLength` bytes are the origin's.
    private var trusted: [UInt8] = []
    private var prefixLength = 0

    package init(pipeline: String?) { self.pipeline = pipeline }

    /// Appends the body of the record `origin` derived from `_seq` `cause` (without the opening
    /// brace: the journal writer puts `{"_seq":N,` before it) to `out`; on error `out` is as it
    /// was. `receivedAt` is the `_rt` to give it, without quotes.
    package mutating func appendBody(
        _ json: UnsafeBufferPointer<UInt8>, origin: String, cause: UInt64, receivedAt: [UInt8],
        to out: inout [UInt8]
    ) throws(WireError) {
        if origin != self.origin || trusted.isEmpty {
            self.origin = origin
            // `"_origin":"NAME"[,"_pipeline":"P"],"_cause":`
            trusted = Array(#""_origin":"#.utf8)
            appendJSONString(origin.utf8, to: &trusted)
            if let pipeline {
                trusted += #","_pipeline":"#.utf8
                appendJSONString(pipeline.utf8, to: &trusted)
            }
            trusted += #","_cause":"#.utf8
            prefixLength = trusted.count
        }
        trusted.removeSubrange(prefixLength...)
        JSONBytes.appendDecimal(cause, to: &trusted)
        trusted += #","_rt":""#.utf8
        trusted += receivedAt
        trusted.append(UInt8(ascii: "\""))
        try trusted.withUnsafeBufferPointer { (members) throws(WireError) in
            try IngestRewrite.appendDerivedBody(output: json, trustedMembers: members, to: &out)
        }
    }
}
