import Foundation
import Testing
import WhendJournal
import WhendWire

/// A client as the protocol asks clients to be: it keeps what is not acked and sends it again,
/// with the same ids, after a reconnect.
final class ResendingClient: @unchecked Sendable {
    // Unchecked: `lock` guards `generated`, `acked`, `finishing` and `done`.
    let name: String
    let socketPath: String
    private let lock = NSLock()
    private var generated = 0
    private var acked = 0
    private var finishing = false
    private var done = false
    private(set) var reconnects = 0
    let finished = DispatchSemaphore(value: 0)

    init(name: String, socketPath: String) {
        self.name = name
        self.socketPath = socketPath
    }

    func event(_ n: Int) -> String {
        #"{"type":"when","name":"step","id":"\#(name)-\#(n)","params":{"n":\#(n),"pad":"\#(String(repeating: "p", count: n % 50))"}}"#
    }

    var ackedCount: Int { lock.withLock { acked } }
    var generatedCount: Int { lock.withLock { generated } }

    /// Stop making new events; keep going until every one made is acked.
    func finish() { lock.withLock { finishing = true } }

    func start() {
        Thread { [self] in
            while !lock.withLock({ done }) {
                runOneConnection()
                if !lock.withLock({ done }) {
                    reconnects += 1
                    usleep(5_000)
                }
            }
            finished.signal()
        }.start()
    }

    private func runOneConnection() {
        guard let connection = try? BlockingSocket(path: socketPath) else { return }
        let base = lock.withLock { acked }  // line 1 of this connection is event `base`
        var sentLines = 0
        var pending: [UInt8] = []
        do {
            try connection.send(#"{"hello":{"protocol":1,"app":"crash-test","session":"\#(name)","acks":true}}"# + "\n")
            while true {
                // Resend what is not acked, then new events, 25 at a time.
                let (from, to, stop) = lock.withLock { () -> (Int, Int, Bool) in
                    let from = base + sentLines
                    if !finishing && generated < from + 25 { generated = from + 25 }
                    if finishing && acked >= generated { done = true }
                    return (from, min(generated, from + 25), done)
                }
                if stop { return }
                guard to > from else { return }
                var chunk = ""
                for n in from..<to { chunk += event(n) + "\n" }
                try connection.send(chunk)
                sentLines += to - from
                // Read until the ack covers what was sent.
                var ack = 0
                while ack < sentLines {
                    let bytes = try connection.receive()
                    if bytes.isEmpty { return }  // the daemon is gone
                    pending += bytes
                    while let nl = pending.firstIndex(of: 0x0A) {
                        let line = Array(pending[..<nl])
                        pending.removeSubrange(...nl)
                        if let o = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any] {
                            if let a = o["ack"] as? Int { ack = max(ack, a) }
                            if let e = o["error"] { Issue.record("unexpected error: \(e)") }
                        }
                    }
                    lock.withLock { acked = max(acked, base + ack) }
                }
            }
        } catch {
            return
        }
    }
}

@Suite(.serialized) struct CrashConsistencyTests {
    @Test func sigkillAtRandomMomentsLosesNoAckedEventAndStoresNoneTwice() throws {
        let daemon = TestDaemon.live("crash", arguments: ["--segment-max-bytes", "8192"])
        let clients = (0..<3).map { ResendingClient(name: "c\($0)", socketPath: daemon.socketPath) }
        try daemon.start()
        for client in clients { client.start() }
        var ackedAtKill: [Int] = []
        // `make soak` runs many more rounds.
        let rounds = Int(ProcessInfo.processInfo.environment["WHEND_SOAK_ROUNDS"] ?? "") ?? 20
        for round in 1...rounds {
            usleep(UInt32.random(in: 20_000...250_000))
            daemon.crash()
            ackedAtKill.append(clients.map(\.ackedCount).reduce(0, +))
            usleep(UInt32.random(in: 0...20_000))
            try daemon.start()
            reportRound("SIGKILL", round, of: rounds, "\(ackedAtKill.last ?? 0) events acked")
        }
        for client in clients { client.finish() }
        for client in clients {
            #expect(client.finished.wait(timeout: .now() + 120) == .success, "client \(client.name) did not finish")
        }
        #expect(daemon.stop() == 0)
        // The clients made progress between kills, and reconnected after each.
        #expect(ackedAtKill.last ?? 0 > 200)
        #expect(clients.allSatisfy { $0.reconnects >= rounds })

        let records = daemon.records()
        var seen: [String: Int] = [:]
        for r in records { if let id = r["id"] as? String { seen[id, default: 0] += 1 } }
        let expected = clients.flatMap { c in (0..<c.generatedCount).map { "\(c.name)-\($0)" } }
        #expect(records.count == expected.count)
        let wrong = expected.filter { seen[$0] != 1 }
        #expect(
            wrong.isEmpty,
            "\(wrong.count) events not stored exactly once, e.g. \(wrong.prefix(10).map { "\($0) ×\(seen[$0] ?? 0)" })")
        #expect(records.map { $0["_seq"] as? Int } == Array(1...records.count).map { Optional($0) })

        let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output)")
        let segments = daemon.journal.segments()
        #expect(segments.count > 5)
        var lines = 0
        for segment in segments {
            let test = try runCommand("/usr/bin/zstd", ["-q", "-t", segment.path])
            #expect(test.status == 0, "zstd -t \(segment.path): \(test.error)")
            let cat = try runCommand("/usr/bin/zstdcat", [segment.path])
            #expect(cat.status == 0)
            lines += cat.output.split(separator: "\n").count
        }
        #expect(lines == records.count)
    }
}
