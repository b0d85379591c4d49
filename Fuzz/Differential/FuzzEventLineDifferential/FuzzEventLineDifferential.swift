import Foundation
import WhendFuzzing
import WhendWireReference

/// Differential fuzzing of the event protocol: every input goes through today's scanner and
/// encoder and through an earlier version's (`make fuzz-differential FUZZ_REFERENCE=<commit>`),
/// and any line on which they disagree — accepted by one and refused by the other, another
/// error, another stored record (once both are in canonical form) — is a finding.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeBufferPointer(start: data, count: size)
    let now = WhendFuzzing.eventLineOutcomes(input)
    // Records as stored in canonical form: an earlier whend stored the client's own spacing.
    var before = WhendWireReference.eventLineOutcomes(input).map(canonicalOutcome)
    // An earlier whend keyed resends by the decoded strings, which made one event of ids that
    // differ only in which surrogate without its partner (or U+FFFD) they hold. Where its
    // markers are exactly what that rule gives, they are compared as today's rule has them:
    // the stored strings themselves. Any other difference stays one.
    if withResendsByIdentity(before, decoded: true) == before { before = withResendsByIdentity(before) }
    guard now != before else { return 0 }
    // A `ts` naming a day the calendar does not have (2026-11-31) is refused now, and was read
    // before (RFC 3339 §5.7): stored, or refused for what came after it in the scan. Not a
    // difference, if the earlier scanner read the time.
    if zip(now, before).contains(where: { today, earlier in today != earlier && refusedOnlyForTheCalendar(today) }) {
        return 0
    }
    // A first line {"subscribe":…} was an event line refused before subscriptions existed
    // (PROTOCOL.md §9 added them as a first line no v1 client sends): not a difference.
    if now.first?.hasPrefix("subscribe ") == true { return 0 }
    let line =
        zip(now, before).enumerated().first { $0.element.0 != $0.element.1 }?.offset ?? min(now.count, before.count)
    let today = line < now.count ? now[line] : "(no line)"
    let reference = line < before.count ? before[line] : "(no line)"
    FileHandle.standardError.write(
        Data("line \(line + 1) differs\n  today:     \(today)\n  reference: \(reference)\n".utf8))
    abort()
}

/// Whether `outcome` is today's refusal of a `ts` the earlier scanner would have read as a time.
func refusedOnlyForTheCalendar(_ outcome: String) -> Bool {
    guard outcome.hasPrefix("error invalid_field"), outcome.contains("\"ts\" must be an RFC 3339 time"),
        let got = outcome.range(of: "; got \"", options: .backwards), outcome.hasSuffix("\"")
    else { return false }
    let value = outcome[got.upperBound..<outcome.index(before: outcome.endIndex)]
    return WhendWireReference.RFC3339.parse(Array(value.utf8)) != nil
}
