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
        case .rejections:
            return ControlAnswer(rejections: metrics.recentRejections.list)
        case .planViolations:
            let configuration = live.current
            return ControlAnswer(
                planViolations: metrics.planViolations.report(
                    plan: configuration.trackingPlan, mode: configuration.trackingPlanMode.rawValue))
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
            return ControlAnswer(plugins: configurations.pluginList(), pipelines: pipelines.list())
        case .load(let name): return configurations.setUnloaded(name, false)
        case .unload(let name): return configurations.setUnloaded(name, true)
        case .restart(let name):
            guard pipelines.restart(name) else { return .refused("no pipeline \(name); whenctl plugins lists them") }
            return ControlAnswer()
        case .reload:
            let outcome = configurations.reload(trigger: "whenctl reload")
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
            connectionsRefused: counts.connectionsRefused, eventsPerSecond: Int(reporter.eventsPerSecond),
            eventsReceived: counts.eventsReceived, eventsRejected: rejected, bytesReceived: counts.bytesIn,
            repliesDropped: counts.droppedReplies, pendingBytes: writer.pendingBytes, journal: journal,
            pipelines: pipelines.list(), plugins: configurations.pluginList(), statusLine: reporter.statusLine(),
            lastReload: configurations.lastReload.map {
                StatusAnswer.LastReload(at: ISO8601DateFormatter().string(from: $0.at), outcome: $0.outcome)
            })
    }
}
