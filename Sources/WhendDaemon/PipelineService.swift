import CWhendPlugin
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendControl
import WhendJournal
import WhendPipelines
import WhendPluginHost
import WhendRecord
import WhendSystem
import WhendWire

/// whend's pipelines: their supervised workers, the shared host the trusted ones run in, and
/// the records retention took from them. It owns that state, under one lock; the daemon asks it
/// (start, reload, status, retention) and hands it what it derives from nowhere else: the
/// journal to append derived records to, and the logger in force.
final class PipelineService: Sendable {
    private struct State {
        var supervisors: [String: PipelineSupervisor] = [:]
        /// The process the trusted pipelines share, started when the first of them runs.
        var sharedHost: SharedPipelineHost?
        /// Records retention deleted before a pipeline read them, by pipeline (since start).
        var retentionLosses: [String: UInt64] = [:]
        /// Built-in pipelines nobody asked for whose plugin is missing: off, they hold no records.
        var off: Set<String> = []
        /// Where the journal tells the workers the last `_seq` it stored, once made.
        var storedThrough: SharedWord?
    }

    private let state = NIOLockedValueBox(State())
    private let writer: JournalWriter
    private let currentLogger: @Sendable () -> Logger
    private var logger: Logger { currentLogger() }

    init(writer: JournalWriter, logger: @escaping @Sendable () -> Logger) {
        self.writer = writer
        self.currentLogger = logger
    }

    /// Retention deleted `count` records `pipeline` had not read.
    func lostToRetention(_ pipeline: String, _ count: UInt64) {
        state.withLockedValue { $0.retentionLosses[pipeline, default: 0] += count }
    }

    /// Restarts `name`'s worker from its cursor; false when no such pipeline runs.
    func restart(_ name: String) -> Bool {
        guard let supervisor = state.withLockedValue({ $0.supervisors[name] }) else { return false }
        supervisor.restart()
        return true
    }

    /// The path of the word the journal tells the workers the last `_seq` it stored in, made
    /// the first time; nil if it cannot be (the workers then read as far as the journal is
    /// written, as before, and say nothing of it: whend logs why once).
    private func shareStoredThrough(stateDirectory: String) -> String? {
        let path = PipelineSpec.storedThroughPath(stateDirectory: stateDirectory)
        return state.withLockedValue { s -> String? in
            if s.storedThrough != nil { return path }
            guard (try? DurableFile.createDirectory(stateDirectory + "/pipelines")) != nil,
                let word = SharedWord.create(path)
            else {
                logger.error(
                    "cannot map \(path): pipelines read records before they are stored, and a power cut may leave a cursor past the journal"
                )
                return nil
            }
            writer.share(storedThrough: word)
            s.storedThrough = word
            return path
        }
    }

    /// The worker specs that `configuration` asks for, by pipeline name. Each new or changed
    /// pipeline's plugins are loaded, checked (ABI, role, where it lives) and created once in
    /// `whend --plugin-check`, a process of their own, so that a bad pipeline is refused at start
    /// or reload rather than found by a worker that keeps failing; whend itself never loads a
    /// pipeline plugin's library (its constructors and entry point would run in the daemon,
    /// which its own process is there to keep them out of).
    /// `create`: each new pipeline's plugins are created too (a reload); else (whend's start, a
    /// plugin loaded again) only their libraries are checked, and a plugin that refuses its
    /// configuration fails in its worker, as it would later.
    func specs(_ configuration: DaemonConfiguration, unloaded: Set<String>, create: Bool) throws(PluginLoadError)
        -> [String: PipelineSpec]
    {
        var specs: [String: PipelineSpec] = [:]
        // Only for pipelines: a file mapped for writing keeps the state directory's file system
        // from being remounted read-only, which whend without pipelines survives.
        let storedThrough =
            configuration.effectivePipelines.isEmpty
            ? nil : shareStoredThrough(stateDirectory: configuration.stateDirectory)
        // A pipeline with an unloaded plugin waits at its cursor: it never skips a stage.
        for (name, plugins) in configuration.effectivePipelines where unloaded.isDisjoint(with: plugins) {
            // Only found, not loaded (a missing one is the plugin check's to refuse).
            let found = plugins.map { PluginLibrary.locate(name: $0, directories: configuration.pluginDirectories) }
            specs[name] = PipelineSpec(
                name: name,
                stages: plugins.map {
                    PipelineSpec.Stage(
                        plugin: $0, configuration: configuration.pluginConfigurations[$0] ?? "{}",
                        secrets: configuration.secrets(of: $0).sorted(),
                        state: configuration.pluginStateName($0, pipeline: name))
                },
                journalDirectory: configuration.journal.directory.path,
                directory: configuration.stateDirectory + "/pipelines/" + name,
                pluginStateRoot: configuration.stateDirectory + "/plugins",
                pluginDirectories: configuration.pluginDirectories,
                retryLimit: configuration.pipelineRetryLimit, snapshotInterval: configuration.pipelineSnapshotInterval,
                snapshotRebuild: UInt64(configuration.pipelineSnapshotRebuild),
                shared: zip(plugins, found).allSatisfy { configuration.runsShared($0, library: $1?.path) },
                libraries: Dictionary(found.compactMap { $0 }.map { ($0.path, $0.file) }) { a, _ in a })
            specs[name]?.storedThroughPath = storedThrough
        }
        // A pipeline running as asked keeps what its check found; the others are checked now.
        let running = state.withLockedValue { $0.supervisors.mapValues(\.spec) }
        var unchecked: [PipelineSpec] = []
        for (name, spec) in specs {
            if var kept = running[name] {
                let origins = kept.origins
                kept.origins = nil
                if kept == spec {
                    specs[name]?.origins = origins
                    continue
                }
            }
            unchecked.append(spec)
        }
        let check = PluginCheck.run(
            PluginCheck.request(
                for: unchecked, pluginDirectories: configuration.pluginDirectories,
                optional: configuration.isImplicitBuiltin, create: create), timeout: configuration.pipelineWatchdog)
        if let refusal = check.refusal { throw PluginLoadError(.refused, description: refusal) }
        // A default nobody asked for by name: its absence is worth a warning, not a refusal.
        for off in check.off { logger.warning("\(off)") }
        for name in check.offPipelines { specs[name] = nil }
        for spec in unchecked where specs[spec.name] != nil {
            guard let origins = check.origins[spec.name], origins.count == spec.stages.count else {
                throw PluginLoadError(
                    .misconfigured, description: "pipeline \(spec.name): the plugin check did not name its stages")
            }
            specs[spec.name]?.origins = origins
        }
        return specs
    }

    /// Starts, keeps or stops supervised workers so that the pipelines running are `specs`. A
    /// pipeline whose spec did not change keeps its worker.
    /// The running pipelines `specs` would restart for a plugin library replaced at its path
    /// (an upgrade) and nothing else: a reload says so, where it said "nothing changed".
    func withReplacedLibraries(_ specs: [String: PipelineSpec]) -> [String] {
        state.withLockedValue { state in
            state.supervisors.compactMap { name, supervisor -> String? in
                guard var spec = specs[name], spec != supervisor.spec else { return nil }
                spec.libraries = supervisor.spec.libraries
                return spec == supervisor.spec ? name : nil
            }.sorted()
        }
    }

    func run(_ specs: [String: PipelineSpec], configuration: DaemonConfiguration, unloaded: Set<String>) {
        let executable = WhendExecutable.path
        let watchdog = configuration.pipelineWatchdog
        let logger = self.logger
        state.withLockedValue {
            $0.off = Set(
                configuration.effectivePipelines.filter { name, plugins in
                    specs[name] == nil && configuration.isImplicitBuiltin(name) && unloaded.isDisjoint(with: plugins)
                }.keys)
        }
        var stopping: [PipelineSupervisor] = []
        var starting: [PipelineSupervisor] = []
        state.withLockedValue { state in
            for (name, supervisor) in state.supervisors where specs[name] != supervisor.spec {
                stopping.append(supervisor)
                state.supervisors[name] = nil
            }
            for (name, spec) in specs where state.supervisors[name] == nil {
                var host: SharedPipelineHost?
                if spec.shared == true {
                    if state.sharedHost == nil {
                        state.sharedHost = SharedPipelineHost(executable: executable, logger: logger)
                    }
                    host = state.sharedHost
                }
                let supervisor = PipelineSupervisor(
                    spec: spec, host: host, executable: executable, watchdog: watchdog, logger: logger,
                    journalWrittenThrough: { [writer] in writer.statistics.writtenThrough }
                ) { [weak self] records, stored in
                    self?.appendDerived(records, pipeline: name, stored: stored)
                }
                state.supervisors[name] = supervisor
                starting.append(supervisor)
            }
        }
        Self.stop(stopping)
        // A host no pipeline needs any more goes (the next shared pipeline starts another).
        let unneededHost = state.withLockedValue { state in
            state.supervisors.values.contains { $0.spec.shared == true } ? nil : state.sharedHost
        }
        unneededHost?.stop()
        for supervisor in starting { supervisor.start() }
    }

    func stopAll() {
        let (all, host) = state.withLockedValue { state in
            defer { state.supervisors.removeAll() }
            return (Array(state.supervisors.values), state.sharedHost)
        }
        Self.stop(all)
        host?.stop()
    }

    /// Stops `supervisors` side by side: each may wait for its plugins to close (in the shared
    /// host, up to `pipeline_watchdog`), and a stop must not take the sum of those waits.
    private static func stop(_ supervisors: [PipelineSupervisor]) {
        let group = DispatchGroup()
        for supervisor in supervisors {
            group.enter()
            Thread {
                supervisor.stop()
                group.leave()
            }.start()
        }
        group.wait()
    }

    /// Appends records a pipeline's plugins derived, as one journal batch (it shares ingest's
    /// group commits), each stored as the plugin wrote it plus `_origin` (the plugin's name),
    /// `_pipeline` and `_cause` (the `_seq` it was derived from). Pipelines then see them like
    /// any other record. A record that is not one JSON object with a string `type` is refused
    /// and logged, and counts as done: nothing will ever store it.
    func appendDerived(
        _ records: [DerivedRecord], pipeline: String, stored: @escaping @Sendable (Bool) -> Void = { _ in }
    ) {
        var batch = JournalBatch()
        var clock = RFC3339Clock()
        var now: [UInt8] = []
        clock.appendNow(to: &now)
        // The pipeline too: a restarted daemon finds what each pipeline already derived.
        var builder = DerivedRecordBuilder(pipeline: pipeline)
        for record in records {
            do {
                try record.bytes.withUnsafeBufferPointer { (out) throws(WireError) in
                    try builder.appendBody(
                        out, origin: record.origin, cause: record.cause, receivedAt: now, to: &batch.bodies)
                }
                batch.ends.append(batch.bodies.count)
            } catch {
                logger.error(
                    "pipeline \(pipeline): a record \(record.origin) derived from _seq \(record.cause) was refused: \(error)"
                )
            }
        }
        guard !batch.isEmpty else {
            stored(true)
            return
        }
        let micros = Int64(Date().timeIntervalSince1970 * 1e6)
        batch.minReceivedMicros = micros
        batch.maxReceivedMicros = micros
        let log = logger
        writer.submit(batch) { result in
            if case .failed(let why) = result {
                log.error("pipeline \(pipeline): derived records were not stored: \(why)")
                stored(false)
            } else {
                stored(true)
            }
        }
    }

    /// Each configured pipeline's durable cursor, for retention: its worker's last report,
    /// else the cursor it saved (a pipeline waiting on an unloaded plugin still needs its records),
    /// and never past the cursor of its plugins' saved state — a restarted worker resumes from
    /// there, and needs the records after it to rebuild that state. A built-in pipeline that is
    /// off (its plugin missing) holds nothing.
    func cursors(_ configuration: DaemonConfiguration) -> [(name: String, cursor: UInt64)] {
        let (running, off) = state.withLockedValue { ($0.supervisors, $0.off) }
        return configuration.effectivePipelines.keys.sorted().compactMap { name in
            let directory = configuration.stateDirectory + "/pipelines/" + name
            var cursor: UInt64
            if let supervisor = running[name] {
                cursor = supervisor.state.withLockedValue { $0.cursor }
            } else if off.contains(name) {
                return nil
            } else {
                cursor = PipelineSpec.savedCursor(at: directory + "/cursor")
            }
            // Both: between the two renames of a save, the previous one is all there is.
            for path in [directory + "/snapshot", directory + "/snapshot.previous"] {
                if let saved = PipelineSnapshot.cursor(at: path) { cursor = min(cursor, saved) }
            }
            return (name, cursor)
        }
    }

    func list() -> [PipelineStatus] {
        let lastSeq = writer.statistics.lastSeq
        let (running, losses) = state.withLockedValue { ($0.supervisors, $0.retentionLosses) }
        return running.sorted { $0.key < $1.key }.map { name, supervisor in
            let s = supervisor.state.withLockedValue { $0 }
            return PipelineStatus(
                name: name, plugins: supervisor.spec.stages.map(\.plugin), state: s.running ? "running" : "restarting",
                pid: Int(s.pid), cursor: s.cursor, lag: lastSeq > s.cursor ? lastSeq - s.cursor : 0,
                failures: s.failures, deadLetters: s.deadLetters, restarts: s.restarts,
                lostToRetention: losses[name] ?? 0, skipped: s.skipped,
                counters: s.countersSinceStart, lastExit: s.lastExit)
        }
    }

    /// The largest number of records any pipeline still has to process.
    var lag: UInt64? {
        let lastSeq = writer.statistics.lastSeq
        let running = state.withLockedValue { Array($0.supervisors.values) }
        let cursors = running.map { $0.state.withLockedValue { $0.cursor } }
        guard !cursors.isEmpty else { return nil }
        return cursors.map { lastSeq > $0 ? lastSeq - $0 : 0 }.max()
    }
}
