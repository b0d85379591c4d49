import CLinux
import Foundation
import Logging
import WhendJournal
import WhendPluginHost
import WhendSystem

/// A running pipeline's reading loop: each record through the chain, then the periodic work
/// `CheckpointPolicy` says is due (derived records to whend, plugins' flush, cursor, snapshot,
/// progress).
///
/// Its state is one value, changed through its own methods, rather than variables captured by
/// the reader's closures: Swift checks every access to a captured variable at run time, and
/// those checks (some sixty per record) and the loop around them cost a pipeline a tenth of
/// its time in the end-to-end benchmark.
struct WorkerLoop {
    let spec: PipelineSpec
    let output: WorkerOutput
    let completions: CompletionTracker
    let handling: HandlingMarker
    let link: WorkerLink
    let logger: Logger
    /// Whether the chain's last stage completes records itself, later (`deferred`).
    let deferred: Bool
    let keepsState: Bool
    var chain: PluginChain

    /// The last record handled.
    var cursor: UInt64
    var savedCursor: UInt64
    var snapshotCursor: UInt64
    var policy: CheckpointPolicy
    /// The `_seq` the next record should have; nil before the pipeline's first.
    var expected: UInt64?
    var skipped: UInt64 = 0
    var failures = 0
    var deadLetters = 0
    /// The records through which the plugins' held effects are durable (`chain.flush()`).
    var flushedThrough: UInt64
    var flushFailure: String?
    var lastProgressCursor: UInt64
    /// The cursor at which the worker last gave freed memory back.
    var trimmedAt: UInt64
    /// What the daemon was last told of each stage's counters.
    var countersSent: [String: [String: Int64]] = [:]
    /// The last `_seq` the journal stored, as whend tells it (`PipelineSpec.storedThroughPath`).
    let storedThrough: SharedWord?

    init(
        spec: PipelineSpec, chain: PluginChain, deferred: Bool, keepsState: Bool, cursor: UInt64,
        expected: UInt64?, output: WorkerOutput, completions: CompletionTracker, handling: HandlingMarker,
        link: WorkerLink, logger: Logger
    ) {
        self.spec = spec
        self.chain = chain
        self.deferred = deferred
        self.keepsState = keepsState
        self.cursor = cursor
        self.expected = expected
        self.output = output
        self.completions = completions
        self.handling = handling
        self.link = link
        self.logger = logger
        savedCursor = cursor
        snapshotCursor = cursor
        flushedThrough = cursor
        lastProgressCursor = cursor
        trimmedAt = cursor
        policy = CheckpointPolicy(snapshotInterval: spec.snapshotInterval, now: coarseMonotonicSeconds())
        storedThrough = spec.storedThroughPath.flatMap(SharedWord.open)
    }

    /// Called after every record; the work is done as `CheckpointPolicy` says. The cursor saved
    /// is below the oldest record not finished (a deferred stage's, or one whose derived records
    /// whend has not stored yet). `idle`: nothing more to read for now, so what is held is
    /// flushed and the progress told at once rather than at the next tick (an idle worker's
    /// cursor must not lag).
    mutating func report(force: Bool = false, idle: Bool = false) {
        let now = coarseMonotonicSeconds()
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
            flushed = flushPlugins()
        }
        if snapshotDue && flushed { snapshot(now: now) }
        // Not after every record: the watermark takes the completions' lock.
        guard saveDue || idle || policy.progressDue(now: now, force: force, idle: false, moved: false) else {
            return
        }
        let durable = min(completions.watermark(acceptedThrough: cursor), flushedThrough)
        let progressDue = policy.progressDue(
            now: now, force: force, idle: idle, moved: durable != lastProgressCursor)
        if saveDue, durable != savedCursor {
            do {
                try PipelineWorker.save(durable, to: spec.cursorPath)
                savedCursor = durable
                PipelineWorker.killPoint(.cursorSaved, spec)
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

    /// Asks the plugins to make what they hold durable; false when one could not.
    private mutating func flushPlugins() -> Bool {
        do {
            try chain.flush()
            flushedThrough = cursor
            if flushFailure != nil {
                logger.notice("pipeline \(spec.name): its plugins flush again")
                flushFailure = nil
            }
            return true
        } catch {
            // Said once per kind of failure, not every tenth of a second.
            if flushFailure != error.description {
                logger.error("pipeline \(spec.name): \(error); its cursor stays before the records it holds")
                flushFailure = error.description
            }
            return false
        }
    }

    private mutating func snapshot(now: Double) {
        policy.snapshotBegun(now: now)
        // What it takes, to the clock's full resolution: a snapshot of a few milliseconds is
        // one tick of `now`'s, or none.
        let started = monotonicSeconds()
        // The state goes with a cursor only when every record handled is finished: its
        // derived records stored, the deferred stage done. Wait for that, briefly.
        output.flush()
        policy.outputSent(now: now)
        if completions.watermark(acceptedThrough: cursor) != cursor { completions.drain(seconds: 2) }
        guard completions.watermark(acceptedThrough: cursor) == cursor else { return }
        do {
            let spec = spec
            try PipelineWorker.takeSnapshot(chain, cursor: cursor).save(to: spec.snapshotPath) {
                PipelineWorker.killPoint(.writingSnapshot, spec)
            }
            PipelineWorker.killPoint(.snapshotSaved, spec)
            snapshotCursor = cursor
            policy.snapshotSaved(started: started, finished: monotonicSeconds())
        } catch {
            logger.error("pipeline \(spec.name): its plugins' state was not saved: \(error)")
        }
    }

    /// A record the journal has written and not yet stored (under `durability = fsync`, not
    /// synced): a power cut may still take it, and a cursor or a snapshot saved past it would
    /// then claim a record the journal does not hold, and skip the one that takes its `_seq`
    /// next. Waits until whend has stored it (a sync, a few milliseconds), telling whend of its
    /// progress meanwhile; false if asked to stop first.
    private mutating func waitUntilStored(_ seq: UInt64, _ storedThrough: SharedWord) -> Bool {
        while seq > storedThrough.value {
            guard !link.stopRequested else { return false }
            report()
            usleep(250)
        }
        return true
    }

    /// One record through the chain; false to stop reading.
    mutating func handle(_ record: JournalRecord) -> Bool {
        guard !link.stopRequested else { return false }
        guard let seq = record.seq, seq > cursor else { return true }
        if let storedThrough, seq > storedThrough.value, !waitUntilStored(seq, storedThrough) { return false }
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
                try PipelineWorker.deadLetter(record.line, seq: seq, why: why, to: spec.deadLetterPath)
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
            guard case .rejected(let why) = outcome else { break }
            // What an attempt that failed derived is not stored: only the attempt that
            // passes the record derives, as a run without the failure would.
            output.discardCurrentRecord()
            attempt += 1
            failures += 1
            if oversized != nil || (spec.retryLimit > 0 && attempt >= spec.retryLimit) {
                do {
                    try PipelineWorker.deadLetter(record.line, seq: seq, why: why, to: spec.deadLetterPath)
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
        }
        cursor = seq
        // What fails from here (a plugin's flush) is not this record's doing.
        handling.set(0)
        report()
        return true
    }

    /// Nothing more to read for now; false to stop reading.
    mutating func caughtUp() -> Bool {
        // What was derived goes to whend at once.
        if output.pendingBytes > 0 {
            output.flush()
            policy.outputSent(now: coarseMonotonicSeconds())
        }
        // Memory the plugins freed goes back to the system once in a while: glibc keeps a
        // freed heap's pages (sessions forgotten, batches sent), and after a burst a
        // worker held a third more than its state (crashes: 89 → 60 MiB of PSS). Before
        // the progress that says the pipeline caught up: by then it is given back.
        if policy.trimDue(now: coarseMonotonicSeconds(), handled: cursor > trimmedAt ? cursor - trimmedAt : 0) {
            _ = whend_malloc_trim(0)
            trimmedAt = cursor
        }
        report(idle: true)
        return !link.stopRequested
    }

    /// The plugins close before the process ends (an analytics spool, a session index, a
    /// deferred stage waiting for its last acknowledgements), then the cursor is saved. The
    /// state goes with the cursor it reached (while the plugins are still there to give it).
    mutating func finish() {
        output.flush()
        completions.drain(seconds: 1)
        report(force: true)
        chain = PluginChain([])
        output.flush()
        completions.drain(seconds: 1)
        report(force: true)
    }
}
