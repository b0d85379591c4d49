/// The tracking plan's violations since whend started: how many by event and rule, and the
/// latest examples (a bounded ring, oldest first).
public struct PlanViolationReport: Codable, Sendable, Equatable {
    /// The plan in force (its path; empty: none) and its mode, report or enforce.
    public var plan: String
    public var mode: String
    public var counts: [Count]
    public var latest: [Example]

    public init(plan: String, mode: String, counts: [Count], latest: [Example]) {
        self.plan = plan
        self.mode = mode
        self.counts = counts
        self.latest = latest
    }

    public struct Count: Codable, Sendable, Equatable {
        /// The `When` name (empty for names the plan does not list: they are the clients'), or the
        /// event's type for a screen name.
        public var event: String
        public var rule: String
        public var count: Int

        public init(event: String, rule: String, count: Int) {
            self.event = event
            self.rule = rule
            self.count = count
        }
    }

    public struct Example: Codable, Sendable, Equatable {
        /// When, RFC 3339 UTC.
        public var time: String
        public var event: String
        public var rule: String
        /// Where in the event: `$.params.cart[2].price`.
        public var path: String
        public var message: String
        /// Whether the event was stored (report) or refused (enforce).
        public var stored: Bool
        public var app: String?
        /// The line's first `Rejection.lineLimit` bytes.
        public var line: String

        public init(
            time: String, event: String, rule: String, path: String, message: String, stored: Bool, app: String?,
            line: String
        ) {
            self.time = time
            self.event = event
            self.rule = rule
            self.path = path
            self.message = message
            self.stored = stored
            self.app = app
            self.line = line
        }
    }
}
