import Foundation
import WhendJournal
import WhendSystem
import WhendWire

/// Everything the daemon needs to run; every field has the embedded default that `make run`
/// uses.
package struct DaemonConfiguration: Sendable {
    /// The event socket's path (PROTOCOL.md §1).
    package var socketPath: String
    /// Permission bits of the event socket: 0666 lets every local user's apps emit.
    package var socketMode: mode_t = 0o666
    /// The control socket, when set apart from its default beside the event socket.
    package var controlSocketOverride: String?
    /// The control socket: `control.sock` beside the event socket unless configured.
    package var controlSocketPath: String {
        controlSocketOverride ?? SocketLocation.controlSocket(besideEventSocket: socketPath)
    }
    /// `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/whend`, else `~/.local/state/whend`.
    package var stateDirectory: String
    /// The line limit (PROTOCOL.md §2).
    package var maxEventBytes: Int = 65536
    package var journal: JournalConfiguration
    /// Events per second one sender may send (0: unlimited), and the burst above it.
    package var rateLimit: Double = 0
    package var rateBurst: Double = 1000
    /// Who a sender is for the rate limit.
    package var rateLimitBy: RateLimitKey = .pid
    /// How often the log sums up what the rate limit suppressed (seconds).
    package var rateLimitReportInterval: TimeInterval = 10
    /// Bytes of records one connection may have waiting for the journal before the daemon stops
    /// reading from it: bounds memory whatever clients send.
    package var maxPendingBytesPerConnection: Int = 4 << 20
    /// Bytes of records all connections together may have waiting for the journal before the
    /// daemon stops reading from any: the bound on memory that does not grow with connections.
    package var maxPendingBytes: Int = 16 << 20
    /// How long a graceful stop waits for connections to drain (seconds).
    package var shutdownTimeout: TimeInterval = 10
    /// Event connections open at once; one more is answered with an error line and closed:
    /// each costs a descriptor and buffers, whoever opens it.
    package var maxConnections: Int = 1024
    /// Subscriptions (PROTOCOL.md §9) open at once: each reads the journal on a thread of its
    /// own, with its buffers (about 1 MiB).
    package var maxSubscribers: Int = 128
    /// A group whose members may subscribe, besides whend's own user and root; empty for none.
    /// A subscriber reads every app's records: who may is decided by the kernel's word on the
    /// peer (SO_PEERCRED, SO_PEERGROUPS), not the socket file's mode.
    package var subscribeGroup: String = ""
    /// trace, debug, info, notice, warning, error or critical.
    package var logLevel: String = "info"
    /// Where plugin libraries may be loaded from: by default where whend's own plugins are
    /// installed beside it (`<bin>/../lib/whend/plugins`, and `<bin>` itself for a build tree).
    package var pluginDirectories: [String] = DaemonConfiguration.defaultPluginDirectories()
    /// The ingest middleware, in order, by plugin name.
    package var ingestPlugins: [String] = []
    /// The tracking plan's file (docs/tracking-plan.md); empty: no plan.
    package var trackingPlan = ""
    package var trackingPlanMode: TrackingPlanMode = .report
    /// Each plugin's configuration, a JSON object, by plugin name (`plugin.<name>` keys).
    package var pluginConfigurations: [String: String] = [:]
    /// The values read from files and credentials into `pluginConfigurations` (`$file:`,
    /// `$credential:`): secrets wherever they are, never printed.
    package var secretValues: Set<String> = []
    /// Pipelines: ordered plugin names, by pipeline name (`pipeline.<name>` keys). An empty
    /// list removes a built-in pipeline of that name.
    package var pipelines: [String: [String]] = [:]
    /// `isolation.<plugin>`: "process" or "shared", by plugin name.
    package var pluginIsolation: [String: String] = [:]
    /// The plugins built with whend: trusted to share the pipeline host unless configured otherwise.
    package static let builtinPlugins: Set<String> = [
        "screen-tracking", "crash-reports", "analytics", "session-recorder", "redact", "nats", "otlp",
    ]

    /// Whether `plugin`'s pipelines may run in the shared pipeline host (a pipeline runs there
    /// when every one of its plugins may): as `isolation.<plugin>` says, else if it is a
    /// built-in plugin's library, found where whend installs its own (`library`: its real
    /// path). Not by name alone: a library of another's called `otlp`, found first in another
    /// plugin directory, is no built-in.
    package func runsShared(_ plugin: String, library: String?) -> Bool {
        if let isolation = pluginIsolation[plugin] { return isolation == "shared" }
        guard Self.builtinPlugins.contains(plugin), let library else { return false }
        let directory = (library as NSString).deletingLastPathComponent
        return Self.defaultPluginDirectories().contains { own in
            guard let real = realpath(own, nil) else { return false }
            defer { free(real) }
            return String(cString: real) == directory
        }
    }

    /// Whether the built-in plugins run in their own pipelines unless configured otherwise.
    package var builtinPipelines = true

    /// The built-in plugins' pipelines: a newcomer sees all four at work with no configuration.
    package static let builtinPipelineDefaults: [String: [String]] = [
        "screens": ["screen-tracking"], "analytics": ["analytics"], "crashes": ["crash-reports"],
        "sessions": ["session-recorder"],
    ]

    /// The pipelines to run: the built-in ones (when on) overlaid by the configured ones.
    package var effectivePipelines: [String: [String]] {
        var result = builtinPipelines ? Self.builtinPipelineDefaults : [:]
        for (name, plugins) in pipelines { result[name] = plugins }
        return result.filter { !$0.value.isEmpty }
    }

    /// The directory under `<state>/plugins` where the instance of `plugin` in `pipeline` (nil:
    /// in ingest) keeps its state. Each instance has one of its own: two that shared one would
    /// read and rewrite each other's files (analytics' spool compacted by one instance drops what
    /// the other has yet to send). The plugin's first place keeps the plain `<plugin>` that
    /// whenctl and the docs name (ingest, else the built-in pipeline of that plugin, else the
    /// pipeline first by name); each other pipeline's instance has `<plugin>@<pipeline>`.
    package func pluginStateName(_ plugin: String, pipeline: String?) -> String {
        guard let pipeline else { return plugin }
        if ingestPlugins.contains(plugin) { return plugin + "@" + pipeline }
        let places = effectivePipelines.filter { $0.value.contains(plugin) }.keys
        let home = places.filter { Self.builtinPipelineDefaults[$0]?.contains(plugin) == true }.min() ?? places.min()
        return home == pipeline ? plugin : plugin + "@" + pipeline
    }

    /// Whether pipeline `name` is a built-in one that nobody configured.
    package func isImplicitBuiltin(_ name: String) -> Bool {
        builtinPipelines && pipelines[name] == nil && Self.builtinPipelineDefaults[name] != nil
    }

    package static func defaultPluginDirectories() -> [String] {
        let bin = (WhendExecutable.path as NSString).deletingLastPathComponent
        return [
            ((bin as NSString).deletingLastPathComponent as NSString).appendingPathComponent("lib/whend/plugins"), bin,
        ]
    }
    /// Attempts at one record before a pipeline writes it to its dead letters; 0: forever.
    package var pipelineRetryLimit: Int = 0
    /// Seconds a pipeline worker may go without reporting before it is killed and restarted.
    package var pipelineWatchdog: TimeInterval = 30
    /// How often a pipeline whose plugins keep state saves it with its cursor (seconds; 0: never).
    package var pipelineSnapshotInterval: TimeInterval = 5
    /// How far back (records) a pipeline starts, with empty state, when its saved state cannot be
    /// used (corrupt, or of another plugin version): its plugins rebuild their state from there.
    package var pipelineSnapshotRebuild: Int = 100_000
    /// Event-loop threads (0: one per core).
    package var eventLoopThreads: Int = 0

    package init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        // The daemon binds where clients look first after WHEND_SOCKET (§1, 2–4), unless told.
        socketPath =
            environment["WHEND_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
            ?? SocketLocation.defaultRuntimeDirectory(environment: environment) + "/events.sock"
        stateDirectory = SocketLocation.defaultStateDirectory(environment: environment)
        journal = JournalConfiguration(directory: JournalDirectory(stateDirectory: stateDirectory))
    }

    package mutating func setStateDirectory(_ path: String) {
        stateDirectory = path
        journal.directory = JournalDirectory(stateDirectory: path)
    }
}

/// Who the rate limit counts events against: every process (`pid`, the default), every user
/// (`uid`: all of a user's apps share one allowance), or every connection.
/// What whend does with an event that breaks the tracking plan.
package enum TrackingPlanMode: String, Sendable {
    /// Store it, and count it.
    case report
    /// Refuse it with `plan_violation`; store nothing of it.
    case enforce
}

package enum RateLimitKey: String, Sendable {
    case pid
    case uid
    case connection
}

extension DaemonConfiguration {
    /// The configuration whend would run with: the embedded defaults, then the file (`file`,
    /// else `$WHEND_CONFIG`, else /etc/whend/whend.conf if it exists), then the environment,
    /// then `flags`.
    package static func resolve(
        file: String?, flags: [SettingValue] = [],
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(SettingError) -> (DaemonConfiguration, file: String?) {
        var configuration = DaemonConfiguration(environment: environment)
        var file = file ?? environment["WHEND_CONFIG"].flatMap { $0.isEmpty ? nil : $0 }
        if file == nil, FileManager.default.fileExists(atPath: "/etc/whend/whend.conf") {
            file = "/etc/whend/whend.conf"
        }
        if let file {
            // A FileHandle reads what String(contentsOfFile:) refuses (a pipe, /dev/null).
            guard let handle = FileHandle(forReadingAtPath: file) else {
                throw .unreadableFile(path: file, reason: String(cString: strerror(errno)))
            }
            defer { try? handle.close() }
            guard let text = String(data: handle.readDataToEndOfFile(), encoding: .utf8) else {
                throw .notText(path: file)
            }
            try Settings.apply(try Settings.parse(text, path: file), to: &configuration)
        }
        try Settings.apply(Settings.fromEnvironment(environment), to: &configuration)
        try Settings.apply(flags, to: &configuration)
        try configuration.resolveSecretReferences(environment: environment)
        return (configuration, file)
    }

    /// Every secret value in the plugins' configurations, for `Secrets.scrub`.
    package var allSecretValues: Set<String> {
        pluginConfigurations.values.reduce(into: secretValues) { $0.formUnion(Secrets.values(in: $1)) }
    }

    /// The secret values in plugin `name`'s configuration: those `redact` finds, and those read
    /// from files and credentials that it holds anywhere (a worker, which gets its configuration
    /// resolved, cannot tell them from the rest).
    package func secrets(of name: String) -> Set<String> {
        guard let json = pluginConfigurations[name] else { return [] }
        return Secrets.values(in: json).union(
            secretValues.filter { Secrets.occurs($0, in: json) })
    }

    /// Replaces each `"$credential:NAME"` and `"$file:/path"` string in a plugin's configuration
    /// by what it names, before any plugin sees it (`Secrets.resolveReferences`).
    package mutating func resolveSecretReferences(
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(SettingError) {
        for (name, json) in pluginConfigurations {
            do {
                let (resolved, secrets) = try Secrets.resolveReferences(json, environment: environment)
                pluginConfigurations[name] = resolved
                secretValues.formUnion(secrets)
            } catch {
                throw .unreadableSecret(key: "plugin.\(name)", reason: error.description)
            }
        }
    }
}
