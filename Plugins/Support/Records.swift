import WhendWire

/// A session is an app's session: the same id in two apps is two sessions.
package struct SessionKey: Hashable, Sendable {
    package var app: String
    package var session: String
    package init(app: String, session: String) {
        self.app = app
        self.session = session
    }
}
