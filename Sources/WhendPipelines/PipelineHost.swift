import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import Synchronization
import WhendSystem
import WhendWire

/// The shared pipeline host: one process in which the trusted pipelines (the built-in plugins',
/// and those of plugins configured `isolation.<name> = shared`) run, each on a thread of its
/// own with its own cursor, snapshot and backoff. Each pipeline speaks to its supervisor
/// exactly as a worker process does, on a pair of pipes of its own that whend hands the host
/// over a Unix socket; a pipeline that ends says how (`WorkerMessage.ended`) where a process
/// would exit. One process, not one per pipeline: one copy of Swift's runtime and Foundation,
/// and no process per pipeline to schedule. The price: a crash of any of its plugins, or a
/// pipeline that stops answering, takes the host down, and every pipeline in it restarts from
/// its cursor and snapshot (exactly once and byte-identical to a replay, as after any
/// worker's death). A plugin whend did not build runs in a process of its own unless it is
/// configured otherwise.
package enum PipelineHostProcess {
    /// Where the host, as it starts, finds its socket to whend.
    static let socketDescriptor: Int32 = 3
    /// How long the host waits for its pipelines to stop once asked, before it exits anyway.
    static let stopDeadline: TimeInterval = 5

    /// The host's main: runs each pipeline whend hands it until whend closes the socket (or
    /// SIGTERM), then lets the pipelines stop and exits.
    package static func serve(logger: Logger) -> Never {
        guard let socket = HelperProcess.takeDescriptors([socketDescriptor])?.first else {
            logger.error(
                "whend --pipeline-host: its socket to the daemon cannot be moved: \(String(cString: strerror(errno)))")
            exit(4)
        }
        HelperProcess.stopOnSIGTERM()
        // glibc gives each thread that contends an arena of its own (up to 8 a core), and what
        // each pipeline frees stays in its arena: after a million events the host held 260-285
        // MiB of PSS where four worker processes held 226-232. Two arenas: 232.
        _ = whend_malloc_arena_max(2)
        let running = Atomic<Int>(0)
        // Stopping (SIGTERM, or whend closed the socket): every pipeline finishes its record,
        // saves its cursor and closes its plugins, then the host exits; within a few seconds
        // whatever they do (a plugin stuck in a call would keep an orphan host, whend gone,
        // running for ever, and saving cursors beside a new whend's pipelines if it returned).
        // whend gone (its death makes the host an orphan) ends the host at once, as it ends a
        // worker process: its pipelines must not finish records, save cursors or close plugins
        // beside those of the whend started next, on the same files.
        let parent = getppid()
        Thread {
            while workerStopRequested == 0 {
                if getppid() != parent { _exit(4) }
                Thread.sleep(forTimeInterval: 0.02)
            }
            let deadline = Date().addingTimeInterval(stopDeadline)
            while running.load(ordering: .acquiring) > 0 && Date() < deadline {
                if getppid() != parent { _exit(4) }
                Thread.sleep(forTimeInterval: 0.02)
            }
            if running.load(ordering: .acquiring) > 0 {
                logger.error(
                    "whend --pipeline-host: its pipelines did not stop within \(Int(stopDeadline)) s; exiting without them"
                )
                _exit(4)
            }
            exit(0)
        }.start()
        var descriptors: [Int32] = [-1, -1, -1]
        while true {
            let count = whend_receive_descriptors(socket, &descriptors, 3)
            if count == -1 && errno == EINTR { continue }
            // The end of the stream, or a socket that cannot be read: whend is gone, or stops it.
            guard count >= 0 else { break }
            guard count == 2 else {
                // Not a pipeline's pair: nothing to run on it.
                for fd in descriptors.prefix(Int(count)) { close(fd) }
                continue
            }
            // Above a plugin's reach: received on the lowest free numbers, 3 and 4 among them
            // when a plugin of another pipeline had closed them (it then closed or wrote to this
            // pipeline's pipes to whend).
            let moved = descriptors.prefix(2).map { fcntl($0, F_DUPFD_CLOEXEC, WorkerChannel.lowest) }
            for fd in descriptors.prefix(2) { close(fd) }
            guard moved.allSatisfy({ $0 >= 0 }) else {
                for fd in moved where fd >= 0 { close(fd) }
                continue
            }
            let (report, command) = (moved[0], moved[1])
            running.add(1, ordering: .acquiringAndReleasing)
            let thread = Thread {
                runPipeline(report: report, command: command, logger: logger)
                running.subtract(1, ordering: .acquiringAndReleasing)
            }
            // The plugins' work, not the host's loop: as much stack as a process's main thread.
            thread.stackSize = 8 << 20
            thread.start()
        }
        // whend is gone, or stops the host: its pipelines stop (their pipes are closed too).
        workerStopRequested = 1
        while true { pause() }
    }

    /// One pipeline, from the daemon's first message on its pipes to its last word.
    private static func runPipeline(report: Int32, command: Int32, logger: Logger) {
        let link = WorkerLink(report: report, command: command, exitsProcess: false)
        var frames = WorkerFrameReader()
        let status: Int32
        switch PipelineWorker.readStart(&frames, link) {
        case .success(let (generation, spec)):
            Thread.current.name = "whend-pipe-\(spec.name.prefix(4))"
            status = PipelineWorker.run(spec, generation: generation, frames: frames, link: link, logger: logger)
        case .failure(.closed): status = 4
        case .failure(.notAStart):
            logger.error("whend --pipeline-host: the daemon's first message is not a pipeline to run")
            status = 2
        }
        writeAll(report, WorkerFrame.encode(WorkerMessage.ended(status: UInt64(status))))
        close(report)
        // Else the reader of acknowledgements closes it once whend closes its end.
        if !link.readerStarted.load(ordering: .relaxed) { close(command) }
    }
}

/// whend's side of the shared pipeline host: starts it when a pipeline first needs it, hands it
/// each pipeline's pipes, reaps it, and starts a new one for the next pipeline after it died.
package final class SharedPipelineHost: @unchecked Sendable {
    // Unchecked: `current` is under `lock`; each Life's mutable state under its own condition.
    /// One host process, from its start to its end.
    package final class Life: @unchecked Sendable {
        let pid: pid_t
        fileprivate let socket: Int32
        /// The plugin libraries its pipelines loaded, by path: a file replaced since (an
        /// upgrade) is not loaded again by this process (dlopen answers with what it has).
        fileprivate var libraries: [String: String] = [:]
        private let ended = NSCondition()
        private var exit: String?

        fileprivate init(pid: pid_t, socket: Int32) {
            self.pid = pid
            self.socket = socket
        }

        fileprivate func end(_ how: String) {
            ended.withLock {
                exit = how
                ended.broadcast()
            }
        }

        var isOver: Bool { ended.withLock { exit != nil } }

        /// How the host ended, once it has; nil if it still runs after `seconds`.
        func waitForEnd(seconds: Double) -> String? {
            let deadline = Date().addingTimeInterval(seconds)
            return ended.withLock {
                while exit == nil && ended.wait(until: deadline) {}
                return exit
            }
        }

        /// Kills this host (never a later one: its pid may be another process's by then).
        func kill() {
            ended.withLock { if exit == nil { _ = Glibc.kill(pid, SIGKILL) } }
        }
    }

    private let executable: String
    private let logger: Logger
    private let lock = NIOLock()
    private var current: Life?

    package init(executable: String, logger: Logger) {
        self.executable = executable
        self.logger = logger
    }

    /// Hands a pipeline's pipes (the worker's ends) to the running host, starting one if none
    /// runs; the caller closes its copies. `libraries`: the files of the pipeline's plugins, by
    /// path (`PipelineSpec.libraries`); a host that loaded another file at one of those paths
    /// is retired first. The host that runs it, or why none could.
    func attach(report: Int32, command: Int32, libraries: [String: String]) -> Result<Life, SpawnError> {
        lock.withLock {
            if let running = current, !running.isOver,
                let path = libraries.first(where: { path, file in running.libraries[path].map { $0 != file } ?? false }
                )?.key
            {
                logger.notice(
                    "\(path) changed since the shared pipeline host \(running.pid) loaded it; a new host runs its pipelines"
                )
                retire(running)
            }
            for _ in 0..<2 {
                let life: Life
                if let running = current, !running.isOver {
                    life = running
                } else {
                    // Closed here, under the lock, never while an attach may send on it.
                    if let over = current { close(over.socket) }
                    current = nil
                    switch start() {
                    case .success(let started): life = started
                    case .failure(let error): return .failure(error)
                    }
                    current = life
                }
                let pair = [report, command]
                if pair.withUnsafeBufferPointer({ whend_send_descriptors(life.socket, $0.baseAddress, 2) }) == 0 {
                    life.libraries.merge(libraries) { _, new in new }
                    return .success(life)
                }
                // The host is going (killed, or dying): the next one takes the pipeline.
                life.kill()
                _ = life.waitForEnd(seconds: 5)
            }
            return .failure(SpawnError(code: EPIPE))
        }
    }

    private func start() -> Result<Life, SpawnError> {
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            return .failure(SpawnError(code: errno))
        }
        // Above the descriptor it goes to in the host: the spawn's dup2 onto 3 must not
        // overwrite it.
        var ends = pair
        for i in 0..<2 where ends[i] <= PipelineHostProcess.socketDescriptor {
            ends[i] = fcntl(pair[i], F_DUPFD_CLOEXEC, WorkerFrame.commandDescriptor + 1)
            close(pair[i])
        }
        let spawned = HelperProcess.spawn(
            executable, "--pipeline-host", standardInput: nil,
            descriptors: [(ends[1], PipelineHostProcess.socketDescriptor)])
        close(ends[1])
        switch spawned {
        case .failure(let error):
            close(ends[0])
            return .failure(error)
        case .success(let pid):
            let life = Life(pid: pid, socket: ends[0])
            let thread = Thread { [logger] in
                var status: Int32 = 0
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                let signalled = status & 0x7F
                let how =
                    signalled != 0
                    ? "killed by signal \(signalled)" : "exited with status \((status >> 8) & 0xFF)"
                if signalled != 0 || status != 0 {
                    logger.error("the shared pipeline host \(pid) \(how); its pipelines restart from their cursors")
                }
                life.end(how + " (the shared pipeline host)")
            }
            thread.name = "whend-pipeline-host"
            thread.start()
            logger.info("the shared pipeline host runs as pid \(pid)")
            return .success(life)
        }
    }

    /// Asks `life`'s pipelines to stop (they end, and their supervisors start them again in a
    /// new host) and forgets it; it exits once they have, within `stopDeadline`. Under `lock`.
    private func retire(_ life: Life) {
        shutdown(life.socket, Int32(SHUT_RDWR))
        close(life.socket)
        current = nil
    }

    /// Ends the host once its pipelines were stopped: closes its socket, waits `grace`, then kills.
    package func stop(grace: TimeInterval = 2) {
        lock.withLock {
            guard let life = current else { return }
            shutdown(life.socket, Int32(SHUT_RDWR))
            if life.waitForEnd(seconds: grace) == nil {
                life.kill()
                _ = life.waitForEnd(seconds: 10)
            }
            close(life.socket)
            current = nil
        }
    }
}
