import CZstd
import Foundation
import Testing
import WhendRecord
import WhendWire

@testable import WhendJournal

@Suite struct DedupWindowTests {
    func key(_ i: Int) -> DedupKey { DedupKey(app: Array("a".utf8), session: nil, id: Array("\(i)".utf8)) }

    @Test func remembersExactlyTheLastWindowOfRecords() {
        let window = DedupWindow(window: 100)
        for seq in 1...1000 {
            let stored = window.insertIfAbsent(key(seq), seq: UInt64(seq))
            #expect(stored)
            window.evict(lastSeq: UInt64(seq))
            // A resend of something in the window is recognised, and changes nothing…
            let resent = window.insertIfAbsent(key(seq), seq: UInt64(seq + 1))
            #expect(!resent)
            if seq > 99 { #expect(window.contains(key(seq - 99))) }
            // …and what fell out of it is forgotten.
            if seq > 100 { #expect(!window.contains(key(seq - 100))) }
        }
    }

    @Test func aFailedCommitIsRolledBackWithoutShrinkingTheWindow() {
        let window = DedupWindow(window: 10)
        for seq in 1...10 { _ = window.insertIfAbsent(key(seq), seq: UInt64(seq)) }
        // Seqs 11…13 fail and are reused by other keys.
        for seq in 11...13 { _ = window.insertIfAbsent(key(seq), seq: UInt64(seq)) }
        window.dropFrom(seq: 11)
        #expect(!window.contains(key(11)))
        for seq in 11...13 { _ = window.insertIfAbsent(key(100 + seq), seq: UInt64(seq)) }
        window.evict(lastSeq: 13)
        // The window holds exactly _seq 4…13.
        #expect(!window.contains(key(3)))
        for seq in 4...10 { #expect(window.contains(key(seq))) }
        for seq in 11...13 { #expect(window.contains(key(100 + seq))) }
    }
}

@Suite struct DedupTableTests {
    /// Random inserts and removals in a table of 16 slots, so that probe runs collide and wrap
    /// around, against a dictionary as the model.
    @Test func agreesWithADictionaryUnderHeavyCollisions() {
        let table = DedupTable(capacity: 8)
        var model: [DedupKey: UInt64] = [:]
        var rng = SystemRandomNumberGenerator()
        let keys = (0..<40).map { DedupKey(app: Array("a".utf8), session: nil, id: Array("k\($0)".utf8)) }
        for step in 1...20_000 {
            let key = keys[Int.random(in: 0..<keys.count, using: &rng)]
            if model.count < 12 && Bool.random(using: &rng) {
                let existing = table.insertIfAbsent(key, seq: UInt64(step))
                #expect(existing == model[key])
                if model[key] == nil { model[key] = UInt64(step) }
            } else {
                table.remove(key)
                model[key] = nil
            }
            #expect(table.count == model.count)
            if step % 97 == 0 {
                for k in keys { #expect(table.seq(of: k) == model[k]) }
            }
        }
    }
}
