import Foundation
import WhendConfiguration
import WhendJournal
import WhendWire

// The properties the fuzz targets (Fuzz/, a package of their own built with
// `--sanitize=fuzzer`) check, one function per input format. They live here, in whend's own
// package, so that they reach the parsers through `package` access: this product is the only
// public surface the fuzz targets need.

/// Any bytes, as a connection's stream: every line gets an accept or an error code, never a
/// crash; every accepted event becomes a stored record that is itself one valid JSON object
/// (`eventLineOutcomes` checks both as it goes); and an event is taken for a resend exactly when
/// an earlier one was stored with the same `app`, `session` and `id`.
public func fuzzEventLine(_ input: UnsafeBufferPointer<UInt8>) -> CInt {
    let outcomes = eventLineOutcomes(input)
    // A resend is an event whose stored identity is an earlier one's, and nothing else.
    precondition(
        withResendsByIdentity(outcomes) == outcomes,
        "the resend keys disagree with the stored records: \(outcomes)")
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
    // A segment recovery rewrote is sealed and clean, but for the lines it kept that are no
    // sound record (it keeps them, and the records after them, rather than lose acknowledged
    // records): verify names each, and nothing else. (One that ends in a valid index counts as
    // sealed and is left as it is, damaged or not: that is verify's to report.)
    if let result, case .sealed = result.outcome {
        let after = JournalVerifier(directory: directory).verify()
        precondition(
            after.problems.count <= result.unreadableLines,
            "recovery left a segment that does not verify (\(result.unreadableLines) unreadable lines kept): \(after.problems)"
        )
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

/// Any bytes as what a plugin returns, ingest middleware or a pipeline stage deriving a record:
/// refused, or stored as exactly one line, in canonical form, that reads (Foundation's
/// `JSONSerialization`, an independent reader) as the same JSON value, its `_` members aside —
/// the same through both paths. On a refusal a batch being built is left as it was.
public func fuzzPluginOutput(_ input: UnsafeBufferPointer<UInt8>) -> CInt {
    let original = Array(#"{"type":"when","name":"x","_rt":"2026-11-21T13:35:00.000000Z","_pid":7}"#.utf8)
    let trusted = Array(#""_origin":"p","_cause":3"#.utf8)
    let ingest: [UInt8]? = original.withUnsafeBufferPointer { try? IngestRewrite.body(output: input, original: $0) }
    let prior = Array("prior".utf8)
    var batch = prior
    let derivedOK = trusted.withUnsafeBufferPointer { t in
        (try? IngestRewrite.appendDerivedBody(output: input, trustedMembers: t, to: &batch)) != nil
    }
    precondition((ingest != nil) == derivedOK, "the ingest and the pipeline paths disagree on refusing it")
    guard let ingest, derivedOK else {
        precondition(batch == prior, "a refused record changed the batch")
        return 0
    }
    let expected = objectWithoutTrusted(Array(input))
    for stored in [[UInt8(ascii: "{")] + ingest, [UInt8(ascii: "{")] + batch.dropFirst(prior.count)] {
        precondition(!stored.contains(0x0A) && !stored.contains(0x0D), "stored over more than one line")
        // Canonical: brought to canonical form again, it is the same. (The scanner's own note,
        // `Member.canonical`, may say no where the form is kept: an unpaired surrogate's escape
        // is always rewritten, to itself.)
        var again: [UInt8] = []
        stored.withUnsafeBufferPointer { appendCanonicalJSON($0, to: &again) }
        precondition(
            again == stored, "stored in another form than the canonical: \(String(decoding: stored, as: UTF8.self))")
        let valid: Bool = stored.withUnsafeBufferPointer { s in
            var scanner = JSONScanner(s)
            do { try scanner.scanObject { _ throws(WireError) in } } catch { return false }
            return true
        }
        precondition(valid, "stored as invalid JSON: \(String(decoding: stored, as: UTF8.self))")
        // Foundation refuses some JSON whend takes (a surrogate without its partner): then only
        // whend's own reading can be compared, done above.
        if let expected {
            precondition(
                objectWithoutTrusted(stored) == expected,
                "stored as another value: \(String(decoding: stored, as: UTF8.self))")
        }
    }
    return 0
}

private func objectWithoutTrusted(_ bytes: [UInt8]) -> NSDictionary? {
    guard let o = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] else { return nil }
    // By the first byte, as whend decides ("_" and a combining mark are one Character).
    return o.filter { $0.key.utf8.first != UInt8(ascii: "_") } as NSDictionary
}

/// An outcome of `eventLineOutcomes` with its stored record in canonical form: what an earlier
/// whend stored as the client wrote it, this one stores canonical (PROTOCOL.md §7), and
/// `make fuzz-differential` compares the two so.
public func canonicalOutcome(_ outcome: String) -> String {
    guard outcome.hasPrefix("event "), let json = outcome.utf8.firstIndex(of: UInt8(ascii: "{")) else {
        return outcome
    }
    var out = Array(outcome.utf8[..<json])
    Array(outcome.utf8[json...]).withUnsafeBufferPointer { appendCanonicalJSON($0, to: &out) }
    return String(decoding: out, as: UTF8.self)
}

/// `outcomes` of `eventLineOutcomes` with each event's resend marker worked out again from the
/// stored records alone: the first earlier event with an `id` whose stored `app`, `session` (or
/// none) and `id` are the same strings. Compared as stored, in canonical form — two spellings
/// of one string are one, two strings are two even where decoding makes them alike (surrogates
/// without their partner all decode to U+FFFD) — or, with `decoded`, compared decoded, which is
/// how whend keyed resends until it told those strings apart. An outcome list that is its own
/// result follows that rule.
public func withResendsByIdentity(_ outcomes: [String], decoded: Bool = false) -> [String] {
    var identities: [[[UInt8]?]] = []
    return outcomes.map { outcome in
        guard outcome.hasPrefix("event "), let json = outcome.utf8.firstIndex(of: UInt8(ascii: "{")) else {
            return outcome
        }
        let record = Array(outcome.utf8[json...])
        var parts: [[UInt8]?] = [nil, nil, nil]  // app, session, id
        record.withUnsafeBufferPointer { bytes in
            var scanner = JSONScanner(bytes)
            try? scanner.scanObject { m throws(WireError) in
                guard m.kind == .string else { return }
                let key = String(decoding: UnsafeBufferPointer(rebasing: bytes[m.key]), as: UTF8.self)
                guard let slot = ["app", "session", "id"].firstIndex(of: key) else { return }
                let raw = UnsafeBufferPointer(rebasing: bytes[(m.value.lowerBound + 1)..<(m.value.upperBound - 1)])
                var canonical: [UInt8] = []
                if m.valueHasEscapes {
                    appendCanonicalString(raw, to: &canonical)
                    canonical = Array(canonical.dropFirst().dropLast())
                } else {
                    canonical = Array(raw)
                }
                parts[slot] = decoded ? canonical.withUnsafeBufferPointer { decodeJSONString($0) } : canonical
            }
        }
        var marker = "-"
        if parts[2] != nil, parts[0] != nil {
            marker = identities.firstIndex(of: parts).map(String.init) ?? "new"
            identities.append(parts)
        }
        let rest = outcome.dropFirst("event ".count).drop { $0 != " " }
        return "event \(marker)\(rest)"
    }
}
