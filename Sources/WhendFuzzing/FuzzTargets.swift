import Foundation
import WhendConfiguration
import WhendJournal
import WhendWire

// The properties the fuzz targets (Fuzz/, a package of their own built with
// `--sanitize=fuzzer`) check, one function per input format. They live here, in whend's own
// package, so that they reach the parsers through `package` access: this product is the only
// public surface the fuzz targets need.

/// Any bytes, as a connection's stream: every line gets an accept or an error code, never a
/// crash; and every accepted event becomes a stored record that is itself one valid JSON object
/// (`eventLineOutcomes` checks both as it goes).
public func fuzzEventLine(_ input: UnsafeBufferPointer<UInt8>) -> CInt {
    _ = eventLineOutcomes(input)
    return 0
}

private let directory = JournalDirectory(path: "/dev/shm/whend-fuzz-segment-\(getpid())")

/// Any bytes as a segment: verify, the reader (cat) and recovery report damage, never crash.
public func fuzzSegment(_ input: UnsafeBufferPointer<UInt8>) -> CInt {
    try? directory.create()
    let path = directory.segmentPath(firstSeq: 1)
    let file = fopen(path, "wb")!
    fwrite(input.baseAddress, 1, input.count, file)
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

/// Any bytes as a configuration file: the parser and the settings table either accept them or
/// say why (naming a line), never crash; and an accepted configuration, written back out as a
/// file, reads back to the same configuration.
public func fuzzConfiguration(_ input: UnsafeBufferPointer<UInt8>) -> CInt {
    let text = String(decoding: input, as: UTF8.self)
    var configuration = DaemonConfiguration(environment: [:])
    do {
        try Settings.apply(try Settings.parse(text, path: "fuzz.conf"), to: &configuration)
    } catch {
        precondition(error.description.hasPrefix("fuzz.conf:"), "an error that names no line: \(error)")
        return 0
    }
    let rendered = Settings.render(configuration)
    var again = DaemonConfiguration(environment: [:])
    do {
        try Settings.apply(try Settings.parse(rendered, path: "rendered.conf"), to: &again)
    } catch {
        preconditionFailure("a configuration written out does not read back: \(error)\n\(rendered)")
    }
    precondition(
        Settings.render(again) == rendered, "a configuration written out reads back different:\n\(rendered)")
    return 0
}
