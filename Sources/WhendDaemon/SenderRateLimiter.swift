import Foundation
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendPluginHost
import WhendRecord
import WhendWire

/// A token bucket: `rate` events per second on average, `burst` at once.
struct TokenBucket {
    var tokens: Double
    var last: UInt64

    init(burst: Double, now: UInt64) {
        tokens = max(1, burst)
        last = now
    }

    mutating func take(rate: Double, burst: Double, now: UInt64) -> Bool {
        tokens = min(max(1, burst), tokens + Double(now &- last) / 1e9 * rate)
        last = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    func isFull(rate: Double, burst: Double, now: UInt64) -> Bool {
        tokens + Double(now &- last) / 1e9 * rate >= max(1, burst)
    }
}

/// The rate limit, shared by every connection: each sender — a process, a user or a connection,
/// as `rate_limit_by` says — has one bucket of `rate_burst` events that refills at `rate_limit`
/// events a second. An event that finds its sender's bucket empty is refused with
/// `rate_limited` and counted; `takeReport()` hands out, per sender, what was suppressed since
/// the last report, so that the log says so on a timer and not only when the sender next speaks.
final class SenderRateLimiter: Sendable {
    struct Sender: Hashable {
        var key: RateLimitKey
        var id: UInt64
    }

    /// What the rate limit suppressed from one sender since the last report.
    struct Suppressed {
        var sender: String
        var count: Int
    }

    private struct Entry {
        var bucket: TokenBucket
        var suppressed = 0
        var who: String
    }

    private struct State {
        var rate: Double
        var burst: Double
        var by: RateLimitKey
        var entries: [Sender: Entry] = [:]
    }

    private let state: NIOLockedValueBox<State>
    /// Monotonic nanoseconds: the system's uptime, or a test's own clock.
    private let now: @Sendable () -> UInt64

    init(
        rate: Double, burst: Double, by: RateLimitKey,
        now: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }
    ) {
        state = NIOLockedValueBox(State(rate: rate, burst: burst, by: by))
        self.now = now
    }

    func reconfigure(rate: Double, burst: Double, by: RateLimitKey) {
        state.withLockedValue { s in
            if s.by != by { s.entries.removeAll() }
            (s.rate, s.burst, s.by) = (rate, burst, by)
        }
    }

    /// Takes one event's token for the sender of a connection; false when it must be refused.
    func take(credentials: PeerCredentials, connection: UInt64) -> Bool {
        let now = self.now()
        return state.withLockedValue { s in
            guard s.rate > 0 else { return true }
            let sender: Sender
            switch s.by {
            case .pid: sender = Sender(key: .pid, id: UInt64(UInt32(bitPattern: credentials.pid)))
            case .uid: sender = Sender(key: .uid, id: UInt64(credentials.uid))
            case .connection: sender = Sender(key: .connection, id: connection)
            }
            let (rate, burst) = (s.rate, s.burst)
            var allowed = false
            if s.entries[sender] == nil {
                s.entries[sender] = Entry(
                    bucket: TokenBucket(burst: burst, now: now), who: Self.describe(credentials, s.by, connection))
            }
            allowed = s.entries[sender]!.bucket.take(rate: rate, burst: burst, now: now)
            if !allowed { s.entries[sender]!.suppressed += 1 }
            return allowed
        }
    }

    /// What was suppressed since the last call, per sender; forgets senders whose bucket has
    /// refilled, so that memory follows the senders of the last interval, not all there were.
    func takeReport() -> [Suppressed] {
        let now = self.now()
        return state.withLockedValue { s in
            var report: [Suppressed] = []
            let (rate, burst) = (s.rate, s.burst)
            for (sender, entry) in s.entries {
                if entry.suppressed > 0 {
                    report.append(Suppressed(sender: entry.who, count: entry.suppressed))
                    s.entries[sender]!.suppressed = 0
                } else if entry.bucket.isFull(rate: rate, burst: burst, now: now) {
                    s.entries[sender] = nil
                }
            }
            return report.sorted { $0.count > $1.count }
        }
    }

    private static func describe(_ c: PeerCredentials, _ by: RateLimitKey, _ connection: UInt64) -> String {
        // The process names itself (prctl): its name goes into the log escaped, one line.
        let comm = c.comm.unicodeScalars.map {
            $0.value < 0x20 || $0.value == 0x7F ? "\\x" + String(format: "%02x", $0.value) : String($0)
        }.joined()
        switch by {
        case .pid: return "pid \(c.pid) (\(comm), uid \(c.uid))"
        case .uid: return "uid \(c.uid)"
        case .connection: return "connection \(connection) of pid \(c.pid) (\(comm), uid \(c.uid))"
        }
    }
}
