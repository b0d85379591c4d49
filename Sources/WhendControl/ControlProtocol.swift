import Foundation

/// The control socket's protocol, shared by whend and whenctl: one request line of JSON in, one
/// answer line of JSON out, then whend closes. Version 1, the only one: a request may say
/// `"version":1` (or nothing, which means 1); a request for a version whend does not speak is
/// refused, naming the versions it does. Fields are added to answers without a new version;
/// a reader ignores fields it does not know.
public enum ControlProtocol {
    public static let version = 1
    /// A request longer than this is refused: the commands are short.
    public static let maxRequestBytes = 64 << 10
}

/// What whenctl asks.
public enum ControlRequest: Sendable, Equatable {
    case status
    /// The events whend refused lately (a bounded ring), oldest first.
    case rejections
    case reload
    case metrics
    case plugins
    /// Route records to a plugin again.
    case load(plugin: String)
    /// Stop routing records to a plugin (its pipelines wait at their cursors).
    case unload(plugin: String)
    /// Restart a pipeline's worker from its cursor.
    case restart(pipeline: String)
    /// The tracking plan's violations: counts by event and rule, and the latest examples.
    case planViolations

    /// The commands, as sent.
    public static let commands = [
        "status", "reload", "metrics", "plugins", "load", "unload", "restart", "plan-violations",
    ]

    public var command: String {
        switch self {
        case .status: "status"
        case .rejections: "rejections"
        case .reload: "reload"
        case .metrics: "metrics"
        case .plugins: "plugins"
        case .load: "load"
        case .unload: "unload"
        case .restart: "restart"
        case .planViolations: "plan-violations"
        }
    }

    /// The request as one line of JSON, without its `\n`.
    public func encoded() -> [UInt8] {
        var arguments: [String: String] = [:]
        switch self {
        case .load(let plugin), .unload(let plugin): arguments["plugin"] = plugin
        case .restart(let pipeline): arguments["pipeline"] = pipeline
        case .status, .rejections, .reload, .metrics, .plugins, .planViolations: break
        }
        return ControlJSON.encode(Wire(command: command, version: ControlProtocol.version, object: arguments))
    }

    /// Reads a request line; what is wrong with it says what to send instead.
    public static func decode(_ line: [UInt8]) throws(ControlRequestError) -> ControlRequest {
        guard let wire = try? JSONDecoder().decode(Wire.self, from: Data(line)) else { throw .notARequest }
        if wire.versionGiven, wire.version != ControlProtocol.version { throw .unsupportedVersion(wire.version) }
        switch wire.command {
        case "status": return .status
        case "rejections": return .rejections
        case "reload": return .reload
        case "metrics": return .metrics
        case "plugins": return .plugins
        case "plan-violations": return .planViolations
        case "load", "unload":
            guard let plugin = wire.object["plugin"], !plugin.isEmpty else { throw .missing("plugin", wire.command) }
            return wire.command == "load" ? .load(plugin: plugin) : .unload(plugin: plugin)
        case "restart":
            guard let pipeline = wire.object["pipeline"], !pipeline.isEmpty else {
                throw .missing("pipeline", wire.command)
            }
            return .restart(pipeline: pipeline)
        default: throw .unknownCommand(wire.command)
        }
    }

    /// A request as it travels: its command, its version, and its string arguments.
    struct Wire: Codable {
        var command: String
        var version: Int?
        /// Whether the request named a version at all (`null`, a string or a fraction included).
        var versionGiven = false
        var object: [String: String]

        init(command: String, version: Int?, object: [String: String]) {
            self.command = command
            self.version = version
            self.object = object
        }

        private struct Key: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: Key.self)
            command = try c.decode(String.self, forKey: Key(stringValue: "command"))
            let versionKey = Key(stringValue: "version")
            versionGiven = c.contains(versionKey)
            version = try? c.decode(Int.self, forKey: versionKey)
            var object: [String: String] = [:]
            for key in c.allKeys where key.stringValue != "command" && key.stringValue != "version" {
                if let value = try? c.decode(String.self, forKey: key) { object[key.stringValue] = value }
            }
            self.object = object
        }

        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(command, forKey: Key(stringValue: "command"))
            try c.encodeIfPresent(version, forKey: Key(stringValue: "version"))
            for (key, value) in object { try c.encode(value, forKey: Key(stringValue: key)) }
        }
    }
}

/// Why a request line was refused.
public enum ControlRequestError: Error, Sendable, Equatable, CustomStringConvertible {
    case notARequest
    case unknownCommand(String)
    case missing(_ field: String, _ command: String)
    /// A version other than 1 (nil: not a whole number).
    case unsupportedVersion(Int?)

    public var description: String {
        let commands = ControlRequest.commands.joined(separator: ", ")
        switch self {
        case .notARequest:
            return #"expected one line of JSON like {"command":"status"}; the commands are "# + commands
        case .unknownCommand(let command):
            return "unknown command \"\(command)\"; the commands are \(commands)"
        case .missing(let field, let command):
            return "\(command) needs a \(field): {\"command\":\"\(command)\",\"\(field)\":\"NAME\"}"
        case .unsupportedVersion(let version):
            let which = version.map { "control protocol version \($0)" } ?? "a version that is not a whole number"
            return "\(which) is not spoken here; this whend speaks version \(ControlProtocol.version)"
        }
    }
}

/// What whend answers: `ok`, and the fields of the command asked (or `error`).
public struct ControlAnswer: Codable, Sendable, Equatable {
    public var ok: Bool
    public var error: String?
    /// `status`
    public var status: StatusAnswer?
    /// `metrics`: the Prometheus text.
    public var metrics: String?
    /// `plugins`
    public var plugins: [PluginStatus]?
    public var pipelines: [PipelineStatus]?
    /// `reload`: `key: old → new` for each setting taken up, and the keys that wait for a restart.
    public var changed: [String]?
    public var needRestart: [String]?
    /// `rejections`
    public var rejections: [Rejection]?
    /// `plan-violations`
    public var planViolations: PlanViolationReport?

    public init(
        ok: Bool = true, error: String? = nil, status: StatusAnswer? = nil, metrics: String? = nil,
        plugins: [PluginStatus]? = nil, pipelines: [PipelineStatus]? = nil, changed: [String]? = nil,
        needRestart: [String]? = nil, rejections: [Rejection]? = nil, planViolations: PlanViolationReport? = nil
    ) {
        self.planViolations = planViolations
        self.rejections = rejections
        self.ok = ok
        self.error = error
        self.status = status
        self.metrics = metrics
        self.plugins = plugins
        self.pipelines = pipelines
        self.changed = changed
        self.needRestart = needRestart
    }

    /// What `whenctl plugins --json` prints.
    public struct PluginsList: Codable, Sendable {
        public var plugins: [PluginStatus]
        public var pipelines: [PipelineStatus]
        public init(plugins: [PluginStatus], pipelines: [PipelineStatus]) {
            self.plugins = plugins
            self.pipelines = pipelines
        }
    }

    /// A refusal, saying why and what to do.
    public static func refused(_ why: String) -> ControlAnswer { ControlAnswer(ok: false, error: why) }

    enum CodingKeys: String, CodingKey {
        case ok, error, status, metrics, plugins, pipelines, changed, rejections
        case needRestart = "need_restart"
        case planViolations = "plan_violations"
    }

    /// The answer as one line of JSON, without its `\n`.
    public func encoded() -> [UInt8] { ControlJSON.encode(self) }

    public static func decode(_ line: [UInt8]) -> ControlAnswer? {
        try? JSONDecoder().decode(ControlAnswer.self, from: Data(line))
    }
}

/// An event line whend refused: when, why, the start of the line, and who sent it.
public struct Rejection: Codable, Sendable, Equatable {
    /// When, RFC 3339 UTC.
    public var time: String
    /// The error code (PROTOCOL.md §5) and message the sender was given.
    public var code: String
    public var message: String
    /// The line's first `lineLimit` bytes, as UTF-8 with anything not UTF-8 replaced (absent
    /// when whend did not keep it: a line over `max_event_bytes`).
    public var line: String?
    /// Whether the line was longer than what is kept.
    public var truncated: Bool
    /// The line's app (its own, else the connection's hello's), when known.
    public var app: String?
    /// The sender, from the kernel (SO_PEERCRED).
    public var pid: Int32
    public var uid: UInt32

    public static let lineLimit = 1024

    public init(
        time: String, code: String, message: String, line: String?, truncated: Bool, app: String?, pid: Int32,
        uid: UInt32
    ) {
        self.time = time
        self.code = code
        self.message = message
        self.line = line
        self.truncated = truncated
        self.app = app
        self.pid = pid
        self.uid = uid
    }
}

/// Everything `whenctl status` shows.
public struct StatusAnswer: Codable, Sendable, Equatable {
    public var version: String
    public var pid: Int
    public var uptimeSeconds: Int
    public var socket: String
    public var controlSocket: String
    public var stateDir: String
    /// nil: the embedded defaults.
    public var configFile: String?
    public var connections: Int
    public var connectionsRefused: Int
    public var eventsPerSecond: Int
    public var eventsReceived: Int
    /// Error replies, by protocol code.
    public var eventsRejected: [String: Int]
    public var bytesReceived: Int
    public var repliesDropped: Int
    public var pendingBytes: Int
    public var journal: JournalStatus
    public var pipelines: [PipelineStatus]
    public var plugins: [PluginStatus]
    /// What systemd shows for the service.
    public var statusLine: String
    public var lastReload: LastReload?

    public struct LastReload: Codable, Sendable, Equatable {
        public var at: String
        public var outcome: String
        public init(at: String, outcome: String) {
            self.at = at
            self.outcome = outcome
        }
    }

    public init(
        version: String, pid: Int, uptimeSeconds: Int, socket: String, controlSocket: String, stateDir: String,
        configFile: String?, connections: Int, connectionsRefused: Int, eventsPerSecond: Int, eventsReceived: Int,
        eventsRejected: [String: Int], bytesReceived: Int, repliesDropped: Int, pendingBytes: Int,
        journal: JournalStatus, pipelines: [PipelineStatus], plugins: [PluginStatus], statusLine: String,
        lastReload: LastReload?
    ) {
        self.version = version
        self.pid = pid
        self.uptimeSeconds = uptimeSeconds
        self.socket = socket
        self.controlSocket = controlSocket
        self.stateDir = stateDir
        self.configFile = configFile
        self.connections = connections
        self.connectionsRefused = connectionsRefused
        self.eventsPerSecond = eventsPerSecond
        self.eventsReceived = eventsReceived
        self.eventsRejected = eventsRejected
        self.bytesReceived = bytesReceived
        self.repliesDropped = repliesDropped
        self.pendingBytes = pendingBytes
        self.journal = journal
        self.pipelines = pipelines
        self.plugins = plugins
        self.statusLine = statusLine
        self.lastReload = lastReload
    }

    enum CodingKeys: String, CodingKey {
        case version, pid, socket, connections, journal, pipelines, plugins
        case uptimeSeconds = "uptime_seconds"
        case controlSocket = "control_socket"
        case stateDir = "state_dir"
        case configFile = "config_file"
        case connectionsRefused = "connections_refused"
        case eventsPerSecond = "events_per_second"
        case eventsReceived = "events_received"
        case eventsRejected = "events_rejected"
        case bytesReceived = "bytes_received"
        case repliesDropped = "replies_dropped"
        case pendingBytes = "pending_bytes"
        case statusLine = "status_line"
        case lastReload = "last_reload"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(version, forKey: .version)
        try c.encode(pid, forKey: .pid)
        try c.encode(uptimeSeconds, forKey: .uptimeSeconds)
        try c.encode(socket, forKey: .socket)
        try c.encode(controlSocket, forKey: .controlSocket)
        try c.encode(stateDir, forKey: .stateDir)
        // `null`, not left out: the embedded defaults, said.
        try c.encode(configFile, forKey: .configFile)
        try c.encode(connections, forKey: .connections)
        try c.encode(connectionsRefused, forKey: .connectionsRefused)
        try c.encode(eventsPerSecond, forKey: .eventsPerSecond)
        try c.encode(eventsReceived, forKey: .eventsReceived)
        try c.encode(eventsRejected, forKey: .eventsRejected)
        try c.encode(bytesReceived, forKey: .bytesReceived)
        try c.encode(repliesDropped, forKey: .repliesDropped)
        try c.encode(pendingBytes, forKey: .pendingBytes)
        try c.encode(journal, forKey: .journal)
        try c.encode(pipelines, forKey: .pipelines)
        try c.encode(plugins, forKey: .plugins)
        try c.encode(statusLine, forKey: .statusLine)
        try c.encodeIfPresent(lastReload, forKey: .lastReload)
    }
}

/// The journal, as `whenctl status` shows it.
public struct JournalStatus: Codable, Sendable, Equatable {
    public var directory: String
    public var lastSeq: UInt64
    public var recordsStored: UInt64
    public var duplicatesSkipped: UInt64
    public var commits: UInt64
    public var segments: Int
    public var bytes: Int64
    public var durability: String
    /// Why the journal cannot store now (a full disk, a failing sync); nil when it can.
    public var failing: String?

    public init(
        directory: String, lastSeq: UInt64, recordsStored: UInt64, duplicatesSkipped: UInt64, commits: UInt64,
        segments: Int, bytes: Int64, durability: String, failing: String?
    ) {
        self.directory = directory
        self.lastSeq = lastSeq
        self.recordsStored = recordsStored
        self.duplicatesSkipped = duplicatesSkipped
        self.commits = commits
        self.segments = segments
        self.bytes = bytes
        self.durability = durability
        self.failing = failing
    }

    enum CodingKeys: String, CodingKey {
        case directory, commits, segments, bytes, durability, failing
        case lastSeq = "last_seq"
        case recordsStored = "records_stored"
        case duplicatesSkipped = "duplicates_skipped"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(directory, forKey: .directory)
        try c.encode(lastSeq, forKey: .lastSeq)
        try c.encode(recordsStored, forKey: .recordsStored)
        try c.encode(duplicatesSkipped, forKey: .duplicatesSkipped)
        try c.encode(commits, forKey: .commits)
        try c.encode(segments, forKey: .segments)
        try c.encode(bytes, forKey: .bytes)
        try c.encode(durability, forKey: .durability)
        // `null` when nothing fails: said, not left out.
        try c.encode(failing, forKey: .failing)
    }
}

/// One pipeline, as `whenctl plugins` and `status` show it.
public struct PipelineStatus: Codable, Sendable, Equatable {
    public var name: String
    /// Its stages' plugins, in order.
    public var plugins: [String]
    /// `running` or `restarting`.
    public var state: String
    public var pid: Int
    public var cursor: UInt64
    public var lag: UInt64
    public var failures: Int
    public var deadLetters: Int
    public var restarts: Int
    /// Records this pipeline never saw: deleted by retention before it read them, as whend
    /// counted them and as its worker found the gaps (`skipped`).
    public var lostToRetention: UInt64
    public var skipped: UInt64
    /// Each stage's `host.count` counters since whend started.
    public var counters: [String: [String: Int64]]
    /// How its last worker ended, when one did.
    public var lastExit: String?

    public init(
        name: String, plugins: [String], state: String, pid: Int, cursor: UInt64, lag: UInt64, failures: Int,
        deadLetters: Int, restarts: Int, lostToRetention: UInt64, skipped: UInt64,
        counters: [String: [String: Int64]], lastExit: String?
    ) {
        self.name = name
        self.plugins = plugins
        self.state = state
        self.pid = pid
        self.cursor = cursor
        self.lag = lag
        self.failures = failures
        self.deadLetters = deadLetters
        self.restarts = restarts
        self.lostToRetention = lostToRetention
        self.skipped = skipped
        self.counters = counters
        self.lastExit = lastExit
    }

    enum CodingKeys: String, CodingKey {
        case name, plugins, state, pid, cursor, lag, failures, restarts, skipped, counters
        case deadLetters = "dead_letters"
        case lostToRetention = "lost_to_retention"
        case lastExit = "last_exit"
    }
}

/// One ingest plugin (or one unloaded by `whenctl plugins unload`: its name and state only).
public struct PluginStatus: Codable, Sendable, Equatable {
    public var name: String
    /// `running` or `unloaded`.
    public var state: String
    public var version: String?
    public var abi: Int?
    public var path: String?
    public var roles: [String]?
    public var routes: [String]?
    public var counters: [String: Int64]?

    public init(
        name: String, state: String, version: String? = nil, abi: Int? = nil, path: String? = nil,
        roles: [String]? = nil, routes: [String]? = nil, counters: [String: Int64]? = nil
    ) {
        self.name = name
        self.state = state
        self.version = version
        self.abi = abi
        self.path = path
        self.roles = roles
        self.routes = routes
        self.counters = counters
    }
}

enum ControlJSON {
    static func encode(_ value: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(value) else {
            return Array(#"{"error":"the answer could not be encoded","ok":false}"#.utf8)
        }
        return Array(data)
    }
}
