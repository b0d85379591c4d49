import CWhendPlugin
import Foundation
import Logging
import WhendConfiguration
import WhendControl
import WhendJournal
import WhendPipelines
import WhendPluginHost
import WhendWire

extension Daemon {
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
        return reloadQueue.sync {
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
                live.replace(configuration, ingest: ingest)
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
}
