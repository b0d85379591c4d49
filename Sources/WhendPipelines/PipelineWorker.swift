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

        package init(plugin: String, configuration: String, secrets: [String]?) {
            self.plugin = plugin
            self.configuration = configuration
            self.secrets = secrets
        }
    }

    package var name: String
    package var stages: [Stage]
    package var journalDirectory: String
    /// The pipeline's own directory: its cursor and dead letters.
    package var directory: String
    /// Where each plugin keeps its state: `<pluginStateRoot>/<plugin>`.
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

/// Records handled but not finished yet: a deferred stage has not completed them, or whend
/// has not yet stored the records derived from them. The cursor saved stays below the oldest.
package final class CompletionTracker: @unchecked Sendable {
    // Unchecked: guarded by `lock`; completions come from other threads.
    private let lock = NSCondition()
    /// Acknowledgements of derived records each record still waits for.
    private var derived: [UInt64: Int] = [:]
    /// The records in `derived`, in the order accepted (ascending), from `derivedHead` on; some
    /// may be done already (removed from `derived`): the watermark skips them.
    private var derivedOrder: [UInt64] = []
    private var derivedHead = 0
    /// Acknowledgements that came before the worker marked the record accepted.
    private var earlyDerived: [UInt64: Int] = [:]
    /// Records the deferred stage has, in order (from `deferredHead` on), not completed yet.
    private var deferred: [UInt64] = []
    private var deferredHead = 0
    /// Completed one by one out of order, not yet at the head.
    private var completedOutOfOrder: Set<UInt64> = []
    /// Everything up to here is completed (the deferred stage said so with `completeThrough`).
    private var completedThrough: UInt64 = 0

    package init() {}

    /// Record `seq` is done once `derivedCount` acknowledgements have come, and the deferred
    /// stage has completed it if `deferredStage`.
    package func accept(_ seq: UInt64, derivedCount: Int, deferredStage: Bool) {
        lock.withLock {
            if derivedCount > 0 {
                let left = derivedCount - (earlyDerived.removeValue(forKey: seq) ?? 0)
                if left > 0 {
                    derived[seq] = left
                    derivedOrder.append(seq)
                }
            }
            if deferredStage && seq > completedThrough && completedOutOfOrder.remove(seq) == nil {
                deferred.append(seq)
            }
        }
    }

    /// One record derived from `seq` is stored.
    package func derivedStored(_ seq: UInt64) {
        lock.withLock {
            if let left = derived[seq] {
                derived[seq] = left > 1 ? left - 1 : nil
                if derived.isEmpty { lock.broadcast() }
            } else {
                // Bounded: acknowledgements of records never accepted must not grow this.
                if earlyDerived.count >= 1 << 16 { earlyDerived.removeAll() }
                earlyDerived[seq, default: 0] += 1
            }
        }
    }

    /// The deferred stage completed `seq` (in any order).
    package func complete(_ seq: UInt64) {
        lock.withLock {
            guard seq > completedThrough else { return }
            if deferredHead < deferred.count && deferred[deferredHead] == seq {
                deferredHead += 1
                while deferredHead < deferred.count, completedOutOfOrder.remove(deferred[deferredHead]) != nil {
                    deferredHead += 1
                }
                compact()
            } else {
                // Bounded: completions of records never accepted must not grow this.
                if completedOutOfOrder.count >= 1 << 20 { completedOutOfOrder.removeAll() }
                completedOutOfOrder.insert(seq)
            }
        }
    }

    /// The deferred stage completed every record it was given up to `seq`.
    package func completeThrough(_ seq: UInt64) {
        lock.withLock {
            completedThrough = max(completedThrough, seq)
            // Past those completed one by one too: a stage may use both calls, and a record it
            // completed alone just after `seq` left the head there for good (the cursor stuck,
            // retention held back; found by CompletionLedgerTests).
            while deferredHead < deferred.count,
                deferred[deferredHead] <= seq || completedOutOfOrder.remove(deferred[deferredHead]) != nil
            {
                deferredHead += 1
            }
            compact()
        }
    }

    private func compact() {
        if deferredHead == deferred.count {
            deferred.removeAll(keepingCapacity: true)
            deferredHead = 0
            lock.broadcast()
        } else if deferredHead > 4096 && deferredHead * 2 > deferred.count {
            deferred.removeFirst(deferredHead)
            deferredHead = 0
        }
    }

    /// The highest `_seq` up to which everything handled is finished.
    package func watermark(acceptedThrough cursor: UInt64) -> UInt64 {
        lock.withLock {
            var mark = cursor
            // The oldest still waiting: amortised O(1), where `derived.keys.min()` was a scan.
            while derivedHead < derivedOrder.count, derived[derivedOrder[derivedHead]] == nil { derivedHead += 1 }
            if derivedHead == derivedOrder.count {
                derivedOrder.removeAll(keepingCapacity: true)
                derivedHead = 0
            } else if derivedHead > 4096 && derivedHead * 2 > derivedOrder.count {
                derivedOrder.removeFirst(derivedHead)
                derivedHead = 0
            }
            if derivedHead < derivedOrder.count { mark = min(mark, derivedOrder[derivedHead] - 1) }
            if deferredHead < deferred.count { mark = min(mark, deferred[deferredHead] - 1) }
            return mark
        }
    }

    /// Waits until nothing is pending, at most `seconds`.
    func drain(seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        lock.withLock {
            while !(derived.isEmpty && deferredHead == deferred.count) && lock.wait(until: deadline) {}
        }
    }
}

/// Where a worker's frames go and come from once it moved them away from 3 and 4.
enum WorkerChannel {
    /// Above the descriptors a plugin would pick by hand.
    static let lowest: Int32 = 100
}

/// One pipeline run's ends of its pipes to the daemon, and whether it was asked to stop. A
/// worker process has one; the shared pipeline host one per pipeline it runs.
final class WorkerLink: @unchecked Sendable {
    // Unchecked: the descriptors are set once; `stopAsked` is an atomic.
    let report: Int32
    let command: Int32
    /// A worker process exits when the daemon is gone; in the shared host, only the pipeline
    /// ends (the host itself goes when its socket to the daemon closes).
    let exitsProcess: Bool
    private let stopAsked = Atomic<Bool>(false)
    /// The reader of the daemon's acknowledgements started: it closes `command` when the
    /// daemon closes its end (closing it under a blocked read would not wake the read).
    let readerStarted = Atomic<Bool>(false)

    init(report: Int32, command: Int32, exitsProcess: Bool) {
        self.report = report
        self.command = command
        self.exitsProcess = exitsProcess
    }

    /// Asked by the daemon (`stop`), by SIGTERM, or the daemon is gone.
    var stopRequested: Bool { workerStopRequested != 0 || stopAsked.load(ordering: .relaxed) }

    func requestStop() { stopAsked.store(true, ordering: .relaxed) }

    /// The daemon cannot be told anything more: gone (a worker process exits; the shared host
    /// exits within moments, when it sees its parent gone), or done with this pipeline.
    func daemonGone() {
        if exitsProcess { exit(4) }
        requestStop()
    }
}

/// The record a worker is handling, in `PipelineSpec.handlingPath`, mapped shared: one store
/// before and after each record, which whend reads once the worker is gone.
final class HandlingMarker: @unchecked Sendable {
    // Unchecked: written by the worker's thread only.
    private let word: UnsafeMutablePointer<UInt64>?

    init(path: String) {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        defer { if fd >= 0 { close(fd) } }
        // Its page allocated now, not at the first store: on a full file system a store to a
        // mapped hole is a SIGBUS, and the worker died of it. Without a marker, the worker runs
        // as before (its deaths are not put down to a record).
        guard fd >= 0, posix_fallocate(fd, 0, 8) == 0,
            let map = mmap(nil, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), map != MAP_FAILED
        else {
            word = nil
            return
        }
        word = map.bindMemory(to: UInt64.self, capacity: 1)
        word?.pointee = 0
    }

    deinit { if let word { munmap(word, 8) } }

    func set(_ seq: UInt64) { word?.pointee = seq }

    /// What a worker that is gone left in `path`: the record it was handling, or 0.
    static func read(_ path: String) -> UInt64 {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return 0 }
        defer { close(fd) }
        var value: UInt64 = 0
        return pread(fd, &value, 8, 0) == 8 ? value : 0
    }
}

/// Set by SIGTERM in a worker process or the shared host; read between records.
nonisolated(unsafe) var workerStopRequested: sig_atomic_t = 0

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
                report(idle: true)
                // Memory the plugins freed goes back to the system once in a while: glibc keeps a
                // freed heap's pages (sessions forgotten, batches sent), and after a burst a
                // worker held a third more than its state (crashes: 89 → 60 MiB of PSS).
                if policy.trimDue(now: monotonicSeconds(), handledSince: cursor != trimmedAt) {
                    _ = whend_malloc_trim(0)
                    trimmedAt = cursor
                }
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

/// The worker's side of the pipes to the daemon: derived records gathered into batches, and
/// the batches sent and not yet acknowledged.
final class WorkerOutput: @unchecked Sendable {
    // Unchecked: `cause`, `emitted`, `oversized` and `pending` belong to the worker's thread
    // (plugins emit from inside handle); `unacknowledged` and `nextBatch` are guarded by `lock`,
    // since acknowledgements come on the reading thread.
    @exclusivity(unchecked) var cause: UInt64 = 0
    /// Derived records emitted for the current record.
    @exclusivity(unchecked) var emitted = 0
    /// Bytes the current record derived when they cannot go to whend in one frame: then none
    /// of them goes, and the record goes to the dead letters.
    @exclusivity(unchecked) private(set) var oversized: Int?
    @exclusivity(unchecked) private var pending = DerivedBatchFrame()
    var pendingBytes: Int { pending.isEmpty ? 0 : pending.byteCount }
    private let lock = NSLock()
    private var unacknowledged: [UInt64: [UInt64]] = [:]
    private var nextBatch: UInt64 = 1
    private let completions: CompletionTracker
    private let link: WorkerLink

    init(completions: CompletionTracker, link: WorkerLink) {
        self.completions = completions
        self.link = link
    }

    func progress(cursor: UInt64, failures: Int, deadLetters: Int, skipped: UInt64) {
        send(
            WorkerFrame.encode(
                WorkerMessage.progress(
                    cursor: cursor, failures: UInt64(failures), deadLetters: UInt64(deadLetters), skipped: skipped)))
    }

    func counters(plugin: String, _ values: [String: Int64]) {
        send(WorkerFrame.encode(WorkerMessage.counters(plugin: plugin, values: values)))
    }

    /// What plugins emit from now on is derived from record `seq`.
    func begin(_ seq: UInt64) {
        cause = seq
        emitted = 0
        oversized = nil
        pending.beginRecord()
    }

    /// A derived record, for the daemon to append with `_origin` and `_cause` as the plugin
    /// wrote it (the daemon checks it). Fails once what the current record derived cannot go to
    /// the daemon in one frame.
    func emit(_ json: UnsafeBufferPointer<UInt8>, origin: String) -> Bool {
        if let bytes = oversized {
            oversized = bytes + json.count
            return false
        }
        if !pending.fits(origin: origin, count: json.count) && pending.holdsEarlierRecords {
            // The records of earlier records go first, in a frame of their own.
            let current = pending.takeCurrentRecord()
            flush()
            pending.restoreCurrentRecord(current)
        }
        guard pending.fits(origin: origin, count: json.count) else {
            // All or nothing: a record's derived records are stored together, or not at all.
            oversized = pending.currentRecordBytes + json.count
            _ = pending.takeCurrentRecord()
            emitted = 0
            return false
        }
        pending.append(cause: cause, origin: origin, json: json)
        emitted += 1
        return true
    }

    /// Forgets what the current record derived so far (its attempt failed).
    func discardCurrentRecord() {
        if oversized == nil { _ = pending.takeCurrentRecord() }
        oversized = nil
        emitted = 0
    }

    /// Sends what was derived since the last flush as one batch.
    func flush() {
        guard !pending.isEmpty else { return }
        let batch: UInt64 = lock.withLock {
            defer { nextBatch += 1 }
            unacknowledged[nextBatch] = pending.causes
            return nextBatch
        }
        let frame = pending.finish(batch: batch)
        // The daemon is gone: nothing to report to.
        if frame.withUnsafeBytes({ writeFully(link.report, $0) }) != nil { link.daemonGone() }
        pending.reset()
    }

    /// The daemon stored `batch`: the records it came from may be passed.
    func stored(batch: UInt64) {
        let causes = lock.withLock { unacknowledged.removeValue(forKey: batch) } ?? []
        for cause in causes { completions.derivedStored(cause) }
    }

    func send(_ frame: [UInt8]) {
        // The daemon is gone: nothing to report to.
        if !writeAll(link.report, frame) { link.daemonGone() }
    }
}
