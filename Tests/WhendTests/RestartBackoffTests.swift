import SeededRandom
import Testing
import WhendPipelines

/// When a supervisor starts a dead worker again (`RestartBackoff`), decided by how the workers
/// ended alone: a crash loop backs off to 10 s, and a worker that was no crash loop earns a
/// fresh start at 0.1 s.
@Suite struct RestartBackoffTests {
    static let young = RestartBackoff.WorkerEnd(ranFor: 0.5, movedOn: false, asked: false, withTheHost: false)

    /// Workers dying young on the same record wait 0.1, 0.2, 0.4 … s, never over 10 s.
    @Test func aCrashLoopBacksOffToTenSeconds() {
        var backoff = RestartBackoff()
        let waits = (0..<10).map { _ in backoff.wait(after: Self.young) }
        #expect(waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10, 10, 10])
    }

    /// After a long loop, one worker that ran a good while, moved on, was asked to end or went
    /// with the shared host restarts at once (0.1 s), and the next deaths back off from there.
    @Test func aWorkerThatWasNoCrashLoopEarnsAFreshStart() {
        var ends: [RestartBackoff.WorkerEnd] = []
        for field in 0..<4 {
            var end = Self.young
            switch field {
            case 0: end.ranFor = 60.5
            case 1: end.movedOn = true
            case 2: end.asked = true
            default: end.withTheHost = true
            }
            ends.append(end)
        }
        for end in ends {
            var backoff = RestartBackoff()
            for _ in 0..<12 { _ = backoff.wait(after: Self.young) }
            #expect(backoff.wait(after: end) == 0.1)
            #expect(backoff.wait(after: Self.young) == 0.2)
        }
        // A minute exactly is still young.
        var backoff = RestartBackoff()
        _ = backoff.wait(after: Self.young)
        #expect(backoff.wait(after: .init(ranFor: 60, movedOn: false, asked: false, withTheHost: false)) == 0.2)
    }

    /// For any seeded run of worker ends, each wait is 0.1 s doubled once for each crash-loop
    /// death in a row before it (a death that was no crash loop counts as none), at most 10 s.
    @Test(arguments: 0..<20 as Range<UInt64>) func everyWaitIsWhatTheDeathsInARowSay(seed: UInt64) {
        var random = SplitMix64(state: seed)
        var backoff = RestartBackoff()
        var inARow = 0
        for _ in 0..<200 {
            let end = RestartBackoff.WorkerEnd(
                ranFor: Double(random.next() % 1300) / 10, movedOn: random.next() % 8 == 0,
                asked: random.next() % 10 == 0, withTheHost: random.next() % 12 == 0)
            let loop = end.ranFor <= 60 && !end.movedOn && !end.asked && !end.withTheHost
            inARow = loop ? inARow : 0
            var expected = 0.1
            for _ in 0..<inARow { expected = min(10, expected * 2) }
            #expect(backoff.wait(after: end) == expected, "seed \(seed)")
            inARow += 1
        }
    }
}
