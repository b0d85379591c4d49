/// SplitMix64: a small, fast generator whose whole future is its seed. The demo's sessions, the
/// benchmark's corpus and the tests' generated inputs draw from it, so that a seed names one
/// run exactly (a failing test's seed is a fixed case; every benchmark run sends one corpus).
/// Not for anything secret: the sequence is predictable by design.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64

    public init(state: UInt64) { self.state = state }

    @inlinable
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in 0..<`n` (by remainder: the slight bias towards small numbers does not
    /// matter to what draws from it, and every stored seed depends on this exact mapping).
    @inlinable
    public mutating func int(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
