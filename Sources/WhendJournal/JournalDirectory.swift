import Foundation
import WhendSystem
import WhendWire

/// One segment file of the journal, named by the `_seq` of its first record.
package struct SegmentFile: Sendable, Comparable {
    package var firstSeq: UInt64
    package var path: String

    package init(firstSeq: UInt64, path: String) {
        self.firstSeq = firstSeq
        self.path = path
    }

    package static func < (a: SegmentFile, b: SegmentFile) -> Bool { a.firstSeq < b.firstSeq }

    /// `00000000000000000001.jsonl.zst`: zero-padded so that names sort in `_seq` order.
    package static func name(firstSeq: UInt64) -> String {
        let digits = String(firstSeq)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".jsonl.zst"
    }
}

/// The journal directory: where segments are, and in which order.
package struct JournalDirectory: Sendable {
    package let path: String

    package init(path: String) {
        self.path = path
    }

    /// The journal directory under a state directory (PROTOCOL.md §7).
    package init(stateDirectory: String) {
        self.path = stateDirectory + "/journal"
    }

    package func create() throws {
        do {
            try DurableFile.createDirectory(path)
        } catch {
            throw JournalIOError(operation: error.operation, path: error.path, errno: error.code)
        }
    }

    package func segmentPath(firstSeq: UInt64) -> String { path + "/" + SegmentFile.name(firstSeq: firstSeq) }

    /// The segments, oldest first. Files that are not segments are left alone.
    package func segments() -> [SegmentFile] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return [] }
        var result: [SegmentFile] = []
        for name in names where name.hasSuffix(".jsonl.zst") {
            let stem = name.dropLast(".jsonl.zst".count)
            // Named by its first `_seq`, which is never 0: a file named 0 is none of whend's.
            guard !stem.isEmpty, stem.allSatisfy(\.isNumber), let seq = UInt64(stem), seq > 0 else { continue }
            result.append(SegmentFile(firstSeq: seq, path: path + "/" + name))
        }
        return result.sorted()
    }

    /// How many segments there are and their bytes on disk together.
    package func usage() -> (segments: Int, bytes: Int64) {
        let all = segments()
        return (all.count, all.reduce(Int64(0)) { $0 + (FileIO.size($1.path) ?? 0) })
    }
}
