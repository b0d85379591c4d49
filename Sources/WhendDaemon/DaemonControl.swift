import CWhendPlugin
import Foundation
import Logging
import WhendConfiguration
import WhendControl
import WhendJournal
import WhendPipelines
import WhendPluginHost
import WhendWire

/// What a reload did.
package struct ReloadOutcome: Sendable {
    /// False when the new configuration was refused and the old one stays.
    package var applied: Bool
    /// `key: old → new` for each setting taken up.
    package var changed: [String]
    /// Keys whose new value waits for the next restart.
    package var needRestart: [String]
    /// Why the new configuration was refused.
    package var error: String?
}

extension Daemon {
    func handleControlRequest(_ request: ControlRequest) -> ControlAnswer {
        switch request {
        case .status:
            return ControlAnswer(status: status())
        case .metrics:
            let list = pipelines.list()
            var counters = live.ingest.plugins.map {
                DaemonMetrics.PluginCounters(plugin: $0.name, pipeline: "", values: $0.counters)
            }
            for p in list {
                for (plugin, values) in p.counters {
                    counters.append(DaemonMetrics.PluginCounters(plugin: plugin, pipeline: p.name, values: values))
                }
            }
            let pipelines = list.map { p in
                DaemonMetrics.PipelineFigures(
                    name: p.name, lag: p.lag, failures: p.failures, deadLetters: p.deadLetters, restarts: p.restarts)
            }
            let text = metrics.prometheusText(
                journal: writer.statistics, pendingBytes: writer.pendingBytes,
                directory: configuration.journal.directory, pipelines: pipelines, pluginCounters: counters)
            return ControlAnswer(metrics: text)
        case .plugins:
            return ControlAnswer(plugins: pluginList(), pipelines: pipelines.list())
        case .load(let name): return setUnloaded(name, false)
        case .unload(let name): return setUnloaded(name, true)
        case .restart(let name):
            guard pipelines.restart(name) else { return .refused("no pipeline \(name); whenctl plugins lists them") }
            return ControlAnswer()
        case .reload:
            let outcome = reload(trigger: "whenctl reload")
            return ControlAnswer(
                ok: outcome.applied, error: outcome.error, changed: outcome.changed, needRestart: outcome.needRestart)
        }
    }

    /// Everything `whenctl status` shows.
    func status() -> StatusAnswer {
        let configuration = self.configuration
        let stats = writer.statistics
        let usage = configuration.journal.directory.usage()
        let counts = metrics.snapshot
        var rejected: [String: Int] = [:]
        for (code, n) in counts.rejected { rejected[code.rawValue] = n }
        let journal = JournalStatus(
            directory: configuration.journal.directory.path, lastSeq: stats.lastSeq,
            recordsStored: stats.recordsStored, duplicatesSkipped: stats.duplicatesSkipped, commits: stats.commits,
            segments: usage.segments, bytes: usage.bytes, durability: configuration.journal.durability.rawValue,
            failing: stats.failing)
        return StatusAnswer(
            version: WhendVersion.current, pid: Int(getpid()), uptimeSeconds: Int(Date().timeIntervalSince(startedAt)),
            socket: configuration.socketPath, controlSocket: configuration.controlSocketPath,
            stateDir: configuration.stateDirectory, configFile: configurationFile, connections: counts.connections,
            connectionsRefused: counts.connectionsRefused, eventsPerSecond: Int(eventsPerSecond),
            eventsReceived: counts.eventsReceived, eventsRejected: rejected, bytesReceived: counts.bytesIn,
            repliesDropped: counts.droppedReplies, pendingBytes: writer.pendingBytes, journal: journal,
            pipelines: pipelines.list(), plugins: pluginList(), statusLine: statusLine(),
            lastReload: lastReload.withLockedValue { $0 }.map {
                StatusAnswer.LastReload(at: ISO8601DateFormatter().string(from: $0.at), outcome: $0.outcome)
            })
    }

    /// Re-reads the configuration and applies what changed, without dropping a connection. An
    /// invalid configuration is refused and logged, and the one in force stays. Settings that
    /// cannot change while running (the sockets, the state directory, the de-duplication
    /// window) are reported as waiting for a restart.
    package func reload(trigger: String) -> ReloadOutcome {
        reloadQueue.sync { () -> ReloadOutcome in
            notifier.reloading()
            defer { notifier.ready(status: statusLine()) }
            guard let source = configurationSourceForReload else {
                return record(
                    ReloadOutcome(
                        applied: false, changed: [], needRestart: [],
                        error: "this daemon was started without a configuration to re-read"), trigger: trigger)
            }
            let new: DaemonConfiguration
            do {
                new = try source()
            } catch {
                return record(
                    ReloadOutcome(applied: false, changed: [], needRestart: [], error: "\(error)"), trigger: trigger)
            }
            let old = configuration
            var applied = old
            var outcome = ReloadOutcome(applied: true, changed: [], needRestart: [], error: nil)
            for difference in Settings.differences(from: old, to: new) {
                let key = difference.setting.key
                guard difference.setting.reload == .live else {
                    outcome.needRestart.append(key)
                    continue
                }
                // Every value renders as the file would spell it, so it applies as it reads.
                _ = difference.setting.apply(&applied, difference.new)
                outcome.changed.append(Settings.describe(difference, from: old, to: new))
            }
            applied.secretValues = new.secretValues
            // Plugins load before anything changes: a plugin that cannot be loaded refuses the
            // whole reload. Every pipeline that will start a new worker has its plugins created
            // (and destroyed) first, in a process of their own (`pipelineSpecs`): a configuration
            // a plugin refuses is refused with its message here, rather than taken up and its
            // worker left to crash in a loop.
            let ingest: PluginChain
            let specs: [String: PipelineSpec]
            let unloaded = self.unloaded.withLockedValue { $0 }
            do {
                ingest = try buildPluginChain(applied, reusing: live.ingest)
                specs = try pipelines.specs(applied, unloaded: unloaded, create: true)
            } catch {
                // A plugin that refuses its configuration may quote it.
                let message = Secrets.scrub("\(error)", applied.allSecretValues)
                return record(
                    ReloadOutcome(applied: false, changed: [], needRestart: [], error: message), trigger: trigger)
            }
            for name in pipelines.withReplacedLibraries(specs) {
                outcome.changed.append("pipeline \(name): a plugin library was replaced; restarted")
            }
            take(applied, ingest: ingest, from: old)
            pipelines.run(specs, configuration: applied, unloaded: unloaded)
            return record(outcome, trigger: trigger)
        }
    }

    private func take(_ new: DaemonConfiguration, ingest: PluginChain, from old: DaemonConfiguration) {
        live.replace(new, ingest: ingest)
        writer.reconfigure(new.journal)
        limiter.reconfigure(rate: new.rateLimit, burst: new.rateBurst, by: new.rateLimitBy)
        if new.socketMode != old.socketMode, activation.events == nil {
            chmod(new.socketPath, new.socketMode)
        }
        if new.logLevel != old.logLevel { setLogLevel(Logger.Level(rawValue: new.logLevel) ?? .info) }
    }

    private func record(_ outcome: ReloadOutcome, trigger: String) -> ReloadOutcome {
        let summary: String
        if let error = outcome.error {
            summary = "refused: \(error); the configuration in force stays"
            logger.error("reload (\(trigger)) \(summary)")
        } else {
            let changed = outcome.changed.isEmpty ? "nothing changed" : outcome.changed.joined(separator: "; ")
            let restart =
                outcome.needRestart.isEmpty
                ? "" : "; \(outcome.needRestart.joined(separator: ", ")) changed but take(s) effect at the next restart"
            summary = "applied: \(changed)\(restart)"
            logger.notice("reload (\(trigger)) \(summary)")
        }
        lastReload.withLockedValue { $0 = (Date(), summary) }
        return outcome
    }
}

extension Daemon {
    /// Loads and starts the ingest plugins `configuration` names, in order. An instance whose
    /// library and configuration are unchanged is kept rather than started again.
    func buildPluginChain(_ configuration: DaemonConfiguration, reusing old: PluginChain?) throws(PluginLoadError)
        -> PluginChain
    {
        var plugins: [PluginInstance] = []
        let unloaded = self.unloaded.withLockedValue { $0 }
        let names = configuration.ingestPlugins.filter { !unloaded.contains($0) }
        let libraries = try PluginLibrary.loadChain(names, directories: configuration.pluginDirectories)
        for (name, library) in zip(names, libraries) {
            guard library.roles & WHEND_ROLE_INGEST != 0 else {
                throw PluginLoadError(
                    .misconfigured,
                    description: "plugin \(name) (\(library.path)) is not ingest middleware; it cannot be in ingest")
            }
            let settings = configuration.pluginConfigurations[name] ?? "{}"
            if let kept = old?.plugins.first(where: { $0.library === library && $0.configuration == settings }) {
                plugins.append(kept)
                continue
            }
            plugins.append(
                try PluginInstance(
                    library: library, configuration: settings, secrets: configuration.secrets(of: name),
                    stateDirectory: configuration.stateDirectory + "/plugins/" + name, logger: logger))
        }
        return PluginChain(plugins)
    }

    func pluginList() -> [PluginStatus] {
        let unloaded = self.unloaded.withLockedValue { $0 }.sorted().map { PluginStatus(name: $0, state: "unloaded") }
        return unloaded
            + live.ingest.plugins.map { p in
                PluginStatus(
                    name: p.name, state: "running", version: p.library.version, abi: Int(p.library.abiVersion),
                    path: p.library.path,
                    roles: (p.library.roles & WHEND_ROLE_INGEST != 0 ? ["ingest"] : [])
                        + (p.library.roles & WHEND_ROLE_PIPELINE != 0 ? ["pipeline"] : []),
                    routes: ["ingest"], counters: p.counters)
            }
    }
}
