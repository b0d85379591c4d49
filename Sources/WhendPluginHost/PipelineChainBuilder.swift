import CWhendPlugin
import Logging
import WhendConfiguration

/// A pipeline's chain, built one way wherever a pipeline runs: its worker (a process of its own
/// or a thread of the shared host), the plugin check that admits it at start and reload, and
/// `whenctl replay`. The rules a pipeline's stages obey are here once: each library loaded
/// once (two names of one library refused), each a pipeline stage, a deferred stage last.
package enum PipelineChainBuilder {
    package struct Stage: Sendable {
        package var plugin: String
        package var configuration: String
        /// Its secret values: what the plugin says prints them as `***`.
        package var secrets: Set<String>
        /// Its state directory's name under the state root; nil: the plugin's name.
        package var state: String?

        package init(plugin: String, configuration: String, secrets: Set<String> = [], state: String? = nil) {
            self.plugin = plugin
            self.configuration = configuration
            self.secrets = secrets
            self.state = state
        }
    }

    /// What a plugin's host services report to: derived records, and a deferred stage's completions.
    package struct Services: Sendable {
        package var emit: (@Sendable (String, UnsafeBufferPointer<UInt8>) -> Bool)?
        package var complete: (@Sendable (UInt64) -> Void)?
        package var completeThrough: (@Sendable (UInt64) -> Void)?

        package init(
            emit: (@Sendable (String, UnsafeBufferPointer<UInt8>) -> Bool)? = nil,
            complete: (@Sendable (UInt64) -> Void)? = nil, completeThrough: (@Sendable (UInt64) -> Void)? = nil
        ) {
            self.emit = emit
            self.complete = complete
            self.completeThrough = completeThrough
        }
    }

    /// Loads `plugins`' libraries, in order, and checks that they make a pipeline. No plugin is
    /// created, and none of its functions is called.
    package static func libraries(_ plugins: [String], directories: [String]) throws(PluginLoadError)
        -> [PluginLibrary]
    {
        let libraries = try PluginLibrary.loadChain(plugins, directories: directories)
        for (index, (plugin, library)) in zip(plugins, libraries).enumerated() {
            guard library.roles & WHEND_ROLE_PIPELINE != 0 else {
                throw PluginLoadError(
                    .misconfigured, description: "plugin \(plugin) (\(library.path)) cannot be a pipeline stage")
            }
            guard library.roles & WHEND_ROLE_DEFERRED == 0 || index == plugins.count - 1 else {
                throw PluginLoadError(
                    .misconfigured,
                    description: "plugin \(plugin) finishes records later, so it must be the last stage of its pipeline"
                )
            }
        }
        return libraries
    }

    /// Creates each stage's plugin, in order, with its state in `<stateRoot>/<state or plugin>`, and
    /// chains them. `deferred`: whether the last stage finishes records later.
    package static func build(
        _ stages: [Stage], directories: [String], stateRoot: String, logger: Logger,
        services: Services = Services()
    ) throws(PluginLoadError) -> (chain: PluginChain, deferred: Bool) {
        let libraries = try libraries(stages.map(\.plugin), directories: directories)
        var instances: [PluginInstance] = []
        for (stage, library) in zip(stages, libraries) {
            instances.append(
                try PluginInstance(
                    library: library, configuration: stage.configuration, secrets: stage.secrets,
                    stateDirectory: stateRoot + "/" + (stage.state ?? stage.plugin), logger: logger,
                    emit: services.emit,
                    complete: services.complete, completeThrough: services.completeThrough))
        }
        let deferred = libraries.last.map { $0.roles & WHEND_ROLE_DEFERRED != 0 } ?? false
        return (PluginChain(instances), deferred)
    }
}
