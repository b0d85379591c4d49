import CLinux
import CWhendPlugin
import Foundation
import Logging
import NIOConcurrencyHelpers
import ServiceLifecycle
import UnixSignals
import WhendConfiguration
import WhendControl
import WhendJournal
import WhendPipelines
import WhendPluginHost
import WhendTrackingPlan
import WhendWire

/// The configuration in force and the plugins it routes records to, and every change to them:
/// a reload (SIGHUP, `whenctl reload`) and `whenctl plugins load|unload`. Changes are applied
/// one at a time, whoever asks; a change a plugin refuses leaves everything as it was.
///
/// As a service of whend's group it re-reads the configuration at each SIGHUP until the group
/// stops.
final class ConfigurationService: Service, Sendable {
    /// Reads the configuration anew (file, environment, flags) for a reload.
    typealias Source = Daemon.ConfigurationSource

    private let live: LiveConfiguration
    private let source: Source?
    private let pipelines: PipelineService
    private let writer: JournalWriter
    private let limiter: SenderRateLimiter
    private let notifier: ServiceNotifier
    private let reporter: StatusReporter
    private let activation: SocketActivation
    private let loggerBox: NIOLockedValueBox<Logger>
    /// Serialises changes, whether they come from SIGHUP or the control socket.
    private let changes = DispatchQueue(label: "whend.reload")
    private let lastReloadBox = NIOLockedValueBox<(at: Date, outcome: String)?>(nil)
    /// Plugins `whenctl plugins unload` took out of routing, until `load` puts them back.
    private let unloaded = NIOLockedValueBox<Set<String>>([])

    init(
        live: LiveConfiguration, source: Source?, pipelines: PipelineService, writer: JournalWriter,
        limiter: SenderRateLimiter, notifier: ServiceNotifier, reporter: StatusReporter, activation: SocketActivation,
        loggerBox: NIOLockedValueBox<Logger>
    ) {
        self.live = live
        self.source = source
        self.pipelines = pipelines
        self.writer = writer
        self.limiter = limiter
        self.notifier = notifier
        self.reporter = reporter
        self.activation = activation
        self.loggerBox = loggerBox
    }

    private var configuration: DaemonConfiguration { live.current }
    private var logger: Logger { loggerBox.withLockedValue { $0 } }

    /// When the last reload was, and what it did, for status.
    var lastReload: (at: Date, outcome: String)? { lastReloadBox.withLockedValue { $0 } }

    /// Reloads at each SIGHUP until the graceful shutdown (see `untilGracefulShutdown` for why
    /// not `cancelOnGracefulShutdown`).
    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                // On a thread of its own: a reload reads files, checks plugins in processes of
                // their own and waits its turn behind whenctl's; on one of Swift's shared
                // threads (two on a two-core machine) it held up whatever else ran there, the
                // stop signal's handling included.
                for await _ in signals { await onAThreadOfItsOwn { _ = self.reload(trigger: "SIGHUP") } }
            }
            await untilGracefulShutdown()
            group.cancelAll()
        }
    }

    /// Loads the ingest middleware and starts the pipelines' workers (a step of whend's start).
    func startPlugins() throws(DaemonStartError) {
        let configuration = self.configuration
        let plan: TrackingPlan?
        do {
            plan = try Self.loadPlan(configuration)
        } catch {
            throw DaemonStartError.trackingPlanRefused(reason: "\(error)")
        }
        do {
            let ingest = try buildPluginChain(configuration, reusing: nil)
            live.replace(configuration, ingest: ingest, plan: plan)
            let unloaded = self.unloaded.withLockedValue { $0 }
            pipelines.run(
                try pipelines.specs(configuration, unloaded: unloaded, create: false), configuration: configuration,
                unloaded: unloaded)
        } catch {
            throw DaemonStartError.pluginsFailed(reason: error.description)
        }
    }

    /// Re-reads the configuration and applies what changed, without dropping a connection. An
    /// invalid configuration is refused and logged, and the one in force stays. Settings that
    /// cannot change while running (the sockets, the state directory, the de-duplication
    /// window) are reported as waiting for a restart.
    func reload(trigger: String) -> ReloadOutcome {
        changes.sync { () -> ReloadOutcome in
            notifier.reloading()
            defer { notifier.ready(status: reporter.statusLine()) }
            guard let source else {
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
            // The plan is read again whether or not its path changed: editing the file and
            // reloading is how a plan changes. One that does not compile refuses the reload.
            let plan: TrackingPlan?
            do {
                plan = try Self.loadPlan(applied)
            } catch {
                return record(
                    ReloadOutcome(applied: false, changed: [], needRestart: [], error: "\(error)"),
                    trigger: trigger)
            }
            if old.trackingPlan == applied.trackingPlan,
                let change = Self.planChange(from: live.plan, to: plan, path: applied.trackingPlan)
            {
                outcome.changed.append(change)
            }
            for name in pipelines.withReplacedLibraries(specs) {
                outcome.changed.append("pipeline \(name): a plugin library was replaced; restarted")
            }
            take(applied, ingest: ingest, plan: plan, from: old)
            pipelines.run(specs, configuration: applied, unloaded: unloaded)
            return record(outcome, trigger: trigger)
        }
    }

    private func take(
        _ new: DaemonConfiguration, ingest: PluginChain, plan: TrackingPlan?, from old: DaemonConfiguration
    ) {
        live.replace(new, ingest: ingest, plan: plan)
        writer.reconfigure(new.journal)
        limiter.reconfigure(rate: new.rateLimit, burst: new.rateBurst, by: new.rateLimitBy)
        if new.socketMode != old.socketMode, activation.events == nil {
            chmod(new.socketPath, new.socketMode)
        }
        if new.logLevel != old.logLevel {
            loggerBox.withLockedValue { $0.logLevel = Logger.Level(rawValue: new.logLevel) ?? .info }
        }
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
        lastReloadBox.withLockedValue { $0 = (Date(), summary) }
        return outcome
    }

    /// `whenctl plugins unload|load NAME`: stops routing records to a plugin (its ingest stage is
    /// skipped, its pipelines wait at their cursors), or routes them to it again. The library
    /// stays loaded: a Swift library cannot be closed safely.
    func setUnloaded(_ name: String, _ unload: Bool) -> ControlAnswer {
        let configuration = self.configuration
        let known =
            configuration.ingestPlugins.contains(name)
            || configuration.effectivePipelines.values.contains { $0.contains(name) }
        guard known else {
            return .refused("no plugin \(name) is configured; whenctl plugins lists them")
        }
        return changes.sync {
            let before = unloaded.withLockedValue { $0 }
            unloaded.withLockedValue { if unload { $0.insert(name) } else { $0.remove(name) } }
            do {
                let ingest = try buildPluginChain(configuration, reusing: live.ingest)
                let stillUnloaded = unloaded.withLockedValue { $0 }
                let specs = try pipelines.specs(configuration, unloaded: stillUnloaded, create: false)
                // A built-in pipeline whose library is missing stays off: loaded, it would run
                // nowhere, and saying so is the answer.
                let off = configuration.effectivePipelines.filter {
                    specs[$0.key] == nil && $0.value.contains(name) && stillUnloaded.isDisjoint(with: $0.value)
                }
                if !unload, !off.isEmpty {
                    unloaded.withLockedValue { $0 = before }
                    return .refused(
                        "plugin \(name) cannot be loaded: pipeline \(off.keys.sorted().joined(separator: ", ")) is off, its library is not in \(configuration.pluginDirectories.joined(separator: ":")) (see whend's log); install it, or set plugin_dirs, and reload"
                    )
                }
                live.replace(configuration, ingest: ingest, plan: live.plan)
                pipelines.run(specs, configuration: configuration, unloaded: stillUnloaded)
            } catch {
                unloaded.withLockedValue { $0 = before }
                return .refused("\(error)")
            }
            logger.notice(
                "plugin \(name) \(unload ? "unloaded: no records are routed to it" : "loaded: records are routed to it again")"
            )
            return ControlAnswer()
        }
    }

    /// What a reload says of a plan whose file changed under the same `tracking_plan` (a changed
    /// path is said with the settings); nil if it did not.
    static func planChange(from old: TrackingPlan?, to new: TrackingPlan?, path: String) -> String? {
        guard let new, let old, old.digest != new.digest else { return nil }
        return "tracking plan \(path) read anew: it changed (\(new.eventCount) events planned)"
    }

    /// The tracking plan `configuration` names, read and compiled anew; nil when it names none.
    static func loadPlan(_ configuration: DaemonConfiguration) throws(TrackingPlanError) -> TrackingPlan? {
        let path = configuration.trackingPlan
        guard !path.isEmpty else { return nil }
        do {
            return try TrackingPlan.load(path: path)
        } catch {
            throw TrackingPlanError(path: path, error: error)
        }
    }

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
                    stateDirectory: configuration.stateDirectory + "/plugins/"
                        + configuration.pluginStateName(name, pipeline: nil), logger: logger))
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

/// A tracking plan whend cannot take up: its file, its line and why.
struct TrackingPlanError: Error, CustomStringConvertible {
    var path: String
    var error: PlanError

    var description: String {
        error.line > 0
            ? "the tracking plan \(path), line \(error.line): \(error.reason)"
            : "the tracking plan \(path): \(error.reason)"
    }
}
