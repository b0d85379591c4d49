import Foundation
import WhendJournal
import WhendWire

let directory = JournalDirectory(path: "/dev/shm/whend-fuzz-segment-\(getpid())")

/// Any bytes as a segment: verify, the reader (cat) and recovery report damage, never crash.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSegment(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    try? directory.create()
    let path = directory.segmentPath(firstSeq: 1)
    let file = fopen(path, "wb")!
    fwrite(data, 1, size, file)
    fclose(file)

    let report = JournalVerifier(directory: directory).verify()
    _ = report.isClean
    var seen = 0
    JournalReader(directory: directory).read { record, _ in
        seen += 1
        _ = try? record.fields()
        return true
    } onProblem: { _ in
    }
    let result = try? SegmentRecovery.recover(SegmentFile(firstSeq: 1, path: path))
    // A segment recovery rewrote is sealed and clean. (One that ends in a valid index counts as
    // sealed and is left as it is, damaged or not: that is verify's to report.)
    if case .sealed = result?.outcome {
        let after = JournalVerifier(directory: directory).verify()
        precondition(after.isClean, "recovery left a segment that does not verify: \(after.problems)")
    }
    unlink(path)
    return 0
}
