import Foundation
import Testing
import WhendJournal
import WhendWire

/// The memory whend may use in these tests, from the bound docs/guarantees.md states for the default
/// configuration: 2 × 16 MiB pending + 6 MB de-duplication window + per connection ~6 KiB and at
/// most one 64 KiB partial line + ~25 MiB for the process, with room for allocator slack.
let memoryBoundKiB = 200 * 1024

func residentKiB(_ pid: pid_t) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0
    }
    return 0
}

/// Runs `hostile` on a thread while a well-behaved client sends 500 events with acks; then
/// checks that whend is up, stayed within its memory bound, and stored every good event.
func withWellBehavedClient(
    _ name: String, arguments: [String] = [], hostile: @escaping @Sendable (TestDaemon) -> Void
) throws {
    let daemon = TestDaemon.live(name, arguments: arguments)
    try daemon.start()
    let pid = try #require(daemon.process?.processIdentifier)
    let done = DispatchSemaphore(value: 0)
    Thread {
        hostile(daemon)
        done.signal()
    }.start()
    usleep(100_000)
    let hello = #"{"hello":{"protocol":1,"app":"good","session":"g","acks":true}}"#
    for round in 0..<5 {
        let events = (0..<100).map { #"{"type":"when","name":"good","id":"g\#(round * 100 + $0)"}"# }
        let answers = try exchange(daemon.socketPath, [hello] + events)
        #expect(answers.acks.last == 100, "round \(round): \(answers.errors)")
    }
    _ = done.wait(timeout: .now() + 60)
    #expect(daemon.process?.isRunning == true, "whend died: \(daemon.log)")
    #expect(residentKiB(pid) < memoryBoundKiB, "whend peaked at \(residentKiB(pid)) KiB")
    daemon.stop()
    let good = Set(daemon.records().filter { $0["app"] as? String == "good" }.compactMap { $0["id"] as? String })
    #expect(good.count == 500)
}

/// Sends without blocking for longer than `seconds`; returns the bytes sent.
@discardableResult
func sendFor(_ fd: Int32, _ bytes: [UInt8], seconds: Double) -> Int {
    let deadline = Date().addingTimeInterval(seconds)
    var sent = 0
    while sent < bytes.count && Date() < deadline {
        let n = bytes.withUnsafeBytes {
            send(fd, $0.baseAddress! + sent, min(65536, bytes.count - sent), Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
        }
        if n > 0 { sent += n } else if errno == EAGAIN { usleep(2000) } else { break }
    }
    return sent
}

@Suite(.serialized) struct HostileClientTests {
    @Test func aTenMegabyteLineThatNeverEnds() throws {
        try withWellBehavedClient("endless") { daemon in
            guard let c = try? BlockingSocket(path: daemon.socketPath) else { return }
            // 10 MB without a newline, and the connection left open: never buffered.
            let sent = sendFor(c.fd, [UInt8](repeating: UInt8(ascii: "x"), count: 10 << 20), seconds: 20)
            #expect(sent == 10 << 20)
        }
    }

    @Test func randomBytesInvalidUTF8AndDeepNesting() throws {
        try withWellBehavedClient("garbage") { daemon in
            var rng = SystemRandomNumberGenerator()
            var garbage = (0..<(1 << 20)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            garbage += Array(
                ("\n" + String(repeating: "[", count: 20_000) + String(repeating: "]", count: 20_000) + "\n").utf8)
            garbage +=
                Array("{\"type\":\"screen\",\"name\":\"".utf8) + [0xC0, 0xAF, 0xED, 0xA0, 0x80] + Array("\"}\n".utf8)
            let answers = try? exchange(daemon.socketPath, [], raw: garbage)
            let codes = Set((answers ?? []).errors.map(\.code))
            #expect(
                codes.isSubset(of: [
                    "invalid_json", "invalid_utf8", "not_an_object", "too_large", "missing_field", "invalid_field",
                    "unknown_type", "reserved_field",
                ]))
        }
    }

    @Test func aThousandConcurrentConnections() throws {
        try withWellBehavedClient("thousand") { daemon in
            var connections: [BlockingSocket] = []
            for i in 0..<1000 {
                guard let c = try? BlockingSocket(path: daemon.socketPath) else { break }
                try? c.send(
                    #"{"hello":{"protocol":1,"app":"crowd","session":"c\#(i)","acks":true}}"# + "\n"
                        + #"{"type":"screen","name":"S","id":"x"}"# + "\n")
                connections.append(c)
            }
            #expect(connections.count == 1000)
            var acked = 0
            for c in connections {
                c.finishSending()
                var last: Int?
                try? c.receiveLines { line in
                    if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                        let a = o["ack"] as? Int
                    {
                        last = a
                    }
                }
                if last == 1 { acked += 1 }
            }
            #expect(acked == 1000)
        }
    }

    @Test func aClientThatAsksForAcksAndNeverReadsThem() throws {
        try withWellBehavedClient("deaf") { daemon in
            guard let c = try? BlockingSocket(path: daemon.socketPath) else { return }
            // Every line an error, so replies pile up fast: whend stops reading from this client
            // rather than buffering replies it cannot deliver.
            var flood = Array((#"{"hello":{"protocol":1,"acks":true}}"# + "\n").utf8)
            flood += Array(String(repeating: "not json at all, only errors\n", count: 400_000).utf8)
            let sent = sendFor(c.fd, flood, seconds: 5)
            #expect(sent < flood.count, "whend read everything from a client that never reads")
        }
    }

    @Test func oneBytePerSecond() throws {
        try withWellBehavedClient("slow") { daemon in
            guard let c = try? BlockingSocket(path: daemon.socketPath) else { return }
            for byte in Array(#"{"type""#.utf8) {
                try? c.send([byte])
                sleep(1)
            }
        }
    }

    @Test func tenThousandConnectCloseCycles() throws {
        let daemon = TestDaemon.live("churn")
        try daemon.start()
        let pid = try #require(daemon.process?.processIdentifier)
        func descriptors() -> Int {
            (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? 0
        }
        let before = descriptors()
        for _ in 0..<10_000 {
            let connection = try BlockingSocket(path: daemon.socketPath)
            withExtendedLifetime(connection) {}  // connected, then closed at once
        }
        // Let whend notice the last closes.
        var after = descriptors()
        for _ in 0..<50 where after > before + 5 {
            usleep(100_000)
            after = descriptors()
        }
        #expect(after <= before + 5, "descriptors \(before) → \(after)")
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"After"}"#]).acks.last == 1)
        #expect(daemon.process?.isRunning == true)
    }
}
