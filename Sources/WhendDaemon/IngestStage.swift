import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendRecord
import WhendTrackingPlan
import WhendWire

/// The ingest path of one connection, without the socket: each line a client sent is scanned
/// and validated, rate limited, checked against the tracking plan, encoded as a record body
/// with its trusted fields, passed through the ingest middleware, and added to the batch for
/// the journal — or answered. Reads top to bottom in `take(_:)`. The connection handler
/// (`EventConnectionHandler`) keeps the transport: framing, batching per read, acks,
/// back-pressure and drain.
struct IngestStage {
    /// What the client must be told about a line.
    enum Answer {
        /// The hello was taken: welcome the client.
        case welcome([UInt8])
        /// Line `line` is not stored, for `error`.
        case rejected(line: UInt64, WireError)
        /// The hello cannot be honoured: say this and close the connection.
        case refuse([UInt8])
        /// The first line asks for a subscription: the connection reads records from now on.
        case subscribe(SubscribeRequest)
    }

    private(set) var configuration: DaemonConfiguration
    private var ingest: PluginChain
    private(set) var plan: TrackingPlan?
    /// Where violations of the plan are counted (nil: nowhere, as in tests of the stage alone).
    private let metrics: DaemonMetrics?
    /// The app of an event without its own: the hello's, else the sender's process name (as the
    /// encoder stores it), for a plan's per-app rules.
    private(set) var defaultApp: [UInt8]
    private let limiter: SenderRateLimiter
    private let credentials: PeerCredentials
    private let connectionID: UInt64
    private var encoder: RecordEncoder
    private var members: [EventMember] = []
    /// The record as ingest middleware sees it: `{` and the body.
    private var ingestRecord: [UInt8] = []
    private var sawFirstLine = false
    /// Whether the client asked for acknowledgements (its hello).
    private(set) var acks = false
    /// The hello's default app.
    private(set) var helloApp: [UInt8]?
    /// The last line counted (the hello and empty lines are not).
    private(set) var lineNumber: UInt64 = 0
    /// The records taken since the last `takeBatch()`, and the line each came from.
    private(set) var batch = JournalBatch()
    private(set) var batchLines: [UInt64] = []

    init(
        configuration: DaemonConfiguration, ingest: PluginChain, plan: TrackingPlan? = nil,
        limiter: SenderRateLimiter, credentials: PeerCredentials, connectionID: UInt64, metrics: DaemonMetrics? = nil
    ) {
        self.configuration = configuration
        self.ingest = ingest
        self.plan = plan
        self.longCheckLineBytes = plan?.longCheckLineBytes ?? .max
        self.metrics = metrics
        self.defaultApp = credentials.comm.isEmpty ? Array("unknown".utf8) : Array(credentials.comm.utf8)
        self.limiter = limiter
        self.credentials = credentials
        self.connectionID = connectionID
        self.encoder = RecordEncoder(credentials: credentials)
    }

    /// A reload: the new settings, middleware and plan, except the line limit the client was told.
    mutating func reconfigure(_ new: DaemonConfiguration, ingest: PluginChain, plan: TrackingPlan?) {
        let lineLimit = configuration.maxEventBytes
        configuration = new
        configuration.maxEventBytes = lineLimit
        self.ingest = ingest
        self.plan = plan
        longCheckLineBytes = plan?.longCheckLineBytes ?? .max
    }

    /// A read begins: its lines all arrived at this moment (one `_rt` for them), and the batch
    /// grows to about `bytes` and the trusted fields, reserved once.
    mutating func beginRead(bytes: Int) {
        if batch.isEmpty && batch.bodies.capacity == 0 {
            let expected = bytes + bytes / 2
            batch.bodies.reserveCapacity(expected)
            batch.ends.reserveCapacity(expected / 128)
            batchLines.reserveCapacity(expected / 128)
        }
        let received = encoder.stampReceived()
        batch.minReceivedMicros = min(batch.minReceivedMicros, received)
        batch.maxReceivedMicros = max(batch.maxReceivedMicros, received)
    }

    /// The plan's verdict on a line, when it was reached elsewhere (`planVerdict(of:…)`).
    enum PlanVerdict {
        /// Check the line here.
        case unchecked
        /// Checked already: its violation, or nil.
        case checked(PlanViolation?)
    }

    /// Lines longer than this may take long to check against the plan: the connection then
    /// has each checked on another thread (`planVerdict(of:…)`) and hands the verdict to
    /// `take`. An integer, so that no other line touches the plan's reference count for it
    /// (`plan` is read only for such a line).
    private(set) var longCheckLineBytes = Int.max

    /// What `plan` says of `line`, as `take` would check it; nil for a line that is no event
    /// (`take` answers it as ever). Touches nothing of a connection's, so any thread may run it.
    static func planVerdict(of line: [UInt8], plan: TrackingPlan, defaultApp: [UInt8]) -> PlanViolation? {
        var members: [EventMember] = []
        return line.withUnsafeBufferPointer { bytes in
            guard case .event(let event) = try? EventScanner.scan(bytes, helloAllowed: false, reusing: &members)
            else { return nil }
            return check(event, bytes, against: plan, defaultApp: defaultApp)
        }
    }

    /// One check of `event` against `plan`, wherever it runs: inlined, as the check it replaced
    /// on every event's path was.
    @inline(__always)
    private static func check(
        _ event: ScannedEvent, _ line: UnsafeBufferPointer<UInt8>, against plan: TrackingPlan, defaultApp: [UInt8]
    ) -> PlanViolation? {
        let subject = PlanSubject(type: event.type, fields: event.planFields, codableWhen: event.codableWhen)
        return defaultApp.withUnsafeBufferPointer { plan.check(subject, in: line, defaultApp: $0) }
    }

    /// Takes one framed line; returns what the client must be told, if anything.
    mutating func take(_ piece: LineFramer.Piece, plan verdict: PlanVerdict = .unchecked) -> Answer? {
        let bytes: UnsafeBufferPointer<UInt8>
        switch piece {
        case .tooLarge(let length):
            sawFirstLine = true
            lineNumber += 1
            return .rejected(
                line: lineNumber,
                WireError(
                    .tooLarge,
                    "the line is \(length) bytes; the limit is \(configuration.maxEventBytes) (max_event_bytes); split the event or move bulk data out of it"
                ))
        case .line(let line):
            bytes = line
        }
        // 1. Scan and validate, in place.
        let scanned: ScannedLine
        do {
            scanned = try EventScanner.scan(bytes, helloAllowed: !sawFirstLine, reusing: &members)
        } catch {
            // A hello we cannot honour: say why and close, rather than guess its settings.
            if error.isAboutConnection { return .refuse(ServerMessage.error(error, event: nil)) }
            sawFirstLine = true
            lineNumber += 1
            return .rejected(line: lineNumber, error)
        }
        let event: ScannedEvent
        switch scanned {
        case .empty:
            return nil
        case .hello(let hello):
            sawFirstLine = true
            acks = hello.acks
            helloApp = hello.app
            if let app = hello.app { defaultApp = app }
            encoder = encoder.with(hello: hello)
            return .welcome(
                ServerMessage.welcome(
                    server: "whend/\(WhendVersion.current)", maxEventBytes: configuration.maxEventBytes))
        case .subscribe(let request):
            sawFirstLine = true
            return .subscribe(request)
        case .event(let scannedEvent):
            event = scannedEvent
        }
        sawFirstLine = true
        lineNumber += 1
        // 2. The rate limit.
        guard configuration.rateLimit <= 0 || limiter.take(credentials: credentials, connection: connectionID) else {
            return .rejected(
                line: lineNumber,
                WireError(
                    .rateLimited,
                    "over the limit of \(Settings.number(configuration.rateLimit)) events/s per \(configuration.rateLimitBy.rawValue) (burst \(Settings.number(configuration.rateBurst))); the event was not stored; slow down and send it again"
                ))
        }
        // 3. The tracking plan: an event that breaks it is counted, and refused if it is enforced.
        if plan != nil, let refusal = checkPlan(event, bytes, verdict) { return .rejected(line: lineNumber, refusal) }
        // 4. The record body, trusted fields stamped.
        let bodyStart = batch.bodies.count
        let key = encoder.appendBody(of: event, line: bytes, to: &batch.bodies)
        // 5. The ingest middleware.
        if !ingest.isEmpty, case .discard(let answer) = passIngest(bodyFrom: bodyStart) { return answer }
        // 6. Into the batch for the journal.
        batch.ends.append(batch.bodies.count)
        if let key { batch.keys.append((batch.ends.count - 1, key)) }
        batchLines.append(lineNumber)
        return nil
    }

    /// Checks an event against the plan; why it is refused (enforce), or nil when it is to be
    /// stored (it keeps to the plan, or the plan is only reported on). A small result, not an
    /// `Answer`: the path every event takes stays as lean as it was without a plan.
    private func checkPlan(_ event: ScannedEvent, _ line: UnsafeBufferPointer<UInt8>, _ verdict: PlanVerdict)
        -> WireError?
    {
        // Borrowed from the stage, which holds it: no reference count touched per event.
        guard let plan else { return nil }
        let violation: PlanViolation?
        switch verdict {
        case .unchecked: violation = Self.check(event, line, against: plan, defaultApp: defaultApp)
        case .checked(let known): violation = known
        }
        guard let violation else { return nil }
        let enforced = configuration.trackingPlanMode == .enforce
        let app = event.planFields.app.map { app in
            let raw = UnsafeBufferPointer(rebasing: line[app.contents])
            return app.escaped ? decodeJSONString(raw) : Array(raw)
        }
        metrics?.planViolation(violation, stored: !enforced, line: line, app: app ?? defaultApp)
        guard enforced else { return nil }
        return WireError(
            .planViolation,
            "\(violation); the event was not stored (tracking_plan_mode = enforce); see whenctl plan violations")
    }

    /// The batch so far, and its lines; the stage starts a new one.
    mutating func takeBatch() -> (batch: JournalBatch, lines: [UInt64])? {
        guard !batch.isEmpty else { return nil }
        defer {
            batch = JournalBatch()
            batchLines = []
        }
        return (batch, batchLines)
    }

    /// What the ingest middleware made of a record: store it (as it was, or as a plugin changed
    /// it), or discard it with what to answer (nil: a plugin dropped it, nothing to say).
    private enum Verdict {
        case store
        case discard(Answer?)
    }

    /// Runs the record just encoded at `start` through the ingest middleware.
    private mutating func passIngest(bodyFrom start: Int) -> Verdict {
        ingestRecord.removeAll(keepingCapacity: true)
        ingestRecord.append(UInt8(ascii: "{"))
        ingestRecord.append(contentsOf: batch.bodies[start...])
        let outcome = ingestRecord.withUnsafeBufferPointer { ingest.run($0) }
        switch outcome {
        case .unchanged:
            return .store
        case .changed(let output, let plugin):
            do {
                let body = try output.withUnsafeBufferPointer { out in
                    try ingestRecord.withUnsafeBufferPointer { original in
                        try IngestRewrite.body(output: out, original: original)
                    }
                }
                batch.bodies.removeSubrange(start...)
                batch.bodies.append(contentsOf: body)
                return .store
            } catch {
                batch.bodies.removeSubrange(start...)
                return .discard(
                    .rejected(
                        line: lineNumber,
                        WireError(.rejected, "plugin \(plugin) changed the event into something invalid: \(error)")))
            }
        case .dropped:
            batch.bodies.removeSubrange(start...)
            return .discard(nil)
        case .rejected(let message):
            batch.bodies.removeSubrange(start...)
            return .discard(.rejected(line: lineNumber, WireError(.rejected, message)))
        }
    }
}
