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
                        .init(plugin: $0.plugin, configuration: $0.configuration, secrets: Set($0.secrets ?? []))
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
        var savedCursor = cursor
        var snapshotCursor = cursor
        var policy = CheckpointPolicy(snapshotInterval: spec.snapshotInterval, now: monotonicSeconds())
        // A pipeline that has never saved a cursor starts at the journal's oldest record, and
        // what retention deleted before it existed is no gap of its.
        var expected: UInt64? = FileManager.default.fileExists(atPath: spec.cursorPath) ? cursor + 1 : nil
        var skipped: UInt64 = 0
        // The pipeline exists from now on: a later worker tells a gap from a first start.
        if expected == nil {
            do { try save(cursor, to: spec.cursorPath) } catch { logger.error("pipeline \(spec.name): \(error)") }
        }
        var failures = 0
        var deadLetters = 0
        /// The records through which the plugins' held effects are durable (`chain.flush()`).
        var flushedThrough = cursor
        var flushFailure: String?
        var lastProgressCursor = cursor
        /// The cursor at which the worker last gave freed memory back.
        var trimmedAt = cursor
        /// What the daemon was last told of each stage's counters.
        var countersSent: [String: [String: Int64]] = [:]

        // Called after every record; the work is done as `CheckpointPolicy` says. The cursor saved is below the oldest record not
        // finished (a deferred stage's, or one whose derived records whend has not stored yet).
        /// `idle`: nothing more to read for now, so what is held is flushed and the progress told
        /// at once rather than at the next tick (an idle worker's cursor must not lag).
        func report(force: Bool = false, idle: Bool = false) {
            let now = monotonicSeconds()
            if policy.outputDue(now: now, pendingBytes: output.pendingBytes, force: force) { output.flush() }
            let saveDue = policy.saveDue(now: now, force: force)
            let snapshotDue =
                keepsState && !chain.plugins.isEmpty && cursor != snapshotCursor
                && policy.snapshotDue(now: now, force: force)
            // Neither the cursor nor a snapshot passes records whose effects a plugin still
            // holds in memory: they are made durable first, or both wait.
            var flushed = true
            if policy.pluginFlushDue(
                now: now, force: force, idle: idle, snapshotDue: snapshotDue, behind: cursor != flushedThrough)
            {
                do {
                    try chain.flush()
                    flushedThrough = cursor
                    if flushFailure != nil {
                        logger.notice("pipeline \(spec.name): its plugins flush again")
                        flushFailure = nil
                    }
                } catch {
                    flushed = false
                    // Said once per kind of failure, not every tenth of a second.
                    if flushFailure != error.description {
                        logger.error("pipeline \(spec.name): \(error); its cursor stays before the records it holds")
                        flushFailure = error.description
                    }
                }
            }
            if snapshotDue && flushed {
                policy.snapshotBegun(now: now)
                // The state goes with a cursor only when every record handled is finished: its
                // derived records stored, the deferred stage done. Wait for that, briefly.
                output.flush()
                policy.outputSent(now: now)
                if completions.watermark(acceptedThrough: cursor) != cursor { completions.drain(seconds: 2) }
                if completions.watermark(acceptedThrough: cursor) == cursor {
                    do {
                        try takeSnapshot(chain, cursor: cursor).save(to: spec.snapshotPath) {
                            killPoint(.writingSnapshot, spec)
                        }
                        killPoint(.snapshotSaved, spec)
                        snapshotCursor = cursor
                        policy.snapshotSaved(started: now, finished: monotonicSeconds())
                    } catch {
                        logger.error("pipeline \(spec.name): its plugins' state was not saved: \(error)")
                    }
                }
            }
            // Not after every record: the watermark takes the completions' lock.
            guard saveDue || idle || policy.progressDue(now: now, force: force, idle: false, moved: false) else {
                return
            }
            let durable = min(completions.watermark(acceptedThrough: cursor), flushedThrough)
            let progressDue = policy.progressDue(
                now: now, force: force, idle: idle, moved: durable != lastProgressCursor)
            if saveDue, durable != savedCursor {
                do {
                    try save(durable, to: spec.cursorPath)
                    savedCursor = durable
                    killPoint(.cursorSaved, spec)
                } catch {
                    // The old cursor stands (records are handled again, never skipped); tried
                    // again at the next save.
                    logger.error("pipeline \(spec.name): \(error); the cursor stays at \(savedCursor)")
                }
                policy.cursorSaved(now: now)
            }
            if progressDue {
                // The counters first: whend has them by the time it sees the cursor they go with.
                // Under the stage's name as configured, which whend knows (a library may call
                // itself otherwise: its counters were dropped).
                for (stage, plugin) in zip(spec.stages, chain.plugins) {
                    let counters = plugin.counters
                    if counters != countersSent[stage.plugin] {
                        output.counters(plugin: stage.plugin, counters)
                        countersSent[stage.plugin] = counters
                    }
                }
                output.progress(cursor: durable, failures: failures, deadLetters: deadLetters, skipped: skipped)
                policy.progressSent(now: now)
                lastProgressCursor = durable
            }
        }

        report(force: true)
        JournalReader(directory: JournalDirectory(path: spec.journalDirectory)).read(
            fromSeq: cursor + 1, follow: true,
            body: { record, _ in
                guard !link.stopRequested else { return false }
                guard let seq = record.seq, seq > cursor else { return true }
                if let expected, seq > expected {
                    // Gone before this pipeline read them: said, counted, never silent.
                    skipped += seq - expected
                    logger.error(
                        "pipeline \(spec.name): _seq \(expected)…\(seq - 1) are gone from the journal (retention deleted them before this pipeline read them); skipped \(seq - expected) records"
                    )
                }
                expected = seq + 1
                handling.set(seq)
                defer { handling.set(0) }
                if seq == spec.poison {
                    let why = spec.poisonReason ?? "the worker kept dying on it"
                    do {
                        try deadLetter(record.line, seq: seq, why: why, to: spec.deadLetterPath)
                        deadLetters += 1
                        logger.error(
                            "pipeline \(spec.name): _seq \(seq) is not handled again (\(why)); written to \(spec.deadLetterPath)"
                        )
                        cursor = seq
                        handling.set(0)
                        report()
                        return true
                    } catch {
                        logger.error("pipeline \(spec.name): _seq \(seq) cannot go to the dead letters: \(error)")
                    }
                }
                var attempt = 0
                while true {
                    output.begin(seq)
                    var outcome = chain.run(record.line, seq: seq)
                    // Handling it again would derive as much again: no retry helps.
                    let oversized = output.oversized.map {
                        "it derived \($0) bytes, more than the \(WorkerFrame.maxLength) a frame to whend holds; none of them is stored"
                    }
                    if let oversized { outcome = .rejected(oversized) }
                    // Finished once the deferred stage completes it (if it reached it) and whend
                    // has stored what it derived.
                    switch outcome {
                    case .unchanged, .changed:
                        completions.accept(seq, derivedCount: output.emitted, deferredStage: deferred)
                    case .dropped: completions.accept(seq, derivedCount: output.emitted, deferredStage: false)
                    case .rejected: break
                    }
                    if case .rejected(let why) = outcome {
                        // What an attempt that failed derived is not stored: only the attempt that
                        // passes the record derives, as a run without the failure would.
                        output.discardCurrentRecord()
                        attempt += 1
                        failures += 1
                        if oversized != nil || (spec.retryLimit > 0 && attempt >= spec.retryLimit) {
                            do {
                                try deadLetter(record.line, seq: seq, why: why, to: spec.deadLetterPath)
                                deadLetters += 1
                                logger.error(
                                    "pipeline \(spec.name): _seq \(seq) failed \(attempt) times (\(why)); written to \(spec.deadLetterPath)"
                                )
                                break
                            } catch {
                                // Not in the dead letters: not passed either. Tried again below.
                                logger.error(
                                    "pipeline \(spec.name): _seq \(seq) cannot go to the dead letters: \(error)")
                            }
                        }
                        let delay = min(30, 0.05 * pow(2, Double(min(attempt, 20))))
                        if attempt == 1 || attempt % 10 == 0 {
                            logger.warning(
                                "pipeline \(spec.name): _seq \(seq) failed (\(why)); attempt \(attempt), retrying in \(String(format: "%.2f", delay)) s"
                            )
                        }
                        // Sleep in slices, reporting, so that the daemon sees the worker alive.
                        let until = Date().addingTimeInterval(delay)
                        while Date() < until && !link.stopRequested {
                            report()
                            Thread.sleep(forTimeInterval: min(0.1, max(0, until.timeIntervalSinceNow)))
                        }
                        // Stopping: the record is not done, so the cursor stays before it.
                        if link.stopRequested { return false }
                        continue
                    }
                    break
                }
                cursor = seq
                // What fails from here (a plugin's flush) is not this record's doing.
                handling.set(0)
                report()
                return true
            },
            onCaughtUp: {
                // Nothing more to read for now: what was derived goes to whend at once.
                if output.pendingBytes > 0 {
                    output.flush()
                    policy.outputSent(now: monotonicSeconds())
                }
                // Memory the plugins freed goes back to the system once in a while: glibc keeps a
                // freed heap's pages (sessions forgotten, batches sent), and after a burst a
                // worker held a third more than its state (crashes: 89 → 60 MiB of PSS). Before
                // the progress that says the pipeline caught up: by then it is given back.
                if policy.trimDue(now: monotonicSeconds(), handled: cursor > trimmedAt ? cursor - trimmedAt : 0) {
                    _ = whend_malloc_trim(0)
                    trimmedAt = cursor
                }
                report(idle: true)
                return !link.stopRequested
            },
            onProblem: { problem in logger.warning("pipeline \(spec.name): \(problem)") })
        // The plugins close before the process ends (an analytics spool, a session index, a
        // deferred stage waiting for its last acknowledgements), then the cursor is saved.
        // The state goes with the cursor it reached (while the plugins are still there to give it).
        output.flush()
        completions.drain(seconds: 1)
        report(force: true)
        chain = PluginChain([])
        output.flush()
        completions.drain(seconds: 1)
        report(force: true)
        return 0
    }
}
