import Foundation
import Synchronization
import WhendControl
import WhendRecord
import WhendWire

/// The event lines whend refused lately, for a person to look at (`whenctl rejections`, the
/// debugger page): the newest `capacity`, each with its error, the start of the line and its
/// sender. Bounded whatever clients send: at most `capacity` × (`Rejection.lineLimit` + a few
/// hundred bytes).
final class RecentRejections: Sendable {
    static let capacity = 100

    private struct Ring {
        var entries: [Rejection] = []
        var next = 0
    }
    private let ring = Mutex(Ring())

    /// Keeps one refusal; `line` is the line as it came (nil when it was not kept: too large).
    func add(_ error: WireError, line: UnsafeBufferPointer<UInt8>?, helloApp: [UInt8]?, sender: PeerCredentials) {
        let kept = line.map { UnsafeBufferPointer(rebasing: $0.prefix(Rejection.lineLimit)) }
        // The line's own app when it is an object whend can read, else the connection's.
        let app = line.flatMap { try? StoredRecord.scan($0).app } ?? helloApp
        // The message quotes what the line held (a key, a type): cut like the line, so that
        // each entry stays within its bound whatever a client sends.
        let message = String(decoding: error.message.utf8.prefix(Rejection.lineLimit), as: UTF8.self)
        let rejection = Rejection(
            time: Self.now(), code: error.code.rawValue, message: message,
            line: kept.map { String(decoding: $0, as: UTF8.self) }, truncated: (line?.count ?? 0) > Rejection.lineLimit,
            app: app.map { String(decoding: $0.prefix(255), as: UTF8.self) }, pid: sender.pid, uid: sender.uid)
        ring.withLock { r in
            if r.entries.count < Self.capacity {
                r.entries.append(rejection)
            } else {
                r.entries[r.next] = rejection
                r.next = (r.next + 1) % Self.capacity
            }
        }
    }

    /// Oldest first.
    var list: [Rejection] {
        ring.withLock { r in Array(r.entries[r.next...] + r.entries[..<r.next]) }
    }

    private static func now() -> String {
        var clock = RFC3339Clock()
        var out: [UInt8] = []
        clock.appendNow(to: &out)
        return String(decoding: out, as: UTF8.self)
    }
}
