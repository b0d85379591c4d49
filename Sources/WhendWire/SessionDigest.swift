/// A session's identity — its app and session id (the same id in two apps is two sessions) —
/// hashed to 128 bits (SipHash-1-3 under a fixed key) from their decoded bytes, so that finding
/// a session's state allocates nothing, and the same session has the same digest in every
/// process (a plugin's saved state keys by it). Tables hash it again under a per-process key
/// (`_rawHashValue(seed:)`).
///
/// Two ids are one session exactly when they are one JSON string, as the journal stores them
/// apart (in canonical form): two spellings of one string (`"s1"`, `"s\u0031"`) are one
/// session, and two strings are two even where decoding makes them alike. A `\u` escape of a
/// surrogate without its partner has no UTF-8 of its own: decoded as U+FFFD, `"\ud800"`,
/// `"\udfff"` and `"\ufffd"` were one session; it is hashed as the three bytes UTF-8's pattern
/// gives it (WTF-8), which no text has. Ids without such a surrogate hash as they always did.
public struct SessionDigest: Hashable, Sendable, Codable {
    public let low: UInt64
    public let high: UInt64

    /// `nil` for a record without that field (a different session from an empty id).
    public init(app: UnsafeBufferPointer<UInt8>?, session: UnsafeBufferPointer<UInt8>?) {
        var hash = SipHash128()
        // Length first: ("ab", "c") and ("a", "bc") are two sessions. (No array of the two:
        // this runs for every record.)
        func add(_ part: UnsafeBufferPointer<UInt8>?) {
            guard let part else { return hash.write(UInt64.max) }
            hash.write(UInt64(part.count))
            hash.write(UnsafeRawBufferPointer(part))
        }
        add(app)
        add(session)
        (low, high) = hash.finalize()
    }

    /// A table's hash of the digest: SipHash-1-3 of it under a key drawn at random per process
    /// (and the table's seed). The digest's own key is fixed and public (a digest is saved, and
    /// is the same in every process), so a client can craft session ids whose digests agree in
    /// their low bits; with those bits for the table's (as before, mixed with the seed by an
    /// exclusive or), every such id fell in one run of buckets and each lookup walked it. Not
    /// through `Hasher`: a lookup cost 34 ns there against 16 ns here (7 ns before).
    public func _rawHashValue(seed: Int) -> Int {
        let key = (Self.tableKey.0 ^ UInt64(UInt(bitPattern: seed)), Self.tableKey.1)
        return Int(truncatingIfNeeded: SipHash128.hash(word: low, key: key))
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(low) }

    /// Drawn once per process (getrandom): never saved, so that no client can learn it.
    private static let tableKey: (UInt64, UInt64) = {
        var random = SystemRandomNumberGenerator()
        return (random.next(), random.next())
    }()

    /// A digest as saved.
    public init(low: UInt64, high: UInt64) {
        self.low = low
        self.high = high
    }

    /// From text: the same digest as the values that are these strings (no text holds a
    /// surrogate without its partner).
    public init(app: String, session: String) {
        var app = app
        var session = session
        self = app.withUTF8 { a in session.withUTF8 { s in SessionDigest(app: a, session: s) } }
    }

    /// From a record's `app` and `session` values as stored (escapes decoded first, a surrogate
    /// without its partner kept apart from U+FFFD).
    public init(app: JSONValue?, session: JSONValue?) {
        func contents(_ value: JSONValue?, _ body: (UnsafeBufferPointer<UInt8>?) -> SessionDigest) -> SessionDigest {
            guard let raw = value?.stringContents else { return body(nil) }
            guard raw.contains(UInt8(ascii: "\\")) else { return body(raw) }
            return decodeJSONString(raw, keepingLoneSurrogates: true).withUnsafeBufferPointer { body($0) }
        }
        self = contents(app) { a in contents(session) { s in SessionDigest(app: a, session: s) } }
    }
}
