/// A session's identity — its app and session id (the same id in two apps is two sessions) —
/// hashed to 128 bits from their decoded bytes, so that finding a session's state allocates
/// nothing. The digest is seeded per process: it is for memory, never for files.
public struct SessionDigest: Hashable, Sendable {
    public let low: UInt64
    public let high: UInt64

    /// `nil` for a record without that field (a different session from an empty id).
    public init(app: UnsafeBufferPointer<UInt8>?, session: UnsafeBufferPointer<UInt8>?) {
        // One SipHash (seeded per process) and one FNV-1a over the same bytes: two sessions
        // share a digest only if both collide.
        var hasher = Hasher()
        var fnv: UInt64 = 0xcbf2_9ce4_8422_2325
        func add(_ part: UnsafeBufferPointer<UInt8>?) {
            guard let part else {
                hasher.combine(-1)
                fnv = (fnv ^ 0xFF) &* 0x100_0000_01b3
                return
            }
            hasher.combine(bytes: UnsafeRawBufferPointer(part))
            hasher.combine(part.count)
            for b in part { fnv = (fnv ^ UInt64(b)) &* 0x100_0000_01b3 }
            fnv = (fnv ^ UInt64(part.count)) &* 0x100_0000_01b3
        }
        add(app)
        add(session)
        low = UInt64(UInt(bitPattern: hasher.finalize()))
        high = fnv
    }

    public init(app: String, session: String) {
        var app = app
        var session = session
        self = app.withUTF8 { a in session.withUTF8 { s in SessionDigest(app: a, session: s) } }
    }

    /// From a record's `app` and `session` values as stored (escapes decoded first).
    public init(app: JSONValue?, session: JSONValue?) {
        func contents(_ value: JSONValue?, _ body: (UnsafeBufferPointer<UInt8>?) -> SessionDigest) -> SessionDigest {
            guard let raw = value?.stringContents else { return body(nil) }
            guard raw.contains(UInt8(ascii: "\\")) else { return body(raw) }
            return decodeJSONString(raw).withUnsafeBufferPointer { body($0) }
        }
        self = contents(app) { a in contents(session) { s in SessionDigest(app: a, session: s) } }
    }
}
