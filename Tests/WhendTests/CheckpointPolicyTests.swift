import SeededRandom
import Testing
import WhendPipelines

/// A worker's schedule (`CheckpointPolicy`) on a clock of the test's own: what a user relies
/// on (a crash repeats at most 0.1 s of work, whend hears each worker at least every 0.25 s,
/// snapshots come early and cost at most a twentieth of the time), without a process or a sleep.
@Suite struct CheckpointPolicyTests {
    /// A worker's first snapshot comes within half a second of its start, whatever the interval;
    /// the next waits the interval.
    @Test func theFirstSnapshotComesWithinHalfASecond() {
        var policy = CheckpointPolicy(snapshotInterval: 5, now: 100)
        #expect(!policy.snapshotDue(now: 100.49, force: false))
        #expect(policy.snapshotDue(now: 100.5, force: false))
        policy.snapshotBegun(now: 100.5)
        policy.snapshotSaved(started: 100.5, finished: 100.51)
        #expect(!policy.snapshotDue(now: 105.4, force: false))
        #expect(policy.snapshotDue(now: 105.5, force: false))
        #expect(policy.snapshotDue(now: 100.6, force: true))
        // An interval shorter than half a second: the first is due after the interval.
        #expect(!CheckpointPolicy(snapshotInterval: 0.2, now: 7).snapshotDue(now: 7.19, force: false))
        #expect(CheckpointPolicy(snapshotInterval: 0.2, now: 7).snapshotDue(now: 7.2, force: false))
    }

    /// A snapshot that took a second waits twenty before the next: a large state costs its
    /// pipeline at most a twentieth of its time.
    @Test func snapshotsCostAtMostATwentiethOfTheTime() {
        var policy = CheckpointPolicy(snapshotInterval: 5, now: 0)
        policy.snapshotBegun(now: 10)
        policy.snapshotSaved(started: 10, finished: 11)
        #expect(policy.snapshotSpacing == 20)
        #expect(!policy.snapshotDue(now: 29.9, force: false))
        #expect(policy.snapshotDue(now: 30, force: false))
        policy.snapshotBegun(now: 30)
        policy.snapshotSaved(started: 30, finished: 30.01)
        #expect(policy.snapshotSpacing == 5)
    }

    /// For any sequence of records and idle moments, seeded: the cursor is saved at most every
    /// 0.1 s unless forced, and at least that often while records are handled; progress reaches
    /// whend at least every 0.25 s while the worker is called, and at once when it is idle with
    /// a cursor that moved; derived records wait at most 5 ms; memory is given back at most
    /// every 10 s.
    @Test(arguments: 0..<50) func theScheduleHoldsItsPromisesForAnyCalls(seed: UInt64) {
        var random = SplitMix64(state: seed)
        var now = Double(random.next() % 1000)
        var policy = CheckpointPolicy(snapshotInterval: 5, now: now)
        var lastSave = now
        var lastProgress = -Double.infinity
        var lastOutput = now
        var lastTrim = now
        var pending = 0
        var pendingSince: Double?
        for _ in 0..<2000 {
            // Records a few microseconds to a few hundred milliseconds apart.
            now += Double(random.next() % 300_000) / 1e6
            let force = random.next() % 200 == 0
            let idle = random.next() % 10 == 0
            let moved = random.next() % 2 == 0
            if random.next() % 3 == 0 {
                if pending == 0 { pendingSince = now }
                pending += Int(random.next() % 100_000)
            }
            if policy.outputDue(now: now, pendingBytes: pending, force: force) {
                #expect(force || pending >= CheckpointPolicy.outputBytes || now - lastOutput >= 0.005)
                lastOutput = now
                pending = 0
                pendingSince = nil
            } else if let since = pendingSince {
                // Not sent: neither late nor too many bytes.
                #expect(now - lastOutput < 0.005 || pending == 0, "derived records held since \(since)")
                #expect(pending < CheckpointPolicy.outputBytes)
            }
            if policy.saveDue(now: now, force: force) {
                #expect(force || now - lastSave >= 0.1)
                policy.cursorSaved(now: now)
                lastSave = now
            } else {
                #expect(now - lastSave < 0.1)
            }
            if policy.progressDue(now: now, force: force, idle: idle, moved: moved) {
                #expect(force || (idle && moved) || now - lastProgress >= 0.25)
                policy.progressSent(now: now)
                lastProgress = now
            } else {
                #expect(now - lastProgress < 0.25 && !(idle && moved))
            }
            let handled: UInt64 = moved ? (random.next() % 20 == 0 ? 100_000 : random.next() % 1000 + 1) : 0
            if policy.trimDue(now: now, handled: handled) {
                #expect(handled > 0 && (now - lastTrim >= 10 || handled >= CheckpointPolicy.trimRecords))
                lastTrim = now
            } else {
                #expect(handled == 0 || (now - lastTrim < 10 && handled < CheckpointPolicy.trimRecords))
            }
        }
    }

    /// A snapshot's copy of the state is freed once it is saved: memory is given back at the
    /// next chance, once, even with no record handled since.
    @Test func memoryIsGivenBackOnceAfterEachSnapshot() {
        var policy = CheckpointPolicy(snapshotInterval: 5, now: 0)
        var due: [Bool] = []
        due.append(policy.trimDue(now: 1, handled: 0))
        policy.snapshotBegun(now: 6)
        policy.snapshotSaved(started: 6, finished: 6.1)
        due.append(policy.trimDue(now: 6.2, handled: 0))
        due.append(policy.trimDue(now: 6.3, handled: 0))
        due.append(policy.trimDue(now: 6.4, handled: 10))
        #expect(due == [false, true, false, false])
    }

    /// Plugins holding records are asked to flush at once when the worker is idle or forced,
    /// before any snapshot, else at most every 0.1 s; never when they hold nothing.
    @Test func pluginsAreAskedToFlushWhenTheyHoldRecords() {
        var policy = CheckpointPolicy(snapshotInterval: 5, now: 0)
        func due(_ now: Double, force: Bool = false, idle: Bool = false, snapshot: Bool = false, behind: Bool = true)
            -> Bool
        {
            policy.pluginFlushDue(now: now, force: force, idle: idle, snapshotDue: snapshot, behind: behind)
        }
        #expect(!due(0.05))
        #expect(due(0.05, idle: true))
        #expect(!due(0.1))
        #expect(due(0.16))
        #expect(!due(9, force: true, idle: true, behind: false))
        #expect(due(9, snapshot: true, behind: false))
    }
}
