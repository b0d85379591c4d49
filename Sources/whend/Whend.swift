import ArgumentParser
import Foundation
import Logging
import WhendDaemon
import WhendJournal
import WhendWire

@main
struct Whend: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whend",
        abstract: "The local event daemon: apps emit on a Unix socket, whend journals every event.",
        discussion: """
            With no options whend runs on its embedded defaults: the event socket at \
            $WHEND_SOCKET, else $RUNTIME_DIRECTORY/events.sock, $XDG_RUNTIME_DIR/whend/events.sock \
            or /tmp/whend-$UID/events.sock; the journal in journal/ under $STATE_DIRECTORY, else \
            $XDG_STATE_HOME/whend or ~/.local/state/whend.
            Every setting can also come from the configuration file (--config, else $WHEND_CONFIG, \
            else /etc/whend/whend.conf if it exists) as `key = value`, and from the environment as \
            WHEND_<KEY>. The flags win over the environment, which wins over the file.

            SIGHUP (or `whenctl reload`) reloads the configuration; SIGTERM and SIGINT stop \
            whend after it has stored and acknowledged what it received and sealed the active \
            segment. Under systemd it reports readiness, status and the watchdog with sd_notify.

            Exit status: 0 after a stop asked for; 1 when whend cannot start (the socket or the \
            journal cannot be opened: the log says which and why); 2 when the configuration is \
            refused (a message names the key and the value); 64 on a usage error.
            """,
        version: WhendVersion.current
    )

    @Option(name: .long, help: "The configuration file (key = value lines).")
    var config: String?

    @Flag(name: .long, help: "Validate the configuration, print it, and exit.")
    var checkConfig = false

    @Option(name: .long, help: "The event socket's path. (socket)")
    var socket: String?

    @Option(name: .long, help: "Permission bits of the event socket, in octal; default 0666. (socket_mode)")
    var socketMode: String?

    @Option(name: .long, help: "The control socket; default: control.sock beside the event socket. (control_socket)")
    var controlSocket: String?

    @Option(name: .long, help: "The state directory; the journal is journal/ inside it. (state_dir)")
    var stateDir: String?

    @Option(name: .long, help: "When an ack is sent: fsync (default), write, none. (durability)")
    var durability: String?

    @Option(name: .long, help: "The longest event line in bytes; default 65536. (max_event_bytes)")
    var maxEventBytes: String?

    @Option(name: .long, help: "Rotate a segment at this many compressed bytes; default 33554432. (segment_max_bytes)")
    var segmentMaxBytes: String?

    @Option(name: .long, help: "Rotate a segment after this many seconds; default 3600. (segment_max_age)")
    var segmentMaxAge: String?

    @Option(
        name: .long,
        help: "Keep the journal under this many bytes; default 1073741824, 0: no limit. (retention_max_bytes)")
    var retentionMaxBytes: String?

    @Option(
        name: .long,
        help: "Delete sealed segments older than this many seconds; default 0: no limit. (retention_max_age)")
    var retentionMaxAge: String?

    @Option(
        name: .long,
        help:
            "Past this many bytes old segments go even if a pipeline has not read them; default 4294967296, 0: no limit. (retention_hard_max_bytes)"
    )
    var retentionHardMaxBytes: String?

    @Option(
        name: .long,
        help:
            "Below this much free space old segments go even if a pipeline has not read them; default 0: no floor. (retention_min_free_bytes)"
    )
    var retentionMinFreeBytes: String?

    @Option(name: .long, help: "Records resent events are de-duplicated against; default 100000. (dedup_window)")
    var dedupWindow: String?

    @Option(name: .long, help: "Events per second one sender may send; default 0: unlimited. (rate_limit)")
    var rateLimit: String?

    @Option(name: .long, help: "Events one sender may send at once above the rate; default 1000. (rate_burst)")
    var rateBurst: String?

    @Option(name: .long, help: "Who the rate limit counts against: pid (default), uid, connection. (rate_limit_by)")
    var rateLimitBy: String?

    @Option(
        name: .long,
        help:
            "Seconds between log summaries of what the rate limit suppressed; default 10. (rate_limit_report_interval)"
    )
    var rateLimitReportInterval: String?

    @Option(
        name: .long,
        help: "Bytes all connections may have waiting for the journal; default 16777216. (max_pending_bytes)")
    var maxPendingBytes: String?

    @Option(name: .long, help: "Seconds a graceful stop waits for connections to drain; default 10. (shutdown_timeout)")
    var shutdownTimeout: String?

    @Option(name: .long, help: "Directories plugins load from, separated by ':'. (plugin_dirs)")
    var pluginDirs: String?

    @Option(name: .long, help: "The ingest middleware, plugin names in order, separated by ','. (ingest)")
    var ingest: String?

    @Option(
        name: .long,
        help:
            "Run the built-in plugins in pipelines screens, analytics, crashes, sessions; default true. (builtin_pipelines)"
    )
    var builtinPipelines: String?

    @Option(
        name: .long,
        help: "Attempts at one record before a pipeline dead-letters it; default 0: forever. (pipeline_retry_limit)")
    var pipelineRetryLimit: String?

    @Option(
        name: .long, help: "Seconds a silent pipeline worker is given before a restart; default 30. (pipeline_watchdog)"
    )
    var pipelineWatchdog: String?

    @Option(
        name: .long,
        help:
            "Seconds between saves of a pipeline's plugin state with its cursor; default 5, 0: never. (pipeline_snapshot_interval)"
    )
    var pipelineSnapshotInterval: String?

    @Option(
        name: .long,
        help:
            "Records a pipeline goes back to rebuild its plugins' state when the saved one is unusable; default 100000. (pipeline_snapshot_rebuild)"
    )
    var pipelineSnapshotRebuild: String?

    @Option(name: .long, help: "trace, debug, info (default), notice, warning, error, critical. (log_level)")
    var logLevel: String?

    /// Run as a pipeline worker: the daemon says which pipeline on standard input.
    @Flag(name: .long, help: .hidden)
    var pipelineWorker = false

    /// The flags given, as settings.
    var flagValues: [SettingValue] {
        let pairs: [(String, String?)] = [
            ("socket", socket), ("socket_mode", socketMode), ("control_socket", controlSocket),
            ("state_dir", stateDir), ("durability", durability),
            ("max_event_bytes", maxEventBytes), ("segment_max_bytes", segmentMaxBytes),
            ("segment_max_age", segmentMaxAge), ("retention_max_bytes", retentionMaxBytes),
            ("retention_max_age", retentionMaxAge), ("retention_hard_max_bytes", retentionHardMaxBytes),
            ("retention_min_free_bytes", retentionMinFreeBytes), ("dedup_window", dedupWindow),
            ("rate_limit", rateLimit),
            ("rate_burst", rateBurst), ("rate_limit_by", rateLimitBy),
            ("rate_limit_report_interval", rateLimitReportInterval), ("max_pending_bytes", maxPendingBytes),
            ("shutdown_timeout", shutdownTimeout),
            ("plugin_dirs", pluginDirs), ("ingest", ingest), ("builtin_pipelines", builtinPipelines),
            ("pipeline_retry_limit", pipelineRetryLimit),
            ("pipeline_watchdog", pipelineWatchdog), ("pipeline_snapshot_interval", pipelineSnapshotInterval),
            ("pipeline_snapshot_rebuild", pipelineSnapshotRebuild), ("log_level", logLevel),
        ]
        return pairs.compactMap { key, value in
            value.map { SettingValue(key: key, value: $0, source: "--" + key.replacingOccurrences(of: "_", with: "-")) }
        }
    }

    /// Defaults, then the file, then the environment, then the flags.
    func resolveConfiguration() throws(SettingError) -> (DaemonConfiguration, file: String?) {
        try DaemonConfiguration.resolve(file: config, flags: flagValues)
    }

    func run() throws {
        if pipelineWorker {
            // A pipeline's worker process, started by the daemon (PipelineSupervisor).
            LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
            PipelineWorker.run(logger: Logger(label: "whend-pipeline"))
        }
        let configuration: DaemonConfiguration
        let file: String?
        do {
            (configuration, file) = try resolveConfiguration()
        } catch {
            FileHandle.standardError.write(Data("whend: \(error.description)\n".utf8))
            throw ExitCode(2)
        }
        if checkConfig {
            print("# configuration OK\(file.map { " (\($0))" } ?? " (embedded defaults)")")
            print(Settings.render(configuration))
            return
        }
        // The level is the logger's own (Daemon sets it, and a reload changes it).
        LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
        let logger = Logger(label: "whend")
        let command = self
        do {
            let daemon = try Daemon(
                configuration: configuration, logger: logger, configurationFile: file,
                reloadFrom: { try command.resolveConfiguration().0 })
            try daemon.start()
            daemon.run()
        } catch let error as DaemonStartError {
            logger.critical("\(error.description)")
            throw ExitCode(1)
        }
    }
}
