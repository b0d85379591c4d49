import Foundation
import Testing

@testable import WhendJournal

/// Retention's rules on figures alone: no files, no clock, any journal and any readers.
@Suite struct RetentionPolicyTests {
    /// A seeded source of numbers.
    struct Numbers {
        var state: UInt64
        mutating func next(_ n: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(max(1, n)))
        }
        mutating func limit(_ n: Int) -> Int64 { next(3) == 0 ? 0 : Int64(1 + next(n)) }
    }

    struct Outcome {
        var deleted: [RetentionPolicy.Segment] = []
        var losses: [RetentionPolicy.Loss] = []
        var stop: RetentionPolicy.Decision?
        var total: Int64
        var free: Int64
    }

    /// Runs retention as the writer does, on a model file system whose free space grows by what
    /// each deletion frees.
    static func run(
        _ policy: RetentionPolicy, _ segments: [RetentionPolicy.Segment], activeBytes: Int64, free: Int64,
        readers: [RetentionPolicy.Reader],
        check: (RetentionPolicy.Segment, Int64, Int64, RetentionPolicy.Decision) -> Void
    ) -> Outcome {
        var outcome = Outcome(total: segments.reduce(activeBytes) { $0 + $1.bytes }, free: free)
        for segment in segments {
            let decision = policy.decide(
                oldest: segment, totalBytes: outcome.total, freeBytes: outcome.free, readers: readers)
            check(segment, outcome.total, outcome.free, decision)
            guard case .delete(_, let losses) = decision else {
                outcome.stop = decision
                break
            }
            outcome.deleted.append(segment)
            outcome.losses += losses
            outcome.total -= segment.bytes
            outcome.free += segment.bytes
        }
        return outcome
    }

    /// For any limits, any sealed segments (oldest first) and any readers: a segment goes only
    /// over a limit; over a soft limit only once every reader has read it; a reader loses
    /// records only past a hard limit, and exactly the records of the segment it had not read;
    /// and retention stops only within every limit, or for a reader over a soft one.
    @Test(arguments: 0..<300)
    func retentionDeletesOnlyWhatTheLimitsAndTheReadersAllow(seed: UInt64) {
        var numbers = Numbers(state: seed &* 0x9E37_79B9_7F4A_7C15 &+ 3)
        let policy = RetentionPolicy(
            maxBytes: numbers.limit(4000), maxAge: TimeInterval(numbers.limit(1000)),
            hardMaxBytes: numbers.limit(8000), minFreeBytes: numbers.limit(3000))
        var segments: [RetentionPolicy.Segment] = []
        var seq: UInt64 = 1
        var age = TimeInterval(numbers.next(3000))
        for _ in 0..<numbers.next(9) {
            let count = UInt64(1 + numbers.next(50))
            segments.append(
                .init(firstSeq: seq, lastSeq: seq + count - 1, bytes: Int64(1 + numbers.next(1500)), age: age))
            seq += count
            age = max(0, age - TimeInterval(numbers.next(600)))
        }
        let readers = (0..<numbers.next(4)).map {
            RetentionPolicy.Reader(name: "p\($0)", cursor: UInt64(numbers.next(Int(seq) + 3)))
        }
        func over(_ total: Int64, _ free: Int64, _ segment: RetentionPolicy.Segment) -> (soft: Bool, hard: Bool) {
            let hard =
                (policy.hardMaxBytes > 0 && total > policy.hardMaxBytes)
                || (policy.minFreeBytes > 0 && free < policy.minFreeBytes)
            let soft =
                (policy.maxBytes > 0 && total > policy.maxBytes) || (policy.maxAge > 0 && segment.age > policy.maxAge)
            return (soft, hard)
        }
        let outcome = Self.run(
            policy, segments, activeBytes: Int64(numbers.next(2000)), free: Int64(numbers.next(4000)), readers: readers
        ) { segment, total, free, decision in
            let (soft, hard) = over(total, free, segment)
            let behind = readers.filter { $0.cursor < segment.lastSeq }
            switch decision {
            case .keep:
                #expect(!soft && !hard, "seed \(seed): kept over a limit")
            case .keepForReaders(let waitedFor):
                #expect(soft && !hard, "seed \(seed)")
                #expect(waitedFor == behind && !behind.isEmpty, "seed \(seed)")
            case .delete(let reason, let losses):
                #expect(soft || hard, "seed \(seed): deleted within every limit")
                #expect(reason.isHard == hard, "seed \(seed): \(reason)")
                #expect(hard || behind.isEmpty, "seed \(seed): a reader lost records to a soft limit")
                #expect(
                    losses
                        == behind.map {
                            .init(reader: $0.name, first: max($0.cursor + 1, segment.firstSeq), last: segment.lastSeq)
                        }, "seed \(seed)")
            }
        }
        // The oldest go first, and nothing a reader has passed is kept over a limit.
        #expect(outcome.deleted == Array(segments.prefix(outcome.deleted.count)), "seed \(seed)")
        if outcome.deleted.count < segments.count {
            #expect(outcome.stop != nil, "seed \(seed)")
        }
    }

    @Test func limitsOfZeroAreOff() {
        let off = RetentionPolicy(maxBytes: 0, maxAge: 0, hardMaxBytes: 0, minFreeBytes: 0)
        #expect(off.isOff)
        let old = RetentionPolicy.Segment(firstSeq: 1, lastSeq: 9, bytes: 1 << 40, age: 1e9)
        #expect(off.decide(oldest: old, totalBytes: 1 << 41, freeBytes: 0, readers: []) == .keep)
    }
}
