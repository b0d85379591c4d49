import Foundation
import NIOConcurrencyHelpers
import SeededRandom
import Testing
import WhendConfiguration
import WhendRecord

@testable import WhendDaemon

/// The rate limit on a clock of the test's own: what a sender may send, when it may again, and
/// what the log's summary says, decided by the schedule alone and never by how fast the machine
/// runs the test.
@Suite struct SenderRateLimiterTests {
    /// Nanoseconds the test moves by hand.
    final class ManualClock: Sendable {
        private let nanoseconds = NIOLockedValueBox<UInt64>(1_000_000_000)
        var now: UInt64 { nanoseconds.withLockedValue { $0 } }
        func advance(seconds: Double) { nanoseconds.withLockedValue { $0 += UInt64(seconds * 1e9) } }
    }

    static func sender(pid: Int32, uid: UInt32 = 1000) -> PeerCredentials {
        PeerCredentials(pid: pid, uid: uid, gid: 1000, comm: "app\(pid)")
    }

    @Test func aBurstIsTakenAtOnceThenTheRateRefillsIt() {
        let clock = ManualClock()
        let limiter = SenderRateLimiter(rate: 2, burst: 3, by: .pid) { clock.now }
        let app = Self.sender(pid: 7)
        #expect((1...4).map { _ in limiter.take(credentials: app, connection: 1) } == [true, true, true, false])
        clock.advance(seconds: 0.49)
        #expect(!limiter.take(credentials: app, connection: 1), "a token comes only after half a second at 2/s")
        clock.advance(seconds: 0.01)
        #expect(limiter.take(credentials: app, connection: 1))
        // Never more than the burst, however long the sender was quiet.
        clock.advance(seconds: 3600)
        #expect((1...4).map { _ in limiter.take(credentials: app, connection: 1) } == [true, true, true, false])
    }

    @Test func eachSenderHasItsOwnBucketByTheKeyConfigured() {
        let clock = ManualClock()
        let byPid = SenderRateLimiter(rate: 1, burst: 1, by: .pid) { clock.now }
        #expect(byPid.take(credentials: Self.sender(pid: 1), connection: 1))
        #expect(byPid.take(credentials: Self.sender(pid: 2), connection: 1))
        #expect(!byPid.take(credentials: Self.sender(pid: 1), connection: 2), "pid 1's bucket, whatever connection")
        let byUid = SenderRateLimiter(rate: 1, burst: 1, by: .uid) { clock.now }
        #expect(byUid.take(credentials: Self.sender(pid: 1, uid: 5), connection: 1))
        #expect(!byUid.take(credentials: Self.sender(pid: 2, uid: 5), connection: 2), "one bucket for uid 5")
        let byConnection = SenderRateLimiter(rate: 1, burst: 1, by: .connection) { clock.now }
        #expect(byConnection.take(credentials: Self.sender(pid: 1), connection: 1))
        #expect(byConnection.take(credentials: Self.sender(pid: 1), connection: 2))
    }

    @Test func theSummarySaysWhatWasSuppressedOnceAndForgetsQuietSenders() {
        let clock = ManualClock()
        let limiter = SenderRateLimiter(rate: 1, burst: 1, by: .pid) { clock.now }
        for _ in 0..<5 { _ = limiter.take(credentials: Self.sender(pid: 9), connection: 1) }
        let report = limiter.takeReport()
        #expect(report.map(\.count) == [4])
        #expect(report.first?.sender.contains("pid 9 (app9, uid 1000)") == true, "\(report)")
        #expect(limiter.takeReport().isEmpty, "each suppression is reported once")
        // Refilled: forgotten, so a sender that comes back starts with a full bucket.
        clock.advance(seconds: 1)
        #expect(limiter.takeReport().isEmpty)
        #expect(limiter.take(credentials: Self.sender(pid: 9), connection: 1))
    }

    /// For any schedule of senders and pauses, the limiter lets through exactly what a token
    /// bucket per sender (the model: burst, refilled at the rate, never above the burst) does,
    /// and the summaries add up to what it refused.
    @Test(arguments: 0..<20)
    func anyScheduleMatchesATokenBucketPerSender(seed: UInt64) {
        var random = SplitMix64(state: seed)
        let rate = Double(1 + random.int(5))
        let burst = Double(1 + random.int(4))
        let clock = ManualClock()
        let limiter = SenderRateLimiter(rate: rate, burst: burst, by: .pid) { clock.now }
        var model: [Int32: (tokens: Double, last: UInt64)] = [:]
        var refused = 0
        var reported = 0
        for step in 0..<500 {
            if random.int(4) == 0 { clock.advance(seconds: Double(random.int(1000)) / 1000) }
            let pid = Int32(1 + random.int(3))
            var bucket = model[pid] ?? (max(1, burst), clock.now)
            bucket.tokens = min(max(1, burst), bucket.tokens + Double(clock.now - bucket.last) / 1e9 * rate)
            bucket.last = clock.now
            let expected = bucket.tokens >= 1
            if expected { bucket.tokens -= 1 } else { refused += 1 }
            model[pid] = bucket
            #expect(
                limiter.take(credentials: Self.sender(pid: pid), connection: 1) == expected,
                "seed \(seed), step \(step)")
            if random.int(50) == 0 {
                reported += limiter.takeReport().reduce(0) { $0 + $1.count }
                // The limiter forgets refilled senders; so does the model.
                model = model.filter { _, bucket in
                    bucket.tokens + Double(clock.now - bucket.last) / 1e9 * rate < max(1, burst)
                }
            }
        }
        reported += limiter.takeReport().reduce(0) { $0 + $1.count }
        #expect(reported == refused, "seed \(seed)")
    }
}
