import Foundation

/// A per-connection rate limit: `rate` events per second on average, `burst` at once.
struct TokenBucket {
    let rate: Double
    let burst: Double
    var tokens: Double
    var last: UInt64

    init(rate: Double, burst: Double) {
        self.rate = rate
        self.burst = max(1, burst)
        self.tokens = max(1, burst)
        self.last = DispatchTime.now().uptimeNanoseconds
    }

    var isUnlimited: Bool { rate <= 0 }

    mutating func take() -> Bool {
        guard !isUnlimited else { return true }
        let now = DispatchTime.now().uptimeNanoseconds
        tokens = min(burst, tokens + Double(now - last) / 1e9 * rate)
        last = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }
}
