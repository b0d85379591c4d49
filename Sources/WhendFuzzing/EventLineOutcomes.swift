import Foundation
import WhendRecord
import WhendWire

// This file is also compiled into an older WhendWire (`make fuzz-differential`, which copies it
// there without the imports above: that WhendWire held the stored-record format too), so that
// the same walk runs over both scanners: it uses only the wire API that has been stable since
// the protocol's first version.

/// What the event protocol makes of `input` as one connection's stream, a line at a time, in a
/// form that compares across versions of the scanner: an error's code and message, a hello's
/// defaults, or an accepted event's stored body (its `_rt` blanked, the time of the run) and
/// which earlier event of the input it is a resend of. Checks as it goes that every accepted
/// event is stored as one valid JSON object of its type.
public func eventLineOutcomes(_ input: UnsafeBufferPointer<UInt8>) -> [String] {
    var framer = LineFramer(maxLineBytes: 4096)
    var encoder = RecordEncoder(credentials: PeerCredentials(pid: 1, uid: 2, gid: 3, comm: "fuzz"))
    var members: [EventMember] = []
    var first = true
    var stored: [UInt8] = []
    var keys: [DedupKey] = []
    var outcomes: [String] = []
    func handle(_ piece: LineFramer.Piece) {
        let line: UnsafeBufferPointer<UInt8>
        switch piece {
        case .line(let whole): line = whole
        case .tooLarge(let length):
            outcomes.append("too large \(length)")
            return
        }
        let scanned: ScannedLine
        do {
            scanned = try EventScanner.scan(line, helloAllowed: first, reusing: &members)
        } catch {
            precondition(!error.message.isEmpty, "an error without a message")
            outcomes.append("error \(error.code.rawValue) \(error.isAboutConnection) \(error.message)")
            first = false
            return
        }
        switch scanned {
        case .empty:
            outcomes.append("empty")
            return
        case .hello(let hello):
            encoder = encoder.with(hello: hello)
            let app = hello.app.map { String(decoding: $0, as: UTF8.self) } ?? "-"
            let session = hello.session.map { String(decoding: $0, as: UTF8.self) } ?? "-"
            outcomes.append("hello \(hello.acks) \(app.debugDescription) \(session.debugDescription)")
        case .event(let event):
            stored = Array("{\"_seq\":1,".utf8)
            let key = encoder.appendBody(of: event, line: line, to: &stored)
            let record = stored.withUnsafeBufferPointer { try? StoredRecord.scan($0) }
            precondition(
                record != nil,
                "an accepted event was stored as invalid JSON: \(String(decoding: stored, as: UTF8.self))")
            precondition(record?.type == event.type.rawValue, "the stored type differs from the event's")
            // Keys are random per process: compare which events share one, not the digests.
            var resendOf = "-"
            if let key {
                resendOf = keys.firstIndex(of: key).map(String.init) ?? "new"
                keys.append(key)
            }
            outcomes.append("event \(resendOf) \(String(decoding: withoutReceivedTime(stored), as: UTF8.self))")
        default:
            // A subscription (PROTOCOL.md §9). Not named: the differential target builds this file
            // against an earlier scanner, which has no such case.
            outcomes.append("subscribe \(scanned)")
        }
        first = false
    }
    framer.feed(input, handle)
    framer.finish(handle)
    return outcomes
}

/// The stored record with the value of its `_rt` (the time it was encoded) left out.
private func withoutReceivedTime(_ record: [UInt8]) -> [UInt8] {
    let key = Array(",\"_rt\":\"".utf8)
    guard record.count >= key.count,
        let start = (0...(record.count - key.count)).first(where: { record[$0..<($0 + key.count)].elementsEqual(key) }),
        let end = record[(start + key.count)...].firstIndex(of: UInt8(ascii: "\""))
    else { return record }
    return Array(record[..<(start + key.count)]) + Array(record[end...])
}
