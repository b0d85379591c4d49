import CZstd
import Foundation
import TestScratch
import Testing
import WhendRecord
import WhendWire

@testable import WhendJournal

func temporaryDirectory(_ name: String) -> String { ScratchDirectory.make(name) }

func record(_ seq: UInt64, _ note: String = "") -> [UInt8] {
    Array(
        #"{"_seq":\#(seq),"type":"when","name":"step","params":{"n":\#(seq),"note":"\#(note)"},"app":"a","id":"e\#(seq)","_rt":"2026-11-21T13:35:00.000000Z","_pid":1,"_uid":0,"_gid":0,"_comm":"t"}"#
            .utf8)
}

func readAll(_ directory: JournalDirectory) -> (lines: [[UInt8]], problems: [JournalProblem]) {
    var lines: [[UInt8]] = []
    var problems: [JournalProblem] = []
    JournalReader(directory: directory).read { r, _ in
        lines.append(Array(r.line))
        return true
    } onProblem: {
        problems.append($0)
    }
    return (lines, problems)
}

/// A sealed segment of records 1…300 in 30 commits, frames ended every 2000 bytes (several
/// frames): its directory, its path, its text, and where each record's line starts in it.
func sealedSegment(_ name: String) throws -> (
    directory: JournalDirectory, path: String, text: [UInt8], lineStarts: [Int]
) {
    let directory = JournalDirectory(path: temporaryDirectory(name))
    try directory.create()
    let writer = try SegmentWriter(
        directory: directory, firstSeq: 1, compressor: ZstdCompressor(level: 3), frameBytes: 2000)
    var text: [UInt8] = []
    var lineStarts: [Int] = []
    for commit in 0..<30 {
        var lines: [UInt8] = []
        let first = UInt64(commit * 10 + 1)
        for seq in first..<(first + 10) {
            lineStarts.append(text.count + lines.count)
            lines += record(seq, String(repeating: "n", count: Int(seq % 7))) + [0x0A]
        }
        text += lines
        try lines.withUnsafeBytes {
            try writer.append(
                lines: $0, firstSeq: first, lastSeq: first + 9, minReceived: 0, maxReceived: 0, flush: true)
        }
    }
    try writer.seal()
    return (directory, directory.segmentPath(firstSeq: 1), text, lineStarts)
}

func zstdTestPasses(_ path: String) -> Bool {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/zstd")
    p.arguments = ["-q", "-t", path]
    p.standardError = FileHandle.nullDevice
    try? p.run()
    p.waitUntilExit()
    return p.terminationStatus == 0
}

@Suite struct SegmentRecoveryTests {
    /// Writes an unsealed segment in small commits, as the daemon does, noting the file size
    /// after each commit and the last `_seq` it made durable.
    func writeTornSegment(in directory: JournalDirectory) throws -> (
        records: [[UInt8]], commits: [(size: Int64, lastSeq: UInt64)]
    ) {
        try directory.create()
        let writer = try SegmentWriter(
            directory: directory, firstSeq: 1, compressor: ZstdCompressor(level: 3), frameBytes: 1500)
        var records: [[UInt8]] = []
        var commits: [(Int64, UInt64)] = []
        var seq: UInt64 = 1
        for commit in 0..<40 {
            var lines: [UInt8] = []
            let first = seq
            for _ in 0..<(commit % 4 + 1) {
                let r = record(seq, String(repeating: "x", count: Int(seq % 13)))
                records.append(r)
                lines += r + [0x0A]
                seq += 1
            }
            try lines.withUnsafeBytes {
                try writer.append(
                    lines: $0, firstSeq: first, lastSeq: seq - 1, minReceived: 0, maxReceived: 0, flush: true)
            }
            commits.append((writer.size, seq - 1))
        }
        return (records, commits)
    }

    @Test func segmentCutAtEveryOffsetRecoversToItsLastCompleteRecord() throws {
        let source = JournalDirectory(path: temporaryDirectory("torn-source"))
        let (records, commits) = try writeTornSegment(in: source)
        let full = try FileIO.readAll(source.segmentPath(firstSeq: 1))
        #expect(commits.count == 40 && full.count > 1000)
        // Several frames, so that cuts land in whole frames, torn frames and frame boundaries.
        #expect(Set(commits.map(\.size)).count == 40)

        let target = JournalDirectory(path: temporaryDirectory("torn-target"))
        try target.create()
        let path = target.segmentPath(firstSeq: 1)
        var previousKept = 0
        for cut in 0...full.count {
            unlink(path)
            try Data(full[0..<cut]).write(to: URL(fileURLWithPath: path))
            let result = try SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: path))
            let committed = commits.last(where: { $0.size <= Int64(cut) })?.lastSeq ?? 0
            let (lines, problems) = readAll(target)
            #expect(problems.isEmpty, "cut at \(cut): \(problems)")
            // Nothing committed before the cut is lost; nothing but whole records is kept.
            #expect(UInt64(lines.count) >= committed, "cut at \(cut) lost committed records")
            #expect(lines == Array(records.prefix(lines.count)), "cut at \(cut) kept something else than a prefix")
            #expect(lines.count >= previousKept, "cut at \(cut) kept fewer records than a shorter cut")
            previousKept = lines.count
            #expect(result.lastSeq == UInt64(lines.count))
            if lines.isEmpty {
                #expect(result.outcome == .removedEmpty)
                #expect(!FileManager.default.fileExists(atPath: path))
            } else {
                let index = try #require(SegmentIndex.read(fromFileAt: path), "cut at \(cut): not sealed")
                #expect(index.lastSeq == UInt64(lines.count))
                if cut % 97 == 0 { #expect(zstdTestPasses(path), "cut at \(cut): zstd -t fails") }
                if cut % 7 == 0 { #expect(JournalVerifier(directory: target).verify().isClean, "cut at \(cut)") }
            }
        }
        #expect(previousKept == records.count)
    }

    /// A record a writer once stored over several lines (a plugin's pretty-printed output,
    /// before whend compacted it) is no torn tail: recovery keeps it and every record after
    /// it. It used to stop at its first line, keep nothing, and remove the segment, so that a
    /// SIGKILL and a restart lost every acknowledged record and `_seq` started again at 1.
    @Test func aRecordSplitOverLinesCostsNoRecordAtRecovery() throws {
        let directory = JournalDirectory(path: temporaryDirectory("split-record"))
        try directory.create()
        let writer = try SegmentWriter(
            directory: directory, firstSeq: 1, compressor: ZstdCompressor(level: 3), frameBytes: 1500)
        func split(_ seq: UInt64) -> [UInt8] {
            Array(#"{"_seq":\#(seq),"type":"when","pretty":{"#.utf8) + Array("\n\t\"a\": [1,\n 2]\n".utf8)
                + Array(#"},"_rt":"2026-11-21T13:35:00.000000Z"}"#.utf8)
        }
        for commit in 0..<10 {
            let first = UInt64(commit * 10 + 1)
            var lines: [UInt8] = []
            for seq in first..<(first + 10) { lines += (seq % 3 == 1 ? split(seq) : record(seq)) + [0x0A] }
            try lines.withUnsafeBytes {
                try writer.append(
                    lines: $0, firstSeq: first, lastSeq: first + 9, minReceived: 0, maxReceived: 0, flush: true)
            }
        }
        let path = directory.segmentPath(firstSeq: 1)
        // Unsealed, as after a SIGKILL; the last frame torn in its middle too.
        let full = try FileIO.readAll(path)
        try Data(full[0..<(full.count - 40)]).write(to: URL(fileURLWithPath: path))
        let result = try SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: path))
        #expect(result.outcome != .removedEmpty)
        #expect(result.lastSeq >= 90, "\(result.lastSeq)")
        let (lines, _) = readAll(directory)
        let seqs = lines.compactMap { line in
            line.withUnsafeBufferPointer { seqPrefix($0) }
        }
        #expect(seqs == Array(1...result.lastSeq))
        #expect(SegmentIndex.read(fromFileAt: path)?.lastSeq == result.lastSeq)

        // A record out of order still ends what is kept.
        let bad = JournalDirectory(path: temporaryDirectory("split-bad"))
        try bad.create()
        let badWriter = try SegmentWriter(
            directory: bad, firstSeq: 1, compressor: ZstdCompressor(level: 3), frameBytes: 1500)
        let outOfOrder = record(1) + [0x0A] + split(2) + [0x0A] + split(7) + [0x0A] + record(3) + [0x0A]
        try outOfOrder.withUnsafeBytes {
            try badWriter.append(lines: $0, firstSeq: 1, lastSeq: 3, minReceived: 0, maxReceived: 0, flush: true)
        }
        let cut = try SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: bad.segmentPath(firstSeq: 1)))
        #expect(cut.lastSeq == 2)
    }

    @Test func recoveringASealedSegmentChangesNothing() throws {
        let directory = JournalDirectory(path: temporaryDirectory("sealed"))
        try directory.create()
        let writer = try SegmentWriter(
            directory: directory, firstSeq: 5, compressor: ZstdCompressor(level: 3), frameBytes: 300)
        var lines: [UInt8] = []
        for seq in UInt64(5)...20 { lines += record(seq) + [0x0A] }
        try lines.withUnsafeBytes {
            try writer.append(lines: $0, firstSeq: 5, lastSeq: 20, minReceived: 10, maxReceived: 20, flush: true)
        }
        try writer.seal()
        let path = directory.segmentPath(firstSeq: 5)
        let before = try FileIO.readAll(path)
        let result = try SegmentRecovery.recover(SegmentFile(firstSeq: 5, path: path))
        #expect(result.outcome == .alreadySealed)
        #expect(result.lastSeq == 20)
        #expect(try FileIO.readAll(path) == before)
        #expect(zstdTestPasses(path))
        let index = try #require(SegmentIndex.read(fromFileAt: path))
        #expect(index.firstSeq == 5 && index.lastSeq == 20)
        #expect(index.entries.first?.offset == 0)
    }
}

@Suite struct JournalWriterTests {
    func batch(_ records: [(body: String, id: String?)]) -> JournalBatch {
        var b = JournalBatch()
        for (i, r) in records.enumerated() {
            // As the daemon's encoder does, the id is in the stored body too.
            b.bodies += Array((r.id.map { #""id":"\#($0)","# } ?? "").utf8) + Array(r.body.utf8)
            b.ends.append(b.bodies.count)
            if let id = r.id { b.keys.append((i, DedupKey(app: Array("a".utf8), session: nil, id: Array(id.utf8)))) }
        }
        b.minReceivedMicros = 0
        b.maxReceivedMicros = 0
        return b
    }

    func submitAndWait(_ writer: JournalWriter, _ b: JournalBatch) -> JournalCommit {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox()
        writer.submit(b) { result in
            box.value = result
            done.signal()
        }
        done.wait()
        return box.value!
    }

    final class ResultBox: @unchecked Sendable { var value: JournalCommit? }

    @Test func sequenceCarriesOnAcrossRestartsAndResendsAreStoredOnce() throws {
        let directory = JournalDirectory(path: temporaryDirectory("writer"))
        var configuration = JournalConfiguration(directory: directory)
        configuration.segmentMaxBytes = 300  // rotate often
        let body =
            #""type":"screen","name":"A","app":"a","_rt":"2026-11-21T13:35:00.000000Z","_pid":1,"_uid":0,"_gid":0,"_comm":"t"}"#
        for round in 0..<3 {
            let writer = try JournalWriter(configuration: configuration)
            writer.start()
            for i in 0..<20 {
                let id = "r\(round)-\(i)"
                // Each event twice in one batch, and the previous round's last event again.
                let result = submitAndWait(
                    writer, batch([(body, id), (body, id), (body, round > 0 ? "r\(round - 1)-19" : nil)]))
                guard case .stored = result else { Issue.record("\(result)"); return }
            }
            writer.shutdown()
        }
        let (lines, problems) = readAll(directory)
        #expect(problems.isEmpty)
        // Round 0 stores 20 events + 20 id-less ones; later rounds 20 each (the resends of the
        // previous round's last event are recognised across the restart).
        #expect(lines.count == 40 + 20 + 20)
        let seqs = try lines.map { line in try line.withUnsafeBufferPointer { try StoredRecord.scan($0).seq } }
        #expect(seqs == (1...UInt64(lines.count)).map { $0 })
        let report = JournalVerifier(directory: directory).verify()
        #expect(report.isClean, "\(report.problems)")
        #expect(directory.segments().count > 3)
        for segment in directory.segments() {
            #expect(SegmentIndex.read(fromFileAt: segment.path) != nil)
            #expect(zstdTestPasses(segment.path))
        }
    }

    @Test func readerStartsNearARequestedSeqThroughTheIndex() throws {
        let directory = JournalDirectory(path: temporaryDirectory("seek"))
        var configuration = JournalConfiguration(directory: directory)
        configuration.frameBytes = 2000
        let writer = try JournalWriter(configuration: configuration)
        writer.start()
        let body =
            #""type":"screen","name":"A","app":"a","_rt":"2026-11-21T13:35:00.000000Z","_pid":1,"_uid":0,"_gid":0,"_comm":"t"}"#
        for _ in 0..<50 { _ = submitAndWait(writer, batch(Array(repeating: (body, nil), count: 10))) }
        writer.shutdown()
        let index = try #require(SegmentIndex.read(fromFileAt: directory.segmentPath(firstSeq: 1)))
        #expect(index.entries.count > 5)
        var first: UInt64?
        var frame: Int64 = -1
        JournalReader(directory: directory).read(fromSeq: 400) { r, _ in
            first = r.seq
            frame = r.frameOffset
            return false
        } onProblem: {
            Issue.record("\($0)")
        }
        #expect(first == 400)
        #expect(frame == index.offset(forSeq: 400) && frame > 0)
    }
}

@Suite struct DamagedSegmentTests {
    @Test func aDamagedFrameIsSkippedAndNamedTheRestIsRead() throws {
        let (directory, path, _, _) = try sealedSegment("damaged")
        let index = try #require(SegmentIndex.read(fromFileAt: path))
        try #require(index.entries.count >= 5)
        // Corrupt the middle of one frame in the middle of the segment.
        let victim = index.entries.count / 2
        let start = index.entries[victim].offset
        let end = index.entries[victim + 1].offset
        var bytes = try FileIO.readAll(path)
        for i in Int(start + (end - start) / 2)..<Int(start + (end - start) / 2 + 8) { bytes[i] ^= 0xA5 }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let lost = index.entries[victim + 1].firstSeq - index.entries[victim].firstSeq

        let report = JournalVerifier(directory: directory).verify()
        #expect(report.problems.count == 1, "\(report.problems)")
        #expect(report.problems.first?.offset == start)
        #expect(report.problems.first?.message.contains("unreadable") == true)

        var seqs: [UInt64] = []
        var problems: [JournalProblem] = []
        JournalReader(directory: directory).read { r, _ in
            if let seq = r.seq { seqs.append(seq) }
            return true
        } onProblem: {
            problems.append($0)
        }
        #expect(problems.count == 1)
        #expect(problems.first?.message.contains("skipped to the next frame") == true)
        // Every record outside the damaged frame, in order (a damaged frame may yield a few of
        // its own first records before the damage shows).
        let expectedAfter = Array(index.entries[victim + 1].firstSeq...300)
        let expectedBefore = Array(1..<index.entries[victim].firstSeq)
        #expect(Array(seqs.prefix(expectedBefore.count)) == expectedBefore)
        #expect(Array(seqs.suffix(expectedAfter.count)) == expectedAfter)
        #expect(UInt64(seqs.count) <= 300 && UInt64(seqs.count) >= 300 - lost)
    }
}

@Suite struct FuzzRegressionTests {
    /// Found by FuzzSegment: a sealed segment whose index is intact but whose frame is damaged.
    /// Recovery must leave it alone (it is sealed), keep `_seq` going from its index, and
    /// `verify` must report it.
    @Test func aSealedButDamagedSegmentIsLeftAloneAndReported() throws {
        let seed = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus/segment/sealed-but-corrupt.jsonl.zst")
        let directory = JournalDirectory(path: temporaryDirectory("fuzz-regression"))
        try directory.create()
        let path = directory.segmentPath(firstSeq: 1)
        try Data(contentsOf: seed).write(to: URL(fileURLWithPath: path))
        let before = try FileIO.readAll(path)
        let result = try SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: path))
        #expect(result.outcome == .alreadySealed)
        #expect(result.lastSeq == 3)
        #expect(try FileIO.readAll(path) == before)
        let report = JournalVerifier(directory: directory).verify()
        #expect(!report.isClean)
        #expect(report.problems.allSatisfy { $0.path == path })
    }
}

@Suite struct FuzzRegressionGarbageIndexTests {
    /// Found by FuzzSegment: a segment whose index trailer is intact but whose entries point far
    /// past the end of the file. verify crashed slicing there; such an index is no index.
    @Test func anIndexThatContradictsItsFileIsIgnored() throws {
        let seed = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus/segment/garbage-index.jsonl.zst")
        let directory = JournalDirectory(path: temporaryDirectory("garbage-index"))
        try directory.create()
        let path = directory.segmentPath(firstSeq: 1)
        try Data(contentsOf: seed).write(to: URL(fileURLWithPath: path))
        #expect(SegmentIndex.read(fromFileAt: path) == nil)
        let report = JournalVerifier(directory: directory).verify()
        #expect(!report.isClean)
        var problems = 0
        JournalReader(directory: directory).read { _, _ in
            true
        } onProblem: { _ in
            problems += 1
        }
        #expect(problems >= 1)
        // Recovery treats it as the unsealed tail it now looks like: what it rewrites verifies.
        let result = try SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: path))
        if case .sealed = result.outcome { #expect(JournalVerifier(directory: directory).verify().isClean) }
    }
}

@Suite struct FollowingReaderTests {
    /// Writes a segment as the writer does, a commit per record of `whole`, then (if given) the
    /// commit of `torn`, of which only the first half of the bytes reached the file: a write
    /// that met a full disk.
    func writeSegment(
        _ directory: JournalDirectory, firstSeq: UInt64, whole: [UInt64], torn: UInt64? = nil
    ) throws {
        let writer = try SegmentWriter(
            directory: directory, firstSeq: firstSeq, compressor: ZstdCompressor(level: 3), frameBytes: 1 << 20)
        func commit(_ seq: UInt64) throws {
            let line = record(seq) + [0x0A]
            try line.withUnsafeBytes {
                try writer.append(lines: $0, firstSeq: seq, lastSeq: seq, minReceived: 0, maxReceived: 0, flush: true)
            }
        }
        for seq in whole { try commit(seq) }
        guard let torn else { return }
        let intact = writer.size
        try commit(torn)
        #expect(truncate(writer.file.path, off_t(intact + (writer.size - intact) / 2)) == 0)
    }

    /// The writer's repair of failed writes, as it goes when the disk fills: the torn segment
    /// is rewritten (sealed, up to its last whole record) and renamed over the file a follower
    /// has open; the next segment tears at its first write, holds no whole record, and is
    /// removed, and the writer creates it again under the same name and writes on. Each step
    /// is taken when the follower has read all there is, so it holds the file the step replaces.
    @Test func aFollowerCatchesUpAfterTheWriterRepairsTheSegmentsItReads() throws {
        let directory = JournalDirectory(path: temporaryDirectory("follow-repair"))
        try directory.create()
        try writeSegment(directory, firstSeq: 1, whole: [1], torn: 2)
        var seqs: [UInt64] = []
        var problems: [JournalProblem] = []
        var caughtUp = 0
        var giveUp = Date.distantFuture
        JournalReader(directory: directory).read(follow: true) { r, _ in
            if let seq = r.seq { seqs.append(seq) }
            return true
        } onCaughtUp: {
            caughtUp += 1
            do {
                switch caughtUp {
                case 1:
                    #expect(seqs == [1])
                    let torn = SegmentFile(firstSeq: 1, path: directory.segmentPath(firstSeq: 1))
                    let result = try SegmentRecovery.recover(torn)
                    #expect(result.lastSeq == 1)
                    try writeSegment(directory, firstSeq: 2, whole: [], torn: 2)
                case 2:
                    #expect(seqs == [1])
                    let torn = SegmentFile(firstSeq: 2, path: directory.segmentPath(firstSeq: 2))
                    let result = try SegmentRecovery.recover(torn)
                    #expect(result.outcome == .removedEmpty)
                    try writeSegment(directory, firstSeq: 2, whole: [2, 3])
                    giveUp = Date().addingTimeInterval(5)
                default:
                    if seqs.last == 3 { return false }
                }
            } catch {
                Issue.record("\(error)")
                return false
            }
            return Date() < giveUp
        } onProblem: {
            problems.append($0)
        }
        #expect(seqs == [1, 2, 3])
        #expect(problems.isEmpty, "\(problems)")
    }
}
