import CLinux
import Foundation
import WhendConfiguration
import WhendSystem
import WhendWire

/// Starts a process of whend's own that runs plugin code (a pipeline worker, the shared host,
/// the plugin check): the same executable, one argument, whend's environment less what speaks
/// to the service manager (the child is not the service), a backtracer that prints no registers
/// (they may hold a plugin's secrets), standard output joined to whend's standard error (what a
/// plugin prints goes to the log), and no descriptor of whend's but those named.
enum HelperProcess {
    /// - Parameters:
    ///   - standardInput: the descriptor that becomes the child's standard input; nil for
    ///     /dev/null.
    ///   - descriptors: each (whend's descriptor, the child's number for it).
    /// - Returns: the child's pid, or the `posix_spawn` error.
    static func spawn(
        _ executable: String, _ argument: String, standardInput: Int32?, descriptors: [(Int32, Int32)]
    ) -> Result<pid_t, SpawnError> {
        var environment = ProcessInfo.processInfo.environment
        for key in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
            environment[key] = nil
        }
        environment["SWIFT_BACKTRACE"] = Secrets.backtraceSetting(environment["SWIFT_BACKTRACE"])
        return spawnProcess(executable, [argument], environment: environment) { actions in
            if let standardInput {
                posix_spawn_file_actions_adddup2(&actions, standardInput, 0)
            } else {
                posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            }
            posix_spawn_file_actions_adddup2(&actions, 2, 1)
            for (source, target) in descriptors { posix_spawn_file_actions_adddup2(&actions, source, target) }
            // 3 and 4 are taken from the first instruction on: the runtime opens its event poll
            // and wakeup descriptors as the child starts, and on a free 4 `takeDescriptors`
            // put /dev/null over them (the check died of a trap when the runtime next polled).
            for target in PluginDescriptors.null where !descriptors.contains(where: { $0.1 == target }) {
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_RDWR, 0)
            }
            // Nothing else of the daemon's: an inherited client or control connection would stay
            // open in the child after the daemon closed it, and its peer would never see the end.
            _ = whend_spawn_file_actions_addclosefrom(
                &actions, max(PluginDescriptors.null.max()!, descriptors.map(\.1).max() ?? 2) + 1)
        }
    }
}

extension HelperProcess {
    /// The child's side, before any plugin is loaded (a worker, the shared host, the plugin
    /// check): a Ctrl-C in whend's terminal is whend's to act on (it stops its helpers itself),
    /// a reader gone is an error, not a death; the daemon's descriptors `taken` (on 3 and 4)
    /// move above a plugin's reach, close-on-exec (a process a plugin starts must not hold them
    /// after the helper is gone), and 3 and 4 become /dev/null: a plugin that writes to, reads
    /// from or closes its own idea of a free descriptor reaches nothing of the daemon's.
    /// - Returns: where each of `taken` now is, in order; nil if they could not be moved.
    static func takeDescriptors(_ taken: [Int32]) -> [Int32]? {
        signal(SIGPIPE, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        let moved = taken.map { fcntl($0, F_DUPFD_CLOEXEC, WorkerChannel.lowest) }
        let null = open("/dev/null", O_RDWR | O_CLOEXEC)
        guard !moved.contains(where: { $0 < 0 }), null >= 0 else { return nil }
        // Both are this process's since `spawn`: whatever the runtime opened is above them.
        for fd in PluginDescriptors.null { dup2(null, fd) }
        close(null)
        PluginDescriptors.guarding.store(true, ordering: .relaxed)
        return moved
    }

    /// SIGTERM (whend stopping the helper) sets `workerStopRequested`: the record in hand is
    /// finished, the cursor saved, the plugins closed. whend's blocked signals are inherited
    /// across exec, so it is unblocked first.
    static func stopOnSIGTERM() {
        TerminationSignals.unblock([SIGTERM])
        signal(SIGTERM) { _ in workerStopRequested = 1 }
    }
}

/// How whend and its pipeline processes have glibc's malloc keep memory.
package enum MallocTuning {
    /// Blocks of this size or more are mapped, and unmapped when freed, each on its own.
    static let mmapThreshold: Int32 = 1 << 20
    /// An arena's free top past this goes back to the system as it is freed.
    static let trimThreshold: Int32 = 1 << 20

    /// glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB),
    /// and its trim threshold to twice that: after a burst, blocks of megabytes (the writer's
    /// groups, connections' batches, snapshots, session tables) came from the arenas, and what
    /// they freed stayed there, as malloc_trim gives back no arena's top but the main one's
    /// (after 1M events, whend kept 22 MiB of free arena tops resident). Fixed thresholds
    /// keep glibc from raising them. Called first thing in every pipeline process (a worker,
    /// the shared host), not in the daemon, where it cost ingest a fifth more CPU per event.
    package static func apply() {
        _ = whend_malloc_thresholds(mmapThreshold, trimThreshold)
    }

    /// The daemon's malloc: one arena. It keeps glibc's own thresholds (see `apply()`), so a
    /// burst's blocks of megabytes are freed into the arena of the thread that freed them, and
    /// `malloc_trim`, which whend calls once ingest goes quiet, gives back no arena's free top
    /// but the main one's: after 1M events whend held 42–56 MiB of PSS 11 s later, most of it
    /// the free tops of two threads' arenas (`malloc_info`); with one arena, 27 MiB, and the
    /// same CPU per event over three interleaved pairs of `whend-bench --only ingest` (a small
    /// block comes from the thread's cache, without the arena's lock). First thing in `main`,
    /// before threads have arenas of their own.
    package static func applyToDaemon() {
        _ = whend_malloc_arena_max(1)
    }
}
