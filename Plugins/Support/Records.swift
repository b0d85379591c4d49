import WhendWire

/// A session is an app's session: the same id in two apps is two sessions.
public struct SessionKey: Hashable, Sendable {
    public var app: String
    public var session: String
    public init(app: String, session: String) {
        self.app = app
        self.session = session
    }
}

public enum RFC3339 {
    /// Seconds since 1970 of `2026-11-21T13:44:59.546458Z` or with an offset; nil if malformed.
    public static func seconds(_ text: String) -> Double? {
        var text = text
        return text.withUTF8 { rfc3339Seconds($0) }
    }
}
