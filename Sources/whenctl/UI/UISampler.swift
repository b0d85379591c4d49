import Foundation
import WhendControl

/// Asks whend for its status every `interval` seconds, on a thread of its own, and keeps the
/// last `capacity` samples (ten minutes at the defaults): what the page's rates are drawn from.
/// The page's rates are differences between samples, so that a page opened late sees the
/// minutes before it too.
final class UISampler: @unchecked Sendable {
    // Unchecked: `samples`, `latest` and `problem` are guarded by `lock`.
    struct Sample {
        var time: Double
        var received: Int
        var rejected: Int
        var lastSeq: UInt64
        var pipelines: [String: (cursor: UInt64, lag: UInt64)]
    }

    let interval: TimeInterval
    let capacity: Int
    private let control: ControlOptions
    private let lock = NSLock()
    private var samples: [Sample] = []
    private var latest: StatusAnswer?
    private var problem: String?

    init(control: ControlOptions, interval: TimeInterval = 2, capacity: Int = 300) {
        self.control = control
        self.interval = interval
        self.capacity = capacity
    }

    func start() {
        let thread = Thread { [self] in
            while true {
                sample()
                Thread.sleep(forTimeInterval: interval)
            }
        }
        thread.name = "whenctl-ui-sampler"
        thread.start()
    }

    private func sample() {
        do {
            let answer = try control.answer(.status, timeout: 10)
            guard answer.ok, let status = answer.status else {
                throw Failure(answer.error ?? "whend answered status without one")
            }
            let sample = Sample(
                time: Date().timeIntervalSince1970, received: status.eventsReceived,
                rejected: status.eventsRejected.values.reduce(0, +), lastSeq: status.journal.lastSeq,
                pipelines: Dictionary(
                    status.pipelines.map { ($0.name, (cursor: $0.cursor, lag: $0.lag)) },
                    uniquingKeysWith: { a, _ in a }))
            lock.withLock {
                latest = status
                problem = nil
                samples.append(sample)
                if samples.count > capacity { samples.removeFirst(samples.count - capacity) }
            }
        } catch {
            lock.withLock { problem = "\(error)" }
        }
    }

    /// The journal's last `_seq` at the last sample; nil when whend has not answered status.
    var lastSeq: UInt64? { lock.withLock { latest?.journal.lastSeq } }

    /// `{"status": …, "problem": …, "interval": s, "samples": [{"t","received","rejected","last_seq","pipelines":{name:{cursor,lag}}}]}`.
    func overview() -> [String: Any] {
        let (status, problem, samples) = lock.withLock { (latest, self.problem, self.samples) }
        var out: [String: Any] = ["interval": interval, "capacity": capacity]
        if let status, let data = try? JSONEncoder().encode(status),
            let object = try? JSONSerialization.jsonObject(with: data)
        {
            out["status"] = object
        }
        if let problem { out["problem"] = problem }
        out["samples"] = samples.map { s -> [String: Any] in
            [
                "t": s.time, "received": s.received, "rejected": s.rejected, "last_seq": s.lastSeq,
                "pipelines": s.pipelines.mapValues { ["cursor": $0.cursor, "lag": $0.lag] },
            ]
        }
        return out
    }
}
