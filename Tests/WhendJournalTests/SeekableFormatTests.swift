import Foundation
import Testing

@testable import WhendJournal

/// The repository's root, for the fixtures and the tests' Python environment (`make test-deps`).
private let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().path

private func run(_ path: String, _ arguments: [String]) throws -> (status: Int32, output: Data) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = arguments
    let out = Pipe()
    p.standardOutput = out
    p.standardError = FileHandle.nullDevice
    try p.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, data)
}

/// What PyPI's pyzstd (`SeekableZstdFile`, a seekable-format reader nobody here wrote) reads
/// of the segment: its size by the seek table, all of it in order, and the line that starts at
/// `offset`, read after a seek there.
private func readSeekable(_ path: String, from offset: Int) throws -> (size: Int, all: String, line: String) {
    let python = repositoryRoot + "/.build/test-venv/bin/python"
    let r = try run(python, [repositoryRoot + "/Tests/Fixtures/seekable_read.py", path, String(offset)])
    try #require(r.status == 0, "pyzstd refused \(path); is the tests' environment there (make test-deps)?")
    let o = try #require(try JSONSerialization.jsonObject(with: r.output) as? [String: Any])
    return (o["size"] as? Int ?? -1, o["sha256"] as? String ?? "", o["line"] as? String ?? "")
}

private func sha256(_ bytes: [UInt8]) throws -> String {
    let file = temporaryDirectory("sha") + "/bytes"
    try Data(bytes).write(to: URL(fileURLWithPath: file))
    let r = try run("/usr/bin/sha256sum", [file])
    return String(decoding: r.output, as: UTF8.self).split(separator: " ").first.map(String.init) ?? ""
}

@Suite struct SeekableFormatTests {
    /// A sealed segment is a zstd seekable-format file: pyzstd opens it, reads it whole as the
    /// records written, and reads from the middle after a seek; `zstd -t` and `zstdcat` agree.
    @Test func aSealedSegmentIsReadBySeekableZstdReaders() throws {
        let (directory, path, text, lineStarts) = try sealedSegment("seekable")
        let index = try #require(SegmentIndex.read(fromFileAt: path))
        try #require(index.entries.count >= 5, "several frames to seek between")

        // From the middle: the line that starts at record 173's offset.
        let read = try readSeekable(path, from: lineStarts[172])
        #expect(read.size == text.count)
        #expect(read.all == (try sha256(text)))
        #expect(read.line == String(decoding: record(173, String(repeating: "n", count: 173 % 7)), as: UTF8.self))
        #expect(zstdTestPasses(path))
        #expect(try run("/usr/bin/zstdcat", [path]).output == Data(text))
        #expect(JournalVerifier(directory: directory).verify().isClean)
    }

    /// A seek table whose sizes do not match the frames is reported by `verify`.
    @Test func aSeekTableThatLiesIsReported() throws {
        let directory = JournalDirectory(path: temporaryDirectory("seekable-lie"))
        try directory.create()
        let writer = try SegmentWriter(
            directory: directory, firstSeq: 1, compressor: ZstdCompressor(level: 3), frameBytes: 500)
        for seq in UInt64(1)...40 {
            let line = record(seq) + [0x0A]
            try line.withUnsafeBytes {
                try writer.append(lines: $0, firstSeq: seq, lastSeq: seq, minReceived: 0, maxReceived: 0, flush: true)
            }
        }
        try writer.seal()
        let path = directory.segmentPath(firstSeq: 1)
        var bytes = try FileIO.readAll(path)
        let table = try #require(SeekTable.read(fromFileAt: path))
        // The first entry's decompressed size, one more than it is.
        let at = bytes.count - table.encodedSize + 12
        bytes[at] &+= 1
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let report = JournalVerifier(directory: directory).verify()
        #expect(report.problems.contains { $0.message.contains("the seek table puts frame 1") }, "\(report.problems)")
    }

    /// A journal whend 0.1.0 wrote — two segments sealed with its own index only, and the active
    /// one it was killed with — reads, verifies, and recovers: the recovered segment gets the
    /// seek table, the sealed ones stay as they were and still read as sealed.
    @Test func aJournalOfTheFirstReleaseReadsVerifiesAndRecovers() throws {
        let directory = JournalDirectory(path: temporaryDirectory("journal-0.1"))
        try directory.create()
        let fixtures = repositoryRoot + "/Tests/Fixtures/journal-0.1"
        for name in try FileManager.default.contentsOfDirectory(atPath: fixtures).sorted() {
            try FileManager.default.copyItem(atPath: fixtures + "/" + name, toPath: directory.path + "/" + name)
        }
        let segments = directory.segments()
        try #require(segments.count == 3)
        for sealed in segments.dropLast() {
            #expect(SegmentIndex.read(fromFileAt: sealed.path) != nil, "\(sealed.path) reads as sealed")
            #expect(SeekTable.read(fromFileAt: sealed.path) == nil, "written before the seek table")
        }
        let before = JournalVerifier(directory: directory).verify()
        #expect(before.problems.isEmpty && before.records == 160, "\(before.problems)")
        let (lines, problems) = readAll(directory)
        #expect(problems.isEmpty && lines.count == 160)

        let active = try #require(segments.last)
        let result = try SegmentRecovery.recover(active)
        guard case .sealed = result.outcome else {
            Issue.record("the active segment was not sealed: \(result.outcome)")
            return
        }
        #expect(result.lastSeq == 160)
        #expect(SeekTable.read(fromFileAt: active.path) != nil)
        let after = JournalVerifier(directory: directory).verify()
        #expect(after.isClean && after.records == 160, "\(after.problems)")
        #expect(readAll(directory).lines == lines)
        let read = try readSeekable(active.path, from: 0)
        #expect(read.line.hasPrefix(#"{"_seq":129,"#))
    }
}
