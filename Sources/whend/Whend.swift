import ArgumentParser
import Foundation
import Logging
import WhendConfiguration
import WhendDaemon
import WhendJournal
import WhendPipelines
import WhendSystem
import WhendWire

@main
struct Whend: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whend",
        abstract: "The local event daemon: apps emit on a Unix socket, whend journals every event.",
        // The settings are flags too (listed above the options), which the generated usage,
        // knowing only the two declared options, left out.
        usage: "whend [--config <config>] [--check-config] [--<setting> <value> ...]",
        discussion: """
            With no options whend runs on its embedded defaults: the event socket at \
            $WHEND_SOCKET, else $RUNTIME_DIRECTORY/events.sock, $XDG_RUNTIME_DIR/whend/events.sock \
            or /tmp/whend-$UID/events.sock; the journal in journal/ under $STATE_DIRECTORY, else \
            $XDG_STATE_HOME/whend or ~/.local/state/whend.
            Every setting can also come from the configuration file (--config, else $WHEND_CONFIG, \
            else /etc/whend/whend.conf if it exists) as `key = value`, and from the environment as \
            WHEND_<KEY>. The flags win over the environment, which wins over the file.

            \(settingsHelp())

            SIGHUP (or `whenctl reload`) reloads the configuration; SIGTERM and SIGINT stop \
            whend after it has stored and acknowledged what it received and sealed the active \
            segment. Under systemd it reports readiness, status and the watchdog with sd_notify.

            Exit status: 0 after a stop asked for; 1 when whend cannot start (the socket or the \
            journal cannot be opened: the log says which and why); 2 when the configuration is \
            refused (a message names the key and the value, or with --check-config the plugin \
            that is missing or refused its configuration, and why); 64 on a usage error.
            """,
        version: WhendVersion.current
    )

    @Option(name: .long, help: "The configuration file (key = value lines).")
    var config: String?

    @Flag(
        name: .long,
        help: "Validate the configuration, create (and destroy) every plugin instance it names, print it, and exit.")
    var checkConfig = false

    /// Every setting of `Settings.all` as a flag, `--socket-mode 0660` or `--socket-mode=0660`:
    /// parsed from the table, listed in the help from it (see `settingsHelp`), never spelled out
    /// again here.
    @Argument(parsing: .allUnrecognized, help: ArgumentHelp(visibility: .hidden))
    var settingFlags: [String] = []

    /// Run as a pipeline worker: the daemon says which pipeline on standard input.
    @Flag(name: .long, help: .hidden)
    var pipelineWorker = false

    /// Run as the shared pipeline host: the daemon hands it each trusted pipeline's pipes.
    @Flag(name: .long, help: .hidden)
    var pipelineHost = false

    /// Create and destroy the plugins of the chains the caller gives on standard input, and
    /// report on descriptor 3 (`PluginCheck`): --check-config and reload run it.
    @Flag(name: .long, help: .hidden)
    var pluginCheck = false

    /// The flags given, as settings, in order.
    var flagValues: [SettingValue] {
        get throws {
            do {
                return try SettingValue.flags(settingFlags)
            } catch {
                throw ValidationError(error.description)
            }
        }
    }

    func validate() throws { _ = try flagValues }

    /// The settings as `--help` and `man whend` list them, from the table.
    static func settingsHelp() -> String {
        let defaults = DaemonConfiguration(environment: [:])
        // Paths and plugin directories depend on the environment: the text above says how.
        let derived: Set<String> = ["socket", "control_socket", "state_dir", "plugin_dirs"]
        let lines = Settings.all.map { setting in
            let flag = "--" + setting.key.replacingOccurrences(of: "_", with: "-")
            let value = setting.value(defaults)
            let fallback = derived.contains(setting.key) || value.isEmpty ? "" : "; default \(value)"
            let reload = setting.reload == .live ? "" : "; at the next start only"
            return "\(flag) <\(setting.allowed)>: \(setting.help)\(fallback)\(reload)."
        }
        return "Settings, each a flag, a key of the file (with _ for -) and WHEND_<KEY>:\n"
            + lines.joined(separator: "\n")
    }

    /// Defaults, then the file, then the environment, then the flags.
    func resolveConfiguration() throws(SettingError) -> (DaemonConfiguration, file: String?) {
        // The flags were checked by `validate()` before `run()`.
        try DaemonConfiguration.resolve(file: config, flags: (try? flagValues) ?? [])
    }

    /// The daemon catches a stop or a reload asked for while it starts (acted on once it runs)
    /// before anything else, arguments included; its helpers and `--check-config` keep the
    /// signals' default actions.
    static func main() async {
        let once = ["--pipeline-worker", "--pipeline-host", "--plugin-check", "--check-config", "--help", "-h"]
        if !CommandLine.arguments.dropFirst().contains(where: once.contains) {
            MallocTuning.applyToDaemon()
            EarlySignals.catch()
        }
        await main(nil)
    }

    func run() async throws {
        // Never die of a write to a peer that went away (a worker's pipe, a log reader): NIO
        // ignores SIGPIPE only once it opens its first socket, after the pipelines start.
        signal(SIGPIPE, SIG_IGN)
        // Pipeline processes only: in the daemon, blocks of a megabyte mapped and unmapped each
        // time (a connection's batch, a commit's group) cost ingest a fifth more CPU per event
        // (1.44–1.68 → 1.74–2.09 µs, `whend-bench --only ingest`); it gives its memory back
        // when ingest goes quiet instead (`StatusReporter`, `JournalWriter`).
        if pipelineWorker || pipelineHost { MallocTuning.apply() }
        if pipelineWorker {
            // A pipeline's worker process, started by the daemon (PipelineSupervisor).
            LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
            PipelineWorker.run(logger: Logger(label: "whend-pipeline"))
        }
        if pipelineHost {
            LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
            // On a thread of its own, blocked on its socket for the host's life: not on one of
            // the few threads Dispatch runs its queues on, which this async context is.
            Thread { PipelineHostProcess.serve(logger: Logger(label: "whend-pipeline")) }.start()
            await withUnsafeContinuation { (_: UnsafeContinuation<Void, Never>) in }
            Glibc.exit(0)
        }
        if pluginCheck {
            LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
            // What the plugins say of a scratch instance is news only when it is a warning.
            var logger = Logger(label: "whend-plugin-check")
            logger.logLevel = .warning
            PluginCheck.serve(logger: logger)
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
            // The plugins too: a plugin that is not installed, or whose create refuses its
            // configuration, refuses the configuration with its message.
            let plugins = PluginCheck.run(
                PluginCheck.request(for: configuration), timeout: configuration.pipelineWatchdog)
            if let refusal = plugins.refusal {
                FileHandle.standardError.write(Data("whend: \(refusal)\n".utf8))
                throw ExitCode(2)
            }
            print("# configuration OK\(file.map { " (\($0))" } ?? " (embedded defaults)")")
            for off in plugins.off { print("# \(off)") }
            print(Settings.render(configuration))
            return
        }
        // The level is the logger's own (Daemon sets it, and a reload changes it).
        LoggingSystem.bootstrap { label in StreamLogHandler.standardError(label: label) }
        let logger = Logger(label: "whend")
        let command = self
        do {
            // Its event loop threads, started here, block no signal (see `withNoneBlocked`).
            let daemon = try TerminationSignals.withNoneBlocked {
                try Daemon(
                    configuration: configuration, logger: logger, configurationFile: file,
                    reloadFrom: { try command.resolveConfiguration().0 })
            }
            try await DaemonServices(daemon).run()
            if daemon.stoppedWithoutTheJournal { throw ExitCode(1) }
        } catch let error as DaemonStartError {
            // A plugin that refuses its configuration may quote it.
            logger.critical("\(Secrets.scrub(error.description, configuration.allSecretValues))")
            throw ExitCode(1)
        }
    }
}
