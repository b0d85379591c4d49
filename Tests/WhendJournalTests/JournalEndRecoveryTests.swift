import Foundation
import SeededRandom
import TestScratch
import Testing
import WhendWire

@testable import WhendJournal

/// What a power cut leaves at the journal's end when the sync thread is behind the writer:
/// sealed segments, then any number of unsealed ones (their seals lost), each cut anywhere.
/// Whatever it is, the journal whend opens is sound: `_seq` from 1 without a gap, the records
/// exactly those written, up to the first one the cut took; `verify` clean; and the next record
/// takes the next `_seq`.
@Suite struct JournalEndRecoveryTests {
    /// Writes `segments` (records per segment) from `_seq` 1, the first `sealed` of them sealed;
    /// returns every record written and each segment's path and first `_seq`.
    func write(
        _ directory: JournalDirectory, segments: [Int], sealed: Int
    ) throws -> (records: [[UInt8]], files: [(path: String, firstSeq: UInt64, unsealedSize: Int64)]) {
        var records: [[UInt8]] = []
        var files: [(path: String, firstSeq: UInt64, unsealedSize: Int64)] = []
        for (i, count) in segments.enumerated() {
            let first = UInt64(records.count + 1)
            let writer = try SegmentWriter(
                directory: directory, firstSeq: first, compressor: ZstdCompressor(level: 3), frameBytes: 600)
            // A commit of up to three records at a time, each flushed: frames end between them.
            var seq = first
            while seq < first + UInt64(count) {
                let last = min(seq + 2, first + UInt64(count) - 1)
                var lines: [UInt8] = []
                for s in seq...last {
                    records.append(record(s, String(repeating: "x", count: Int(s % 11))))
                    lines += records.last! + [0x0A]
                }
                try lines.withUnsafeBytes {
                    try writer.append(
                        lines: $0, firstSeq: seq, lastSeq: last, minReceived: 0, maxReceived: 0, flush: true)
                }
                seq = last + 1
            }
            let path = directory.segmentPath(firstSeq: first)
            let unsealedSize = FileIO.size(path) ?? 0
            if i < sealed { try writer.seal(sync: false) }
            files.append((path, first, unsealedSize))
        }
        return (records, files)
    }

    @Test(arguments: 0..<150 as Range<UInt64>)
    func anyEndACutLeavesOpensAsASoundJournal(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let directory = JournalDirectory(path: temporaryDirectory("end-recovery"))
        try directory.create()
        let sealed = random.int(4)
        let unsealed = 1 + random.int(4)
        let sizes = (0..<(sealed + unsealed)).map { _ in 1 + random.int(12) }
        let (records, files) = try write(directory, segments: sizes, sealed: sealed)
        // Each unsealed segment: whole (its seal lost), or cut anywhere, down to nothing.
        var survivesThrough = sizes[..<sealed].reduce(0, +)
        var intact = true
        for i in sealed..<files.count {
            let size = Int(FileIO.size(files[i].path) ?? 0)
            if random.int(3) > 0 { truncate(files[i].path, off_t(random.int(size + 1))) }
            if intact, FileIO.size(files[i].path) == Int64(size) { survivesThrough += sizes[i] } else { intact = false }
        }

        // A sealed segment before the last sealed one that lost its seal, its records whole (a
        // cut during an older whend's start-up left some so): sealed again, every record kept.
        if sealed >= 2, random.int(2) == 0 {
            let victim = files[random.int(sealed - 1)]
            truncate(victim.path, off_t(victim.unsealedSize))
        }
        // A segment set aside by an earlier start, named as one of these may be: kept as it is.
        let earlier = files[random.int(files.count)].path + SegmentRecovery.setAsideSuffix
        let earlierBytes = Data("an earlier start's".utf8)
        if random.int(2) == 0 { _ = FileManager.default.createFile(atPath: earlier, contents: earlierBytes) }
        let hadEarlier = FileManager.default.fileExists(atPath: earlier)

        let writer = try JournalWriter(configuration: JournalConfiguration(directory: directory))
        if hadEarlier { #expect(FileManager.default.contents(atPath: earlier) == earlierBytes, "seed \(seed)") }
        let (lines, problems) = readAll(directory)
        #expect(problems.isEmpty, "seed \(seed): \(problems)")
        // Exactly the records written, from the first, up to the first one the cut took.
        #expect(lines.count >= survivesThrough, "seed \(seed): \(lines.count) records kept of \(survivesThrough)")
        #expect(lines.count <= records.count)
        #expect(lines == Array(records.prefix(lines.count)), "seed \(seed)")
        let report = JournalVerifier(directory: directory).verify()
        #expect(report.isClean, "seed \(seed): \(report.problems)")
        // What lies past the records kept is set aside, whole: none of it is lost.
        for file in files where file.firstSeq > UInt64(lines.count) + 1 {
            let aside =
                file.path + SegmentRecovery.setAsideSuffix
                + (file.path + SegmentRecovery.setAsideSuffix == earlier && hadEarlier ? ".1" : "")
            #expect(FileManager.default.fileExists(atPath: aside), "seed \(seed): \(file.path) is not set aside")
        }

        writer.start()
        let stored = JournalWriterTests().submitAndWait(
            writer, JournalWriterTests().batch([(#""type":"when","name":"after"}"#, "after")]))
        writer.shutdown()
        #expect(stored == .stored(lastSeq: UInt64(lines.count) + 1), "seed \(seed): \(stored)")
        #expect(JournalVerifier(directory: directory).verify().isClean, "seed \(seed)")
    }

    /// A file named like a segment that begins at `_seq` 0 (none of whend's) is left alone:
    /// start-up and `verify` trapped on it (an arithmetic overflow), on every start.
    @Test func aFileNamedLikeSegmentZeroIsNoneOfWhends() throws {
        let directory = JournalDirectory(path: temporaryDirectory("segment-zero"))
        try directory.create()
        _ = try write(directory, segments: [5], sealed: 1)
        _ = FileManager.default.createFile(atPath: directory.segmentPath(firstSeq: 0), contents: Data())
        let writer = try JournalWriter(configuration: JournalConfiguration(directory: directory))
        writer.start()
        let stored = JournalWriterTests().submitAndWait(
            writer, JournalWriterTests().batch([(#""type":"when","name":"after"}"#, "after")]))
        writer.shutdown()
        #expect(stored == .stored(lastSeq: 6))
        #expect(JournalVerifier(directory: directory).verify().isClean)
        #expect(FileManager.default.fileExists(atPath: directory.segmentPath(firstSeq: 0)))
    }

    /// What the next start reads of what was synced: after a clean stop, every record, whatever
    /// the durability (under `write` and `none`, a seal is where records are synced).
    @Test(arguments: [Durability.fsync, .write, .none])
    func aCleanStopLeavesEveryRecordMarkedSynced(durability: Durability) throws {
        let directory = JournalDirectory(path: temporaryDirectory("synced-through"))
        var configuration = JournalConfiguration(directory: directory)
        configuration.segmentMaxBytes = 300
        configuration.durability = durability
        for round in 0..<2 {
            let writer = try JournalWriter(configuration: configuration)
            writer.start()
            for i in 0..<20 {
                let body = #""type":"when","name":"n","params":{"pad":"\#(String(repeating: "p", count: i * 7))"}}"#
                _ = JournalWriterTests().submitAndWait(writer, JournalWriterTests().batch([(body, "r\(round)-\(i)")]))
            }
            writer.shutdown()
            #expect(SyncedThrough.read(directory) == UInt64(20 * (round + 1)), "\(durability), round \(round)")
        }
        #expect(directory.segments().count >= 2)
    }
}
