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

/// A pipeline's worker process: it loads the pipeline's plugins, reads the journal itself from
/// the pipeline's cursor, in `_seq` order, and runs each record through the chain.
///
/// It speaks `WorkerFrame`s with the daemon, on descriptors of their own (its standard output
/// is whend's standard error, where a plugin's prints join the log): the daemon's first message
/// says which pipeline to run and the worker's generation; the worker reports progress at least
/// twice a second (the daemon's watchdog for it) and sends what its plugins derive in batches,
/// which the daemon acknowledges per batch once they are stored. A record whose chain fails is
/// retried with backoff, and never skipped unless `retryLimit` says so; then it goes to the dead
/// letters, as does at once a record whose derived records cannot go to the daemon in one
/// frame. The cursor is saved every 100 ms and at exit, below any record whose derived records
/// are not yet stored, so that a crash repeats at most the records of the last 100 ms: at least
/// once, in order.
package enum PipelineWorker {
    package static func run(logger: Logger) -> Never {
        // A Ctrl-C in whend's terminal reaches every process of its group, workers too: whend
        // stops them itself (SIGTERM, then SIGKILL), so a worker dying of it first was only a
        // crash to log and a restart to begin during the stop.
        guard
            let pipes = HelperProcess.takeDescriptors([WorkerFrame.reportDescriptor, WorkerFrame.commandDescriptor])
        else {
            logger.error(
                "whend --pipeline-worker: its pipes to the daemon cannot be moved: \(String(cString: strerror(errno)))")
            exit(4)
        }
        let (report, command) = (pipes[0], pipes[1])
        HelperProcess.stopOnSIGTERM()
        let link = WorkerLink(report: report, command: command, exitsProcess: true)
        var frames = WorkerFrameReader()
        switch readStart(&frames, link) {
        case .success(let (generation, spec)):
            exit(run(spec, generation: generation, frames: frames, link: link, logger: logger))
        case .failure(.closed):
            // The daemon is gone before it said anything: nothing to run, nobody to tell.
            exit(4)
        case .failure(.notAStart):
            logger.error("whend --pipeline-worker: the daemon's first message is not a pipeline to run")
            exit(2)
        }
    }

    enum NoStart: Error {
        case closed, notAStart
    }

    /// The daemon's first message: the pipeline to run, and the worker's generation.
    static func readStart(_ frames: inout WorkerFrameReader, _ link: WorkerLink) -> Result<
        (UInt64, PipelineSpec), NoStart
    > {
        var start: (UInt64, PipelineSpec)?
        let end = try? frames.pump(link.command) { payload throws(WorkerFrame.DecodeError) in
            if case .start(let generation, let json) = try WorkerFrame.decodeSupervisorMessage(payload),
                let spec = try? JSONDecoder().decode(PipelineSpec.self, from: Data(json))
            {
                start = (generation, spec)
            }
            return false
        }
        if let start { return .success(start) }
        return .failure(end == .closed ? .closed : .notAStart)
    }

    /// Runs one pipeline until it is asked to stop (or cannot go on), and says how it ended as
    /// a worker process's exit status: 0 stopped, 3 its plugins could not be loaded.
    static func run(
        _ spec: PipelineSpec, generation: UInt64, frames: WorkerFrameReader, link: WorkerLink, logger: Logger
    ) -> Int32 {
        let completions = CompletionTracker()
        let output = WorkerOutput(completions: completions, link: link)
        var deferred = false
        func buildChain() -> PluginChain? {
            do {
                try DurableFile.createDirectory(spec.directory)
                let built = try PipelineChainBuilder.build(
                    spec.stages.map {
                        .init(
                            plugin: $0.plugin, configuration: $0.configuration, secrets: Set($0.secrets ?? []),
                            state: $0.state)
                    }, directories: spec.pluginDirectories, stateRoot: spec.pluginStateRoot,
                    logger: logger,
                    services: .init(
                        emit: { plugin, json in output.emit(json, origin: plugin) },
                        complete: { seq in completions.complete(seq) },
                        completeThrough: { seq in completions.completeThrough(seq) }))
                deferred = built.deferred
                return built.chain
            } catch {
                logger.error("pipeline \(spec.name): \(error)")
                return nil
            }
        }
        guard var chain = buildChain() else { return 3 }
        let handling = HandlingMarker(path: spec.handlingPath)
        let keepsState = spec.snapshotInterval > 0 && chain.plugins.contains { $0.keepsState }
        // A snapshot left from when the pipeline kept state is never resumed from now: it must
        // not hold retention back (retention waits for the cursor of any snapshot it finds).
        if !keepsState {
            for path in [spec.snapshotPath, spec.snapshotPath + ".previous"] { unlink(path) }
        }
        // whend acknowledges each batch of derived records once stored; the end of its pipe
        // means whend is gone.
        link.readerStarted.store(true, ordering: .relaxed)
        Thread {
            var frames = frames
            do {
                _ = try frames.pump(link.command) { payload throws(WorkerFrame.DecodeError) in
                    switch try WorkerFrame.decodeSupervisorMessage(payload) {
                    // Meant for a worker that died: its batches are not this one's.
                    case .stored(let from, let batch) where from == generation: output.stored(batch: batch)
                    case .stop: link.requestStop()
                    default: break
                    }
                    return true
                }
            } catch {
                logger.error("pipeline \(spec.name): the daemon's message cannot be read: \(error)")
            }
            if !link.exitsProcess { close(link.command) }
            link.daemonGone()
        }.start()
        var cursor = PipelineSpec.savedCursor(at: spec.cursorPath)
        let firstStart = !FileManager.default.fileExists(atPath: spec.cursorPath)
        killPoint(.started, spec)
        // The cursor resumed from never runs ahead of the state restored: the plugins' state is
        // that of the records through the snapshot's cursor, so the records after it are handled
        // again (what they derive again is not stored twice), whatever cursor was saved since.
        if keepsState {
            switch restoreState(spec, chain, logger: logger) {
            case .restored(let at):
                cursor = at
            case .nothingSaved where firstStart || cursor == 0:
                // A new pipeline: the plugins' fresh state is its state before the first record.
                // Saved before the cursor, so that no later worker finds a cursor without state.
                do {
                    try takeSnapshot(chain, cursor: 0).save(to: spec.snapshotPath)
                } catch {
                    logger.error("pipeline \(spec.name): its plugins' first state was not saved: \(error)")
                }
            case .nothingSaved, .unusable:
                // Plugins may hold part of a state that was not used: start them afresh, from
                // far enough back to rebuild it. What they derive again is not stored twice. A
                // cursor without any snapshot (a worker killed before its first, or one from
                // before snapshots) is no state either: resuming at it would handle the records
                // after it against empty state.
                chain = PluginChain([])
                guard let rebuilt = buildChain() else { return 3 }
                chain = rebuilt
                let from = cursor > spec.snapshotRebuild ? cursor - spec.snapshotRebuild : 0
                logger.error(
                    "pipeline \(spec.name): no saved state can be used; its plugins rebuild theirs from the journal, from _seq \(from + 1) (pipeline_snapshot_rebuild = \(spec.snapshotRebuild)) to its cursor \(cursor)"
                )
                cursor = from
            }
        }
        // A pipeline that has never saved a cursor starts at the journal's oldest record, and
        // what retention deleted before it existed is no gap of its.
        let expected: UInt64? = FileManager.default.fileExists(atPath: spec.cursorPath) ? cursor + 1 : nil
        // The pipeline exists from now on: a later worker tells a gap from a first start.
        if expected == nil {
            do { try save(cursor, to: spec.cursorPath) } catch { logger.error("pipeline \(spec.name): \(error)") }
        }
        var loop = WorkerLoop(
            spec: spec, chain: chain, deferred: deferred, keepsState: keepsState, cursor: cursor,
            expected: expected, output: output, completions: completions, handling: handling, link: link,
            logger: logger)
        chain = PluginChain([])
        loop.report(force: true)
        JournalReader(directory: JournalDirectory(path: spec.journalDirectory)).read(
            fromSeq: cursor + 1, follow: true,
            body: { record, _ in loop.handle(record) },
            onCaughtUp: { loop.caughtUp() },
            onProblem: { problem in logger.warning("pipeline \(spec.name): \(problem)") })
        loop.finish()
        return 0
    }
}
