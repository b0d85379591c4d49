/// Strict UTF-8 validation (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
///
/// Returns the offset of the first byte that is not part of a valid sequence, or nil when the
/// whole buffer is valid. ASCII runs are skipped 32 bytes at a time, then eight.
package func firstInvalidUTF8Offset(_ bytes: UnsafeBufferPointer<UInt8>) -> Int? {
    let count = bytes.count
    guard let base = bytes.baseAddress else { return nil }
    var i = 0
    // Most lines are ASCII throughout: four words tested with one branch.
    while i + 32 <= count {
        let p = UnsafeRawPointer(base + i)
        let any =
            p.loadUnaligned(as: UInt64.self) | p.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
            | p.loadUnaligned(fromByteOffset: 16, as: UInt64.self)
            | p.loadUnaligned(fromByteOffset: 24, as: UInt64.self)
        if any & 0x8080_8080_8080_8080 != 0 { break }
        i += 32
    }
    while i < count {
        // Fast path: eight ASCII bytes at once.
        if i + 8 <= count {
            let word = UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self)
            if word & 0x8080_8080_8080_8080 == 0 {
                i += 8
                continue
            }
        }
        let b0 = base[i]
        if b0 < 0x80 {
            i += 1
            continue
        }
        func continuation(_ k: Int) -> Bool { i + k < count && base[i + k] & 0xC0 == 0x80 }
        if b0 >= 0xC2 && b0 <= 0xDF {
            guard continuation(1) else { return i }
            i += 2
        } else if b0 >= 0xE0 && b0 <= 0xEF {
            guard continuation(1), continuation(2) else { return i }
            let b1 = base[i + 1]
            if b0 == 0xE0 && b1 < 0xA0 { return i }  // overlong
            if b0 == 0xED && b1 > 0x9F { return i }  // UTF-16 surrogate
            i += 3
        } else if b0 >= 0xF0 && b0 <= 0xF4 {
            guard continuation(1), continuation(2), continuation(3) else { return i }
            let b1 = base[i + 1]
            if b0 == 0xF0 && b1 < 0x90 { return i }  // overlong
            if b0 == 0xF4 && b1 > 0x8F { return i }  // above U+10FFFF
            i += 4
        } else {
            return i
        }
    }
    return nil
}
