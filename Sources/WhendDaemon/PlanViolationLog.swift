import Foundation
import Synchronization
import WhendControl
import WhendRecord
import WhendTrackingPlan
import WhendWire

/// The tracking plan's violations since whend started, for `whenctl plan violations` and the
/// debugger page: a count per event and rule, and the newest `capacity` examples. Touched only
/// when an event breaks the plan.
///
/// A `When` name the plan does not list is counted under the empty name: names are the
/// clients' to choose, and a count per name would grow with whatever they send.
final class PlanViolationLog: Sendable {
    static let capacity = 100

    struct Key: Hashable, Sendable {
        var event: String
        var rule: String
    }

    private struct State {
        var counts: [Key: Int] = [:]
        var ring: [PlanViolationReport.Example] = []
        var next = 0
    }
    private let state = Mutex(State())

    /// The key a violation is counted under.
    static func key(_ violation: PlanViolation) -> Key {
        Key(event: violation.planned ? violation.event : "", rule: violation.rule.rawValue)
    }

    func add(_ violation: PlanViolation, stored: Bool, line: UnsafeBufferPointer<UInt8>, app: [UInt8]?) {
        let example = PlanViolationReport.Example(
            time: Self.now(), event: String(violation.event.prefix(255)), rule: violation.rule.rawValue,
            path: String(violation.path.prefix(Rejection.lineLimit)),
            message: String(violation.description.prefix(Rejection.lineLimit)), stored: stored,
            app: app.map { String(decoding: $0.prefix(255), as: UTF8.self) },
            line: String(decoding: line.prefix(Rejection.lineLimit), as: UTF8.self))
        let key = Self.key(violation)
        state.withLock { s in
            s.counts[key, default: 0] += 1
            if s.ring.count < Self.capacity {
                s.ring.append(example)
            } else {
                s.ring[s.next] = example
                s.next = (s.next + 1) % Self.capacity
            }
        }
    }

    /// Counts by event then rule; examples oldest first.
    func report(plan: String, mode: String) -> PlanViolationReport {
        state.withLock { s in
            let counts = s.counts.map {
                PlanViolationReport.Count(event: $0.key.event, rule: $0.key.rule, count: $0.value)
            }
            .sorted { ($0.event, $0.rule) < ($1.event, $1.rule) }
            return PlanViolationReport(
                plan: plan, mode: mode, counts: counts, latest: Array(s.ring[s.next...] + s.ring[..<s.next]))
        }
    }

    private static func now() -> String {
        var clock = RFC3339Clock()
        var out: [UInt8] = []
        clock.appendNow(to: &out)
        return String(decoding: out, as: UTF8.self)
    }
}
