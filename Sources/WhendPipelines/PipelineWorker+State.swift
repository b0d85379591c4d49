import CLinux
import CWhendPlugin
import Foundation
import Logging
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendSystem
import WhendWire

extension PipelineWorker {
    /// Moments at which a test can have the worker SIGKILL itself, to reach each phase of its
    /// life reliably: with `WHEND_TEST_KILL_POINTS` naming a directory, the worker dies at
    /// point P if it can remove `<directory>/<pipeline>.<P>` (so one worker dies per file).
    /// Without the variable, nothing is looked at.
    enum KillPoint: String {
        /// Its plugins loaded, before any state is restored.
        case started
        /// A stage's state restored, before the next stage's and before the resume.
        case restoring
        /// The newest snapshot moved aside, the new one not yet in its place.
        case writingSnapshot = "writing-snapshot"
        /// A snapshot saved, the cursor not yet saved with it.
        case snapshotSaved = "snapshot-saved"
        /// A cursor saved (after the last snapshot, before the next).
        case cursorSaved = "cursor-saved"
    }

    private static let killPointDirectory = ProcessInfo.processInfo.environment["WHEND_TEST_KILL_POINTS"]

    static func killPoint(_ point: KillPoint, _ spec: PipelineSpec) {
        guard let directory = killPointDirectory, !directory.isEmpty,
            unlink(directory + "/" + spec.name + "." + point.rawValue) == 0
        else { return }
        kill(getpid(), SIGKILL)
    }

    enum Restored {
        case restored(at: UInt64)
        case nothingSaved
        case unusable
    }

    /// Gives each stage the state saved with the newest usable snapshot (else the one before),
    /// and says from which cursor to resume.
    static func restoreState(_ spec: PipelineSpec, _ chain: PluginChain, logger: Logger) -> Restored {
        let candidates = [(spec.snapshotPath, "newest"), (spec.snapshotPath + ".previous", "previous")]
        var found = false
        for (path, which) in candidates {
            guard let bytes = FileManager.default.contents(atPath: path) else { continue }
            found = true
            do {
                let snapshot = try PipelineSnapshot.decode(Array(bytes))
                let stateful = chain.plugins.filter(\.keepsState)
                guard snapshot.stages.map(\.plugin) == stateful.map(\.library.name) else {
                    throw PipelineSnapshot.Unusable(
                        description:
                            "it is of stages \(snapshot.stages.map(\.plugin)), the pipeline now has \(stateful.map(\.library.name))"
                    )
                }
                for (stage, plugin) in zip(snapshot.stages, stateful) {
                    guard stage.version == plugin.library.version else {
                        throw PipelineSnapshot.Unusable(
                            description:
                                "it is of \(stage.plugin) \(stage.version), and \(plugin.library.version) is loaded")
                    }
                    do {
                        try plugin.restore(stage.state)
                    } catch {
                        throw PipelineSnapshot.Unusable(description: error.description)
                    }
                    killPoint(.restoring, spec)
                }
                logger.notice(
                    "pipeline \(spec.name): restored its plugins' state saved at _seq \(snapshot.cursor) (\(which) snapshot); resuming after it"
                )
                return .restored(at: snapshot.cursor)
            } catch {
                logger.error("pipeline \(spec.name): the \(which) snapshot \(path) cannot be used: \(error)")
            }
        }
        return found ? .unusable : .nothingSaved
    }

    /// Every stateful stage's state, with the cursor it goes with.
    static func takeSnapshot(_ chain: PluginChain, cursor: UInt64) throws(PipelineSnapshot.Unusable)
        -> PipelineSnapshot
    {
        var stages: [PipelineSnapshot.Stage] = []
        for plugin in chain.plugins where plugin.keepsState {
            guard let state = plugin.snapshot() else {
                throw PipelineSnapshot.Unusable(description: "plugin \(plugin.library.name) gave no state")
            }
            stages.append(
                PipelineSnapshot.Stage(plugin: plugin.library.name, version: plugin.library.version, state: state))
        }
        return PipelineSnapshot(cursor: cursor, stages: stages)
    }

    /// A crash or a power cut leaves the old cursor or the new one, never half (`DurableFile`).
    static func save(_ cursor: UInt64, to path: String) throws(DurableFileError) {
        try DurableFile.replace(path, with: Array("\(cursor)\n".utf8))
    }

    /// One line in the pipeline's dead letters, synced: the record is passed only once it is
    /// there.
    static func deadLetter(_ line: UnsafeBufferPointer<UInt8>, seq: UInt64, why: String, to path: String)
        throws(DurableFileError)
    {
        var entry = Array(#"{"_seq":\#(seq),"error":"#.utf8)
        appendJSONString(why.utf8, to: &entry)
        entry += #","record":"#.utf8
        entry += line
        entry += "}\n".utf8
        try DurableFile.append(entry, to: path, sync: true)
    }
}
