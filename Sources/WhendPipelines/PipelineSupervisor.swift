import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendSystem
import WhendWire

/// Runs one pipeline's worker process and keeps it running: restarts it with backoff when it
/// exits or crashes, and kills and restarts it when it stops reporting (its watchdog). The
/// worker resumes from its durable cursor, so a restart loses nothing.
package final class PipelineSupervisor: @unchecked Sendable {
    // Unchecked: mutable state is in `state`, under its lock; the rest is set once.

    package let spec: PipelineSpec
    /// Deaths of the shared host in a row, none charged to a record, after which a pipeline
    /// runs in a process of its own for `ownProcessPeriod`.
    static let hostDeathsBeforeOwnProcess = 3
    static let ownProcessPeriod: TimeInterval = 600
    /// The shared host this pipeline runs in; nil: a worker process of its own.
    let host: SharedPipelineHost?
    /// The host running the current worker (shared pipelines only).
    private let hostLife = NIOLockedValueBox<SharedPipelineHost.Life?>(nil)
    /// How the current worker said it ended (shared pipelines only).
    let ended = NIOLockedValueBox<UInt64?>(nil)
    private let executable: String
    private let watchdog: TimeInterval
    let logger: Logger
    /// The last `_seq` the journal has written (synced or not): no worker can have read, and so
    /// derived from, a later record.
    let journalWrittenThrough: @Sendable () -> UInt64
    /// Appends derived records as one journal batch, then says whether they were stored.
    let appendDerived: @Sendable (_ records: [DerivedRecord], _ stored: @escaping @Sendable (Bool) -> Void) -> Void
    /// Where the current worker hears that its derived records are stored (its standard input),
    /// and its generation. Read, written and closed only on `acknowledgementQueue`.
    nonisolated(unsafe) private var acknowledgements: (fd: Int32, generation: UInt64) = (-1, 0)
    private let acknowledgementQueue = DispatchQueue(label: "whend-pipeline-acks")
    package let state = NIOLockedValueBox(State())
    private let finished = DispatchSemaphore(value: 0)
    /// Signalled by `stop()`: a supervisor waiting out its restart backoff stops at once.
    private let stopSignal = DispatchSemaphore(value: 0)

    package init(
        spec: PipelineSpec, host: SharedPipelineHost?, executable: String, watchdog: TimeInterval, logger: Logger,
        journalWrittenThrough: @escaping @Sendable () -> UInt64,
        appendDerived: @escaping @Sendable ([DerivedRecord], @escaping @Sendable (Bool) -> Void) -> Void
    ) {
        self.spec = spec
        self.host = host
        self.executable = executable
        self.watchdog = watchdog
        self.logger = logger
        self.journalWrittenThrough = journalWrittenThrough
        self.appendDerived = appendDerived
        state.withLockedValue { $0.cursor = PipelineSpec.savedCursor(at: spec.cursorPath) }
    }

    package func start() {
        let thread = Thread { [self] in
            recallDerived()
            supervise()
        }
        thread.name = "whend-pipeline-\(spec.name)"
        thread.start()
    }

    /// What this pipeline derived from records after its saved cursor, from the journal (the
    /// daemon may have been killed after appending them and before the worker saved its
    /// cursor): the worker will derive them again, and they must not be appended twice.
    private func recallDerived() {
        let cursor = PipelineSpec.savedCursor(at: spec.cursorPath)
        let last = lastDerived(after: cursor)
        // Everything derived from records up to the cursor is stored (the cursor passes a
        // record only then): a worker that resumes from an older snapshot, or rebuilds its
        // plugins' state from further back, derives them again, and they are not appended.
        state.withLockedValue { if (cursor, Int.max) > $0.appendedThrough { $0.appendedThrough = (cursor, Int.max) } }
        if last.cause > 0 {
            state.withLockedValue { if last > $0.appendedThrough { $0.appendedThrough = last } }
            logger.notice(
                "pipeline \(spec.name): records after its cursor \(cursor) already have their derived records, through _cause \(last.cause)"
            )
        }
        state.withLockedValue { $0.storedThrough = $0.appendedThrough }
    }

    /// The last record in the journal this pipeline derived from a record after `cursor`, as
    /// (its cause, its ordinal among that cause's).
    private func lastDerived(after cursor: UInt64) -> (cause: UInt64, ordinal: Int) {
        var marker = Array(#""_pipeline":"#.utf8)
        appendJSONString(Array(spec.name.utf8), to: &marker)
        var last: (cause: UInt64, ordinal: Int) = (0, 0)
        JournalReader(directory: JournalDirectory(path: spec.journalDirectory)).read(fromSeq: cursor + 1) {
            record, _ in
            // whend's own scanner, not Foundation's: a record Foundation refuses (an unpaired
            // surrogate's escape, 1e999) skipped here was appended again after every restart.
            // memmem: a plain search here was 12 % of whend's CPU while four pipelines far
            // behind (their state removed, a journal of 1.4M records) looked at start.
            guard record.line.count >= marker.count,
                marker.withUnsafeBytes({
                    whend_memmem(record.line.baseAddress, record.line.count, $0.baseAddress, $0.count) != nil
                }), let fields = try? record.fields(),
                fields.pipeline == Array(spec.name.utf8), let cause = fields.cause, cause > cursor
            else { return true }
            // A cause at or after the record itself, or from no stage of the pipeline, was forged
            // (stored before whend checked what workers send): believed, it would have every
            // later derived record taken for one already appended.
            let origin = fields.origin.map { String(decoding: $0, as: UTF8.self) }
            guard let seq = record.seq, cause < seq, spec.origins?.contains(origin ?? "") ?? true else {
                logger.error(
                    "pipeline \(spec.name): _seq \(record.seq ?? 0) claims to be derived from _seq \(cause) by \(origin ?? "nothing"), which it cannot be; it is not taken into account"
                )
                return true
            }
            guard cause >= last.cause else { return true }
            last = cause == last.cause ? (cause, last.ordinal + 1) : (cause, 1)
            return true
        } onProblem: { _ in
        }
        return last
    }

    /// After a batch was not stored, the next worker must derive its records again and have
    /// them appended: once every batch in the journal's hands is answered, what counts as
    /// appended goes back to what is known stored. A failed write may still have left the first
    /// records of its group in the journal (recovery keeps what was written whole), and those are
    /// then appended twice: at least once, never skipped. (The journal cannot be asked which
    /// they are before its recovery, which the next write does.)
    private func rewindAfterFailedStore() {
        guard state.withLockedValue({ $0.failedGeneration != nil }) else { return }
        while state.withLockedValue({ $0.appending > 0 && !$0.stopping }) { usleep(10_000) }
        state.withLockedValue {
            $0.appendedThrough = $0.storedThrough
            $0.failedGeneration = nil
        }
    }

    /// Tells the worker of `generation` that its derived records of `batch` are stored: only
    /// then may its cursor pass their causes. Written off the journal's thread, in order, on the
    /// queue that also closes the descriptor: an acknowledgement for a worker that is gone is
    /// dropped, never written to a closed descriptor or to its successor.
    func acknowledge(generation: UInt64, batch: UInt64) {
        acknowledgementQueue.async { [self] in
            let (fd, current) = acknowledgements
            guard fd >= 0, current == generation else { return }
            // A worker that died: the next one starts from its cursor.
            writeAll(fd, WorkerFrame.encode(SupervisorMessage.stored(generation: generation, batch: batch)))
        }
    }

    /// Asks the worker to stop (SIGTERM, then SIGKILL after `grace`) and waits for it.
    package func stop(grace: TimeInterval = 2) {
        state.withLockedValue { $0.stopping = true }
        askToStop()
        stopSignal.signal()
        // In the shared host, killing it stops every pipeline there: a plugin closing slowly
        // (analytics waits out a delivery under way) is given as long as a silent one.
        let wait = hostLife.withLockedValue({ $0 }) != nil ? max(grace, watchdog) : grace
        if finished.wait(timeout: .now() + wait) == .timedOut {
            killWorker(why: "it did not stop within \(Int(wait)) s")
            finished.wait()
        }
    }

    /// Stops the worker; the supervisor starts it again from its cursor.
    package func restart() {
        state.withLockedValue {
            $0.excused = true
            $0.restartAsked = true
        }
        if hostLife.withLockedValue({ $0 }) == nil { killWorker(why: nil) } else { askToStop() }
    }

    /// The worker finishes its record, saves its cursor and ends: SIGTERM for a process, a
    /// `stop` message in the shared host (which runs other pipelines).
    private func askToStop() {
        if hostLife.withLockedValue({ $0 }) != nil {
            acknowledgementQueue.async { [self] in
                guard acknowledgements.fd >= 0 else { return }
                writeAll(acknowledgements.fd, WorkerFrame.encode(SupervisorMessage.stop))
                // Told: the next worker is not to be stopped for it.
                state.withLockedValue { $0.restartAsked = false }
            }
        } else {
            let pid = state.withLockedValue { $0.pid }
            if pid > 0 { kill(pid, SIGTERM) }
        }
    }

    /// Kills the current worker at once. In the shared host, that is the host, and every
    /// pipeline in it restarts from its cursor: `why` is logged.
    func killWorker(why: String?) {
        if let life = hostLife.withLockedValue({ $0 }) {
            if let why {
                logger.error(
                    "pipeline \(spec.name): \(why); killing the shared pipeline host \(life.pid) (its other pipelines restart from their cursors too)"
                )
            }
            life.kill()
        } else {
            let pid = state.withLockedValue { $0.pid }
            if pid > 0 { kill(pid, SIGKILL) }
        }
    }

    private func supervise() {
        var backoff = RestartBackoff()
        while !state.withLockedValue({ $0.stopping }) {
            let started = Date()
            let cursorBefore = state.withLockedValue { $0.cursor }
            let (exit, inHost) = runWorkerOnce()
            let (stopping, cursorAfter) = state.withLockedValue {
                $0.running = false
                $0.pid = 0
                $0.lastExit = exit
                return ($0.stopping, $0.cursor)
            }
            if stopping { break }
            let asked = state.withLockedValue { s in
                // A good while in the host: its deaths before are no longer "in a row".
                if inHost, Date().timeIntervalSince(started) > RestartBackoff.goodRun { s.hostDeaths = 0 }
                return s.excused
            }
            countDeath(exit, inHost: inHost)
            let wait = backoff.wait(
                after: .init(
                    ranFor: Date().timeIntervalSince(started), movedOn: cursorAfter > cursorBefore, asked: asked,
                    withTheHost: inHost))
            // A worker that stopped cleanly was asked to (a restart, a record passed in a process
            // of its own, a host retired for an upgraded library): news, not an error.
            let said = "pipeline \(spec.name): worker \(exit); restarting in \(String(format: "%.1f", wait)) s"
            if exit == "exited with status 0" { logger.notice("\(said)") } else { logger.error("\(said)") }
            state.withLockedValue { $0.restarts += 1 }
            // Not a plain sleep: a stop must not wait out a backoff of up to 10 s.
            if stopSignal.wait(timeout: .now() + wait) == .success { break }
        }
        finished.signal()
    }

    /// A worker that died while handling a record: the same record `retryLimit` times in a row
    /// (its cursor never passing it) and the next workers write it to the dead letters rather
    /// than die on it for ever. (With `retryLimit` 0, they try for ever, as with any failure.)
    private func countDeath(_ exit: String, inHost: Bool) {
        let seq = HandlingMarker.read(spec.handlingPath)
        if inHost {
            // Any plugin of the host may have killed it: no record is charged with the death,
            // and the one in hand is handled next in a process of this pipeline's own.
            let (quarantined, isolated): (UInt64?, Bool) = state.withLockedValue { s in
                defer { s.excused = false }
                guard !s.excused else { return (nil, false) }
                // A plugin that crashes the host with no record in hand (a thread of its own, its
                // create) is never caught by a record: after a few deaths in a row, every
                // pipeline of the host runs alone for a while, the culprit crashing only itself.
                s.hostDeaths += 1
                if s.hostDeaths >= Self.hostDeathsBeforeOwnProcess {
                    s.hostDeaths = 0
                    s.ownProcessUntil = Date().addingTimeInterval(Self.ownProcessPeriod)
                    return (nil, true)
                }
                guard seq > 0, seq > s.cursor, s.quarantine == nil else { return (nil, false) }
                s.quarantine = seq
                return (seq, false)
            }
            if let seq = quarantined {
                logger.error(
                    "pipeline \(spec.name): the shared pipeline host died while it handled _seq \(seq); it handles that record in a process of its own, and goes back to the host once past it"
                )
            }
            if isolated {
                logger.error(
                    "pipeline \(spec.name): the shared pipeline host died \(Self.hostDeathsBeforeOwnProcess) times in a row while it ran there; it runs in a process of its own for \(Int(Self.ownProcessPeriod / 60)) minutes"
                )
            }
            return
        }
        let poisoned: (UInt64, Int)? = state.withLockedValue { s in
            if let poison = s.poison, s.cursor >= poison.seq { s.poison = nil }
            defer { s.excused = false }
            guard seq > 0, seq > s.cursor, !s.excused else {
                s.deaths = (0, 0)
                return nil
            }
            s.deaths = s.deaths.seq == seq ? (seq, s.deaths.count + 1) : (seq, 1)
            guard spec.retryLimit > 0, s.deaths.count >= spec.retryLimit, s.poison?.seq != seq else { return nil }
            s.poison = (seq, "the worker died \(s.deaths.count) times handling it (last: \(exit))")
            return (seq, s.deaths.count)
        }
        if let (seq, count) = poisoned {
            logger.error(
                "pipeline \(spec.name): its worker died \(count) times handling _seq \(seq) (pipeline_retry_limit \(spec.retryLimit)); the next one writes it to the dead letters and goes on"
            )
        }
    }

    /// Starts the worker, reads its reports until it exits, and says how it ended.
    private func runWorkerOnce() -> (String, inHost: Bool) {
        var fds: [Int32] = [0, 0]
        guard framePipe(&fds) else { return ("could not start (pipe: \(String(cString: strerror(errno))))", false) }
        var ackFds: [Int32] = [0, 0]
        guard framePipe(&ackFds) else {
            close(fds[0])
            close(fds[1])
            return ("could not start (pipe: \(String(cString: strerror(errno))))", false)
        }
        rewindAfterFailedStore()
        // The spec goes over the worker's command pipe, never on its command line: it holds
        // plugin configuration, secrets included, and /proc/PID/cmdline is readable by all. The
        // frames have descriptors of their own (standard output is whend's log).
        let spawned: Result<pid_t, SpawnError>
        ended.withLockedValue { $0 = nil }
        let quarantined = state.withLockedValue { s -> Bool in
            if let seq = s.quarantine, s.cursor >= seq { s.quarantine = nil }
            if let until = s.ownProcessUntil, Date() >= until { s.ownProcessUntil = nil }
            return s.quarantine != nil || s.ownProcessUntil != nil
        }
        if let host, !quarantined {
            spawned = host.attach(report: fds[1], command: ackFds[0], libraries: spec.libraries ?? [:]).map { life in
                hostLife.withLockedValue { $0 = life }
                return life.pid
            }
        } else {
            spawned = HelperProcess.spawn(
                executable, "--pipeline-worker", standardInput: nil,
                descriptors: [(fds[1], WorkerFrame.reportDescriptor), (ackFds[0], WorkerFrame.commandDescriptor)])
        }
        close(fds[1])
        close(ackFds[0])
        let pid: pid_t
        switch spawned {
        case .success(let started): pid = started
        case .failure(let error):
            close(fds[0])
            close(ackFds[1])
            return ("could not start (\(error))", false)
        }
        let (generation, failed) = state.withLockedValue {
            $0.pid = pid
            $0.running = true
            $0.lastReport = Date()
            $0.runCause = 0
            $0.runOrdinal = 0
            $0.generation += 1
            $0.countersBefore = $0.countersSinceStart
            $0.counters = [:]
            $0.failuresBefore = $0.failures
            $0.deadLettersBefore = $0.deadLetters
            return ($0.generation, $0.failedGeneration != nil)
        }
        // A batch failed after the rewind above: this worker would take its records for
        // appended. The next one starts after the rewind.
        if failed { killWorker(why: "derived records were not stored") }
        var told = spec
        if let poison = state.withLockedValue({ $0.poison }) {
            told.poison = poison.seq
            told.poisonReason = poison.why
        }
        let start = SupervisorMessage.start(
            generation: generation, spec: Array((try? JSONEncoder().encode(told)) ?? Data()))
        acknowledgementQueue.sync {
            acknowledgements = (ackFds[1], generation)
            writeAll(ackFds[1], WorkerFrame.encode(start))
            // A stop asked while the worker started found no one to tell.
            if hostLife.withLockedValue({ $0 }) != nil,
                state.withLockedValue({ s in
                    defer { s.restartAsked = false }
                    return s.stopping || s.restartAsked
                })
            {
                writeAll(ackFds[1], WorkerFrame.encode(SupervisorMessage.stop))
            }
        }
        let watchdogTimer = DispatchSource.makeTimerSource(queue: .global())
        watchdogTimer.schedule(deadline: .now() + 1, repeating: 1)
        watchdogTimer.setEventHandler { [self] in
            let silent = state.withLockedValue { Date().timeIntervalSince($0.lastReport) }
            if silent > watchdog {
                if hostLife.withLockedValue({ $0 }) == nil {
                    logger.error("pipeline \(spec.name): worker \(pid) silent for \(Int(silent)) s; killing it")
                }
                killWorker(why: "silent for \(Int(silent)) s")
            }
        }
        watchdogTimer.resume()
        readReports(from: fds[0], generation: generation)
        watchdogTimer.cancel()
        close(fds[0])
        // On the queue that writes to it: acknowledgements queued after this are dropped.
        acknowledgementQueue.sync {
            acknowledgements = (-1, 0)
            close(ackFds[1])
        }
        if let host = hostLife.withLockedValue({ $0 }) {
            defer { hostLife.withLockedValue { $0 = nil } }
            if let status = ended.withLockedValue({ $0 }) { return ("exited with status \(status)", false) }
            // Its pipes closed without a last word: the host died, or is broken.
            if let how = host.waitForEnd(seconds: 5) { return (how, true) }
            killWorker(why: "its pipes closed without a word from it")
            return (host.waitForEnd(seconds: 30) ?? "lost (the shared pipeline host \(host.pid) would not die)", true)
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let signalled = status & 0x7F
        if signalled != 0 { return ("killed by signal \(signalled)", false) }
        return ("exited with status \((status >> 8) & 0xFF)", false)
    }

    /// A pipe whose ends leak into no other child and sit above the worker's frame descriptors,
    /// so that the spawn's dup2 onto those cannot overwrite one end with the other.
    private func framePipe(_ fds: inout [Int32]) -> Bool {
        guard pipe(&fds) == 0 else { return false }
        for i in 0..<2 {
            if fds[i] <= WorkerFrame.commandDescriptor {
                let moved = fcntl(fds[i], F_DUPFD_CLOEXEC, WorkerFrame.commandDescriptor + 1)
                let e = errno
                close(fds[i])
                fds[i] = moved
                guard moved >= 0 else {
                    close(fds[1 - i])
                    errno = e
                    return false
                }
            } else {
                _ = fcntl(fds[i], F_SETFD, FD_CLOEXEC)
            }
        }
        return true
    }

}
