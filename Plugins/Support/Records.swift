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
