/// SipHash-1-3 with a 128-bit output (Aumasson and Bernstein), streaming, under a fixed key:
/// the same bytes give the same digest in every process, so that a digest can be saved (a
/// plugin's state, a snapshot's checksum). Finding two inputs with one digest takes about 2^64
/// tries even knowing the key.
package struct SipHash128 {
    private var v0: UInt64 = 0x736f_6d65_7073_6575
    private var v1: UInt64 = 0x646f_7261_6e64_6f6d ^ 0xee
    private var v2: UInt64 = 0x6c79_6765_6e65_7261
    private var v3: UInt64 = 0x7465_6462_7974_6573
    private var tail: UInt64 = 0
    private var tailCount = 0
    private var length = 0

    package init(key: (UInt64, UInt64) = (0x7768_656e_642d_6b65, 0x792d_7631_2d73_6970)) {
        v0 ^= key.0
        v1 ^= key.1
        v2 ^= key.0
        v3 ^= key.1
    }

    @inline(__always)
    private static func rotl(_ x: UInt64, _ b: UInt64) -> UInt64 { (x << b) | (x >> (64 - b)) }

    @inline(__always)
    private mutating func round() {
        v0 &+= v1
        v1 = Self.rotl(v1, 13)
        v1 ^= v0
        v0 = Self.rotl(v0, 32)
        v2 &+= v3
        v3 = Self.rotl(v3, 16)
        v3 ^= v2
        v0 &+= v3
        v3 = Self.rotl(v3, 21)
        v3 ^= v0
        v2 &+= v1
        v1 = Self.rotl(v1, 17)
        v1 ^= v2
        v2 = Self.rotl(v2, 32)
    }

    @inline(__always)
    private mutating func compress(_ m: UInt64) {
        v3 ^= m
        round()
        v0 ^= m
    }

    package mutating func write(_ bytes: UnsafeRawBufferPointer) {
        length += bytes.count
        var i = 0
        // Fill a partial word first, then whole words straight from the input.
        while tailCount > 0 && i < bytes.count {
            tail |= UInt64(bytes[i]) << (8 * UInt64(tailCount))
            tailCount += 1
            i += 1
            if tailCount == 8 {
                compress(tail)
                tail = 0
                tailCount = 0
            }
        }
        while i + 8 <= bytes.count {
            compress(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)))
            i += 8
        }
        while i < bytes.count {
            tail |= UInt64(bytes[i]) << (8 * UInt64(tailCount))
            tailCount += 1
            i += 1
        }
    }

    package mutating func write(_ value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { write($0) }
    }

    package mutating func write(_ bytes: [UInt8]) { bytes.withUnsafeBytes { write($0) } }

    /// SipHash-1-3 with a 64-bit output of one word: what a hash table keyed at random per
    /// process puts a digest under, so that digests crafted under the fixed key still spread.
    @inline(__always)
    package static func hash(word: UInt64, key: (UInt64, UInt64)) -> UInt64 {
        var s = SipHash128(key: key)
        s.v1 ^= 0xee  // the 64-bit output's initial state
        s.compress(word)
        s.compress(8 << 56)
        s.v2 ^= 0xff
        s.round()
        s.round()
        s.round()
        return s.v0 ^ s.v1 ^ s.v2 ^ s.v3
    }

    /// The digest of everything written.
    package func finalize() -> (UInt64, UInt64) {
        var s = self
        s.compress(s.tail | UInt64(truncatingIfNeeded: length) << 56)
        s.v2 ^= 0xee
        s.round()
        s.round()
        s.round()
        let first = s.v0 ^ s.v1 ^ s.v2 ^ s.v3
        s.v1 ^= 0xdd
        s.round()
        s.round()
        s.round()
        return (first, s.v0 ^ s.v1 ^ s.v2 ^ s.v3)
    }
}
