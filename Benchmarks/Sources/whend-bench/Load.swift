import BenchSupport
import Foundation
import WhendWire

func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) {
    var done = 0
    while done < bytes.count {
        let n = send(fd, bytes.baseAddress! + done, min(1 << 20, bytes.count - done), Int32(MSG_NOSIGNAL))
        if n <= 0 {
            if n < 0 && errno == EINTR { continue }
            return
        }
        done += n
    }
}

/// Reads what the daemon answers until it closes; returns the highest ack and the error count.
func drainAnswers(_ fd: Int32, onAck: (UInt64) -> Void = { _ in }) -> (ack: UInt64, errors: Int) {
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    var pending: [UInt8] = []
    var highest: UInt64 = 0
    var errors = 0
    while true {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        pending += buffer[0..<n]
        var start = 0
        while let nl = pending[start...].firstIndex(of: 0x0A) {
            let line = pending[start..<nl]
            start = nl + 1
            // {"ack":N}
            if line.starts(with: Array(#"{"ack":"#.utf8)) {
                var v: UInt64 = 0
                for b in line.dropFirst(7) where b >= 0x30 && b <= 0x39 { v = v * 10 + UInt64(b - 0x30) }
                highest = max(highest, v)
                onAck(v)
            } else if line.starts(with: Array(#"{"error""#.utf8)) {
                errors += 1
            }
        }
        pending.removeFirst(start)
    }
    return (highest, errors)
}

struct BlastResult {
    var seconds: Double
    var lastAcks: [UInt64]
    var errors: Int
}

/// Sends each part over its own connection at full speed, half-closes, and waits until the
/// daemon has answered everything and closed.
func blast(socket: String, parts: [[UInt8]], hello: String?) throws -> BlastResult {
    let fds = try parts.map { _ in try connectUnix(socket) }
    let results = ResultSlots(count: parts.count)
    let group = DispatchGroup()
    let start = monotonicSeconds()
    for (i, part) in parts.enumerated() {
        let fd = fds[i]
        group.enter()
        Thread {
            let reader = Thread {
                let (ack, errors) = drainAnswers(fd)
                results.set(i, ack: ack, errors: errors)
                group.leave()
            }
            reader.start()
            if let hello { Array((hello + "\n").utf8).withUnsafeBytes { sendAll(fd, $0) } }
            part.withUnsafeBytes { sendAll(fd, $0) }
            shutdown(fd, Int32(SHUT_WR))
        }.start()
    }
    group.wait()
    let seconds = monotonicSeconds() - start
    for fd in fds { close(fd) }
    return BlastResult(seconds: seconds, lastAcks: results.acks, errors: results.errors)
}

final class ResultSlots: @unchecked Sendable {
    // Unchecked: each slot is written by one thread, read after the group is done.
    private let lock = NSLock()
    private(set) var acks: [UInt64]
    private(set) var errors = 0
    init(count: Int) { acks = Array(repeating: 0, count: count) }
    func set(_ i: Int, ack: UInt64, errors e: Int) {
        lock.withLock {
            acks[i] = ack
            errors += e
        }
    }
}

/// Sends `lines` on one connection at a steady `rate` (events/s) in 1 ms ticks, with acks, and
/// measures each event's latency from its send to the ack that covers it.
func pacedLatency(socket: String, lines: [[UInt8]], rate: Int) throws -> (latenciesMicros: [Double], seconds: Double) {
    let paced = try pacedSend(socket: socket, lines: lines, rate: rate)
    return (zip(paced.acked, paced.sent).map { ($0 - $1) * 1e6 }, paced.seconds)
}

/// Sends `lines` on one connection at a steady `rate` (events/s) in 1 ms ticks, with acks: when
/// each line went out, when the ack that covers it came, and how long it all took.
func pacedSend(socket: String, lines: [[UInt8]], rate: Int) throws -> (sent: [Double], acked: [Double], seconds: Double)
{
    let fd = try connectUnix(socket)
    let count = lines.count
    let slots = LatencySlots(count: count + 1)
    let sentAt = slots.sentAt
    let done = DispatchSemaphore(value: 0)
    Thread {
        var covered: UInt64 = 0
        _ = drainAnswers(fd) { ack in
            let now = monotonicSeconds()
            while covered < ack {
                covered += 1
                slots.ackedAt[Int(covered)] = now
            }
        }
        done.signal()
    }.start()
    Array(#"{"hello":{"protocol":1,"app":"bench","acks":true}}"#.utf8 + [0x0A]).withUnsafeBytes { sendAll(fd, $0) }
    let perTick = max(1, rate / 1000)
    var next = monotonicSeconds()
    let start = next
    var i = 0
    var chunk: [UInt8] = []
    while i < count {
        chunk.removeAll(keepingCapacity: true)
        let now = monotonicSeconds()
        let end = min(count, i + perTick)
        for k in i..<end {
            chunk += lines[k]
            chunk.append(0x0A)
            sentAt[k + 1] = now
        }
        chunk.withUnsafeBytes { sendAll(fd, $0) }
        i = end
        next += 0.001
        let wait = next - monotonicSeconds()
        if wait > 0 { usleep(useconds_t(wait * 1e6)) }
    }
    shutdown(fd, Int32(SHUT_WR))
    done.wait()
    close(fd)
    let seconds = monotonicSeconds() - start
    return (
        Array(UnsafeBufferPointer(start: sentAt + 1, count: count)),
        Array(UnsafeBufferPointer(start: slots.ackedAt + 1, count: count)), seconds
    )
}

func percentile(_ sorted: [Double], _ p: Double) -> Double {
    guard !sorted.isEmpty else { return .nan }
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

/// Send and ack times by line number.
final class LatencySlots: @unchecked Sendable {
    // Unchecked: slot k is written by the sender before line k goes out, and read by the reader
    // only once an ack covers line k, which the daemon sends after it has read that line.
    let sentAt: UnsafeMutablePointer<Double>
    let ackedAt: UnsafeMutablePointer<Double>

    init(count: Int) {
        sentAt = .allocate(capacity: count)
        ackedAt = .allocate(capacity: count)
        sentAt.initialize(repeating: 0, count: count)
        ackedAt.initialize(repeating: 0, count: count)
    }

    deinit {
        sentAt.deallocate()
        ackedAt.deallocate()
    }
}
