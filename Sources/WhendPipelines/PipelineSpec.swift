import CLinux
import CWhendPlugin
import Foundation
import Logging
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

/// What a pipeline worker is told when it starts (as JSON on its command line).
package struct PipelineSpec: Codable, Sendable, Equatable {
    package struct Stage: Codable, Sendable, Equatable {
        package var plugin: String
        package var configuration: String
        /// Its secret values (`DaemonConfiguration.secrets(of:)`): what the plugin says prints
        /// them as `***`.
        package var secrets: [String]?
        /// Its state directory's name under `pluginStateRoot`
        /// (`DaemonConfiguration.pluginStateName`); nil: the plugin's name.
        package var state: String?

        package init(plugin: String, configuration: String, secrets: [String]?, state: String? = nil) {
            self.plugin = plugin
            self.configuration = configuration
            self.secrets = secrets
            self.state = state
        }
    }

    package var name: String
    package var stages: [Stage]
    package var journalDirectory: String
    /// The pipeline's own directory: its cursor and dead letters.
    package var directory: String
    /// Where each stage's plugin keeps its state: `<pluginStateRoot>/<stage's state>`.
    package var pluginStateRoot: String
    package var pluginDirectories: [String]
    /// Attempts at one record before it goes to the dead letters; 0: retry forever.
    package var retryLimit: Int
    /// Seconds between saves of the plugins' state with the cursor; 0: never.
    package var snapshotInterval: Double = 0
    /// Records before its cursor the pipeline starts from when no saved state can be used.
    package var snapshotRebuild: UInt64 = 0
    /// The names the stages' plugins give themselves: the only `_origin`s of its derived records
    /// (none given: not checked).
    package var origins: [String]?
    /// A record on which workers kept dying (`retryLimit` deaths without passing it), and why:
    /// this worker writes it to the dead letters rather than handle it again.
    package var poison: UInt64?
    package var poisonReason: String?
    /// Runs in the shared pipeline host (every stage's plugin trusted), not a process of its own.
    package var shared: Bool?
    /// The word whend keeps the last `_seq` the journal stored in (`SharedWord`): the worker
    /// handles no record past it. None: no bound (a worker of an older whend's spec).
    package var storedThroughPath: String?
    /// Each stage's library as found when the pipeline was set up: its real path, and which
    /// file was there ("device:inode"). A file replaced at a path changes the spec (the
    /// pipeline starts again, on the new file), and retires a shared host that loaded the old.
    package var libraries: [String: String]?

    package init(
        name: String, stages: [Stage], journalDirectory: String, directory: String, pluginStateRoot: String,
        pluginDirectories: [String], retryLimit: Int, snapshotInterval: Double, snapshotRebuild: UInt64,
        shared: Bool, libraries: [String: String]
    ) {
        self.name = name
        self.stages = stages
        self.journalDirectory = journalDirectory
        self.directory = directory
        self.pluginStateRoot = pluginStateRoot
        self.pluginDirectories = pluginDirectories
        self.retryLimit = retryLimit
        self.snapshotInterval = snapshotInterval
        self.snapshotRebuild = snapshotRebuild
        self.shared = shared
        self.libraries = libraries
    }

    package var cursorPath: String { directory + "/cursor" }
    /// Where whend keeps the last `_seq` the journal stored, for the workers of `stateDirectory`.
    package static func storedThroughPath(stateDirectory: String) -> String {
        stateDirectory + "/pipelines/stored-through"
    }
    package var snapshotPath: String { directory + "/snapshot" }
    package var deadLetterPath: String { directory + "/dead-letter.jsonl" }
    /// Eight bytes, shared between the worker and whend: the `_seq` the worker is handling, 0
    /// between records. A worker that dies tells no one which record it died on; this does.
    package var handlingPath: String { directory + "/handling" }

    /// The last `_seq` the pipeline finished, as it was last saved.
    package static func savedCursor(at path: String) -> UInt64 {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return 0 }
        return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }
}
