import Foundation

/// When a pipeline's worker does each of its periodic jobs: send what its plugins derived, ask
/// them to flush, save its cursor, snapshot their state, report progress, give memory back.
/// The worker asks after every record and whenever it has caught up; the answers depend only
/// on the time it passes in (seconds on any monotonic clock), so the schedule is tested with a
/// clock of the test's own (`CheckpointPolicyTests`).
package struct CheckpointPolicy: Sendable {
    /// Derived records wait at most this long for company before they go to whend…
    package static let outputEvery = 0.005
    /// …or until this many bytes wait.
    package static let outputBytes = 256 << 10
    /// The cursor is saved at most this often: a crash repeats at most this much work.
    package static let saveEvery = 0.1
    /// Plugins holding effects in memory are asked to make them durable at most this often.
    package static let pluginFlushEvery = 0.1
    /// Progress reaches whend at least this often: its watchdog hears the worker alive.
    package static let progressEvery = 0.25
    /// Freed memory goes back to the system at most this often…
    package static let trimEvery = 10.0
    /// …or once this many records were handled since the last time, the worker caught up.
    package static let trimRecords: UInt64 = 100_000
    /// A snapshot costs its pipeline at most one part in this many of its time.
    package static let snapshotCostShare = 20.0
    /// A worker's first snapshot comes within this long of its start, whatever the interval:
    /// workers that keep dying young still move on the point their successors resume from.
    package static let firstSnapshotWithin = 0.5

    /// `pipeline_snapshot_interval`.
    package let snapshotInterval: Double
    /// The seconds between snapshots now: at least the interval, and at least
    /// `snapshotCostShare` times what the last one took.
    package private(set) var snapshotSpacing: Double
    private var lastOutput: Double
    private var lastSave: Double
    private var lastPluginFlush: Double
    private var lastProgress = -Double.infinity
    private var lastSnapshot: Double
    private var lastTrim: Double
    /// A snapshot was saved since memory was last given back: the copy of the state it was
    /// made from is freed.
    private var snapshotSinceTrim = false

    package init(snapshotInterval: Double, now: Double) {
        self.snapshotInterval = snapshotInterval
        snapshotSpacing = snapshotInterval
        lastOutput = now
        lastSave = now
        lastPluginFlush = now
        lastSnapshot = now - max(0, snapshotInterval - Self.firstSnapshotWithin)
        lastTrim = now
    }

    /// Whether the derived records waiting (`pendingBytes`) go to whend now; if so, counted as sent.
    package mutating func outputDue(now: Double, pendingBytes: Int, force: Bool) -> Bool {
        guard pendingBytes > 0, force || pendingBytes >= Self.outputBytes || now - lastOutput >= Self.outputEvery
        else { return false }
        lastOutput = now
        return true
    }

    /// What was derived went to whend for a reason of the worker's own (it caught up, or
    /// before a snapshot).
    package mutating func outputSent(now: Double) { lastOutput = now }

    /// Whether a snapshot is due (the caller knows whether there is state, and whether the
    /// cursor moved since the last one).
    package func snapshotDue(now: Double, force: Bool) -> Bool {
        force || now - lastSnapshot >= snapshotSpacing
    }

    /// Whether the plugins are asked to flush now: before a snapshot, or while they hold
    /// records (`behind`) at the latest `pluginFlushEvery` after the last time, at once when
    /// forced or idle. If so, counted as asked.
    package mutating func pluginFlushDue(now: Double, force: Bool, idle: Bool, snapshotDue: Bool, behind: Bool)
        -> Bool
    {
        guard snapshotDue || (behind && (force || idle || now - lastPluginFlush >= Self.pluginFlushEvery)) else {
            return false
        }
        lastPluginFlush = now
        return true
    }

    /// A snapshot is begun at `now` (whether it is saved or not, the next waits its spacing).
    package mutating func snapshotBegun(now: Double) { lastSnapshot = now }

    /// The snapshot begun at `started` was saved at `finished`: the next waits long enough that
    /// snapshots cost at most their share.
    package mutating func snapshotSaved(started: Double, finished: Double) {
        snapshotSpacing = max(snapshotInterval, Self.snapshotCostShare * (finished - started))
        snapshotSinceTrim = true
    }

    /// Whether the cursor is saved now (if it moved: the caller knows). Call `cursorSaved` once saved.
    package func saveDue(now: Double, force: Bool) -> Bool { force || now - lastSave >= Self.saveEvery }

    package mutating func cursorSaved(now: Double) { lastSave = now }

    /// Whether progress is told now: every `progressEvery`, or at once when the worker is idle
    /// and its durable cursor moved since the last report.
    package func progressDue(now: Double, force: Bool, idle: Bool, moved: Bool) -> Bool {
        force || now - lastProgress >= Self.progressEvery || (idle && moved)
    }

    package mutating func progressSent(now: Double) { lastProgress = now }

    /// Whether the worker gives freed memory back now: when it handled records since the last
    /// time (`handled` of them), at most every `trimEvery`, or at once after a burst of
    /// `trimRecords` (a pipeline that caught up with a million records held tens of MiB more
    /// than it used for up to `trimEvery`); and once after each snapshot, whose copy of the
    /// state is freed (an idle shared host grew by 20 MiB of freed pages at its next snapshot).
    /// If so, counted as done.
    package mutating func trimDue(now: Double, handled: UInt64) -> Bool {
        let afterBurst = handled > 0 && (now - lastTrim >= Self.trimEvery || handled >= Self.trimRecords)
        guard afterBurst || snapshotSinceTrim else { return false }
        lastTrim = now
        snapshotSinceTrim = false
        return true
    }
}

/// Seconds on the monotonic clock: unlike the wall clock, it never jumps (an NTP step back
/// would have held every save and report back as long).
package func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// `monotonicSeconds` to a clock tick's resolution (1–4 ms), for what asks after every record:
/// the precise clock cost 21 ns a call here, the coarse one 3 (a pipeline asks some 300,000
/// times a second, four pipelines at once). Every period of `CheckpointPolicy` spans ticks.
package func coarseMonotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
