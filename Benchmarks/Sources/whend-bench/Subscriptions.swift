import BenchSupport
import Foundation
import WhendWire

// Subscriptions (PROTOCOL.md §9): how soon a subscriber has a record once its sender has the
// ack, and what subscribers connected cost ingest.

/// A subscriber's latency at a steady 10k events/s (sorted, µs), and ingest's rate with no
/// subscriber and with 100 (medians of the rounds, interleaved).
@MainActor func measureSubscriptions() throws -> (latency: [Double], none: Double, hundred: Double) {
    say("a subscriber's latency from the ack to the record, at a steady 10k events/s…")
    let latency = try subscriberLatency(rate: 10_000, count: min(100_000, allLines.count))
    var none: [Double] = []
    var hundred: [Double] = []
    for round in 1...rounds {
        say("round \(round)/\(rounds): whend ingest with no subscriber, then with 100…")
        none.append(try ingestBeside(subscribers: 0, round: round))
        hundred.append(try ingestBeside(subscribers: 100, round: round))
    }
    return (latency, none.sorted()[none.count / 2], hundred.sorted()[hundred.count / 2])
}

func printSubscriptions(_ s: (latency: [Double], none: Double, hundred: Double)) {
    print(
        "a subscriber (PROTOCOL.md §9) at a steady 10k events/s, whend as shipped: from its sender's ack to the record, p50 \(fmt(percentile(s.latency, 0.5))) µs, p99 \(fmt(percentile(s.latency, 0.99))) µs"
    )
    print(
        "ingest, 4 connections, acks, fsync, beside 100 subscribers each following a session of its own: \(fmt(s.hundred)) events/s; with none: \(fmt(s.none)) events/s (\(fmt(s.hundred / s.none, 2)) ×)"
    )
}

/// A subscriber that reads everything whend sends, noting when each record came.
final class TimedSubscriber: @unchecked Sendable {
    // Unchecked: `arrivals` is written by the reading thread only, read after `done`.
    private let fd: Int32
    private(set) var arrivals: [Double] = []
    private(set) var lines = 0
    let done = DispatchSemaphore(value: 0)

    /// Connects and subscribes with `request` (the object of `{"subscribe":…}`); returns once
    /// whend said `subscribed`.
    init(socket: String, request: String, keepTimes: Bool) throws {
        let fd = try connectUnix(socket)
        self.fd = fd
        Array(#"{"subscribe":\#(request)}"#.utf8 + [0x0A]).withUnsafeBytes { sendAll(fd, $0) }
        let subscribed = DispatchSemaphore(value: 0)
        Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            var first = true
            // The current line's first three bytes (lines cross reads): a record's are {"_.
            var head: [UInt8] = []
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                let now = monotonicSeconds()
                for i in 0..<n {
                    let b = buffer[i]
                    if b != 0x0A {
                        if head.count < 3 { head.append(b) }
                        continue
                    }
                    if head == Array(#"{"_"#.utf8) {
                        if keepTimes { arrivals.append(now) }
                    } else if first {
                        first = false
                        subscribed.signal()
                    }
                    lines += 1
                    head.removeAll(keepingCapacity: true)
                }
            }
            if first { subscribed.signal() }
            done.signal()
        }.start()
        subscribed.wait()
    }

    func close() {
        shutdown(fd, Int32(SHUT_RDWR))
        done.wait()
        Glibc.close(fd)
    }
}

/// A subscriber's latency from the ack its sender got to the record's arrival, at a steady
/// `rate`, on whend as it ships; sorted, in µs.
@MainActor func subscriberLatency(rate: Int, count: Int) throws -> [Double] {
    let (daemon, socket) = try startWhend(work + "/whend-subscriber-latency", shipped: true)
    defer { _ = daemon.stop() }
    // Clients' events only: the k-th such record is the k-th line sent (one connection).
    let subscriber = try TimedSubscriber(socket: socket, request: #"{"from":"now","derived":false}"#, keepTimes: true)
    let lines = Array(allLines.prefix(count))
    let acked = try pacedSend(socket: socket, lines: lines, rate: rate).acked
    let deadline = Date().addingTimeInterval(30)
    while subscriber.arrivals.count < count && Date() < deadline { usleep(10_000) }
    subscriber.close()
    let arrivals = subscriber.arrivals
    guard arrivals.count >= count else {
        say("the subscriber had \(arrivals.count) of \(count) records")
        return []
    }
    return (0..<count).map { (arrivals[$0] - acked[$0]) * 1e6 }.sorted()
}

/// Ingest's rate (4 connections, acks, fsync, as the ingest rows) with `subscribers` connected,
/// each following a session of its own that the corpus does not have: whend examines every
/// record for each of them.
@MainActor func ingestBeside(subscribers count: Int, round: Int) throws -> Double {
    let (daemon, socket) = try startWhend(work + "/whend-subscribers-\(count)-\(round)")
    defer { _ = daemon.stop() }
    let subscribers = try (0..<count).map {
        try TimedSubscriber(socket: socket, request: #"{"from":"now","session":"watcher-\#($0)"}"#, keepTimes: false)
    }
    let result = try blast(socket: socket, parts: parts(4), hello: #"{"hello":{"protocol":1,"acks":true}}"#)
    for s in subscribers { s.close() }
    return Double(corpusEvents) / result.seconds
}
