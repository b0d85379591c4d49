import BenchSupport
import Foundation
import WhenClient

// whenclient-bench: what `WhenClient.emit` costs the app's thread, with the daemon up, down,
// and stopped (SIGSTOP: connected but not reading), against a peer measured in the same run:
// one blocking send(2) per event of the same line, encoded by the same code, on a connection to the same daemon, what a
// naive client would do. Usage:
//   whenclient-bench --whend PATH [--events N] [--rounds N] [--work DIR]

var options: [String: String] = [:]
var argumentIterator = CommandLine.arguments.dropFirst().makeIterator()
while let key = argumentIterator.next() {
    guard key.hasPrefix("--"), let value = argumentIterator.next() else {
        FileHandle.standardError.write(Data("usage: whenclient-bench --whend PATH [--events N] [--rounds N]\n".utf8))
        exit(2)
    }
    options[String(key.dropFirst(2))] = value
}
guard let whend = options["whend"] else {
    FileHandle.standardError.write(Data("whenclient-bench: --whend is required\n".utf8))
    exit(2)
}
let events = Int(options["events"] ?? "") ?? 200_000
let rounds = max(1, Int(options["rounds"] ?? "") ?? 3)
let work = options["work"] ?? "/tmp/whenclient-bench-\(getpid())"
try? FileManager.default.removeItem(atPath: work)
try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
func say(_ s: String) { FileHandle.standardError.write(Data((s + "\n").utf8)) }

/// The event an app emits most: a `when` with a few parameters.
func event(_ i: Int) -> [String: Any] {
    [
        "type": "when", "name": "userTapsCharacter", "screen": "CharacterList",
        "params": ["characterId": 1_009_000 + i % 1000],
    ]
}

/// Nanoseconds per call over consecutive slices of the run, so that a cost that grows shows.
struct CallCosts {
    var slices: [Double]
    var median: Double { slices.sorted()[slices.count / 2] }
    /// The dearest slice over the cheapest: 1.0 is perfectly flat.
    var spread: Double { slices.max()! / slices.min()! }
}

func measure(slices: Int = 10, _ call: (Int) -> Void) -> CallCosts {
    let perSlice = events / slices
    var result: [Double] = []
    for s in 0..<slices {
        let start = monotonicSeconds()
        for i in (s * perSlice)..<((s + 1) * perSlice) { call(i) }
        result.append((monotonicSeconds() - start) * 1e9 / Double(perSlice))
    }
    return CallCosts(slices: result)
}

func startDaemon(_ name: String) throws -> (SpawnedProcess, String) {
    let dir = work + "/" + name
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let socket = dir + "/events.sock"
    let daemon = try SpawnedProcess(
        whend,
        ["--socket", socket, "--state-dir", dir + "/state", "--durability", "write", "--builtin-pipelines", "false"],
        log: dir + "/whend.log")
    try waitForSocket(socket)
    return (daemon, socket)
}

/// Emitting as fast as the app can with the daemon up. The queue (10,000) may fill when the app
/// outruns the daemon; then the rest are drops, which is what the app would get.
func clientUp(_ round: Int) throws -> (CallCosts, WhenClient.Statistics) {
    let (daemon, socket) = try startDaemon("up-\(round)")
    defer { _ = daemon.stop() }
    let client = WhenClient(.init(app: "bench", session: "up", socketPath: socket))
    _ = client.flush(timeout: 5)
    let costs = measure { client.emit(event($0)) }
    _ = client.flush(timeout: 30)
    return (costs, client.statistics)
}

func clientDown(_ round: Int) -> (CallCosts, WhenClient.Statistics) {
    let client = WhenClient(.init(app: "bench", session: "down", socketPath: work + "/nobody-\(round).sock"))
    let costs = measure { client.emit(event($0)) }
    return (costs, client.statistics)
}

func clientStopped(_ round: Int) throws -> (CallCosts, WhenClient.Statistics) {
    let (daemon, socket) = try startDaemon("stopped-\(round)")
    defer {
        kill(daemon.pid, SIGCONT)
        _ = daemon.stop()
    }
    let client = WhenClient(.init(app: "bench", session: "stopped", socketPath: socket))
    _ = client.flush(timeout: 5)
    kill(daemon.pid, SIGSTOP)
    let costs = measure { client.emit(event($0)) }
    return (costs, client.statistics)
}

/// The peer: the same line, encoded the same way, written with one blocking send(2) per event.
func blockingSend(_ round: Int) throws -> CallCosts {
    let (daemon, socket) = try startDaemon("peer-\(round)")
    defer { _ = daemon.stop() }
    let fd = try connectUnix(socket)
    defer { close(fd) }
    // Only for its encoder: never connected.
    let encoder = WhenClient(.init(app: "bench", session: "peer", socketPath: work + "/none.sock"))
    return measure { i in
        let line = encoder.line(for: event(i)) ?? []
        line.withUnsafeBytes { _ = send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }
}

var up: [CallCosts] = []
var down: [CallCosts] = []
var stopped: [CallCosts] = []
var peer: [CallCosts] = []
var upStats = WhenClient.Statistics()
var downStats = WhenClient.Statistics()
var stoppedStats = WhenClient.Statistics()
for round in 1...rounds {
    say("round \(round) of \(rounds): \(events) emits per run…")
    peer.append(try blockingSend(round))
    let u = try clientUp(round)
    up.append(u.0)
    upStats = u.1
    let d = clientDown(round)
    down.append(d.0)
    downStats = d.1
    let s = try clientStopped(round)
    stopped.append(s.0)
    stoppedStats = s.1
}

func median(_ runs: [CallCosts]) -> CallCosts { runs.sorted { $0.median < $1.median }[runs.count / 2] }
let peerCost = median(peer).median
func fmt(_ v: Double, _ digits: Int = 0) -> String { String(format: "%.\(digits)f", v) }
func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
func lpad(_ s: String, _ n: Int) -> String { s.count >= n ? s : String(repeating: " ", count: n - s.count) + s }

print("WhenClient.emit — \(events) calls per run, median of \(rounds) interleaved rounds; 10 slices per run")
print("every ratio is to one blocking send(2) per event to the same daemon, in the same run")
print("")
print(
    pad("run", 34) + lpad("ns/call", 9) + lpad("× send", 8) + lpad("slices min…max", 20) + lpad("spread", 8)
        + lpad("queued", 9) + lpad("dropped", 9))
func row(_ name: String, _ runs: [CallCosts], _ stats: WhenClient.Statistics?) {
    let m = median(runs)
    let range = "\(fmt(m.slices.min()!))…\(fmt(m.slices.max()!))"
    print(
        pad(name, 34) + lpad(fmt(m.median), 9) + lpad(fmt(m.median / peerCost, 2), 8) + lpad(range, 20)
            + lpad(fmt(m.spread, 2), 8) + lpad(stats.map { "\($0.enqueued)" } ?? "-", 9)
            + lpad(stats.map { "\($0.dropped)" } ?? "-", 9))
}
row("peer: blocking send(2), daemon up", peer, nil)
row("emit, daemon up", up, upStats)
row("emit, daemon down (queue full)", down, downStats)
row("emit, daemon stopped (queue full)", stopped, stoppedStats)
print("")
let worstDown = max(median(down).median, median(stopped).median)
let worstSpread = max(median(down).spread, median(stopped).spread, median(up).spread)
func bar(_ name: String, _ value: Double, _ target: String, _ ok: Bool) {
    print(pad(name, 52) + lpad(fmt(value, 2), 8) + "  " + pad(target, 10) + (ok ? "reached" : "NOT reached"))
}
print("bars:")
bar(
    "emit with the daemon down or stopped, × emit up", worstDown / median(up).median, "≤ 1.5",
    worstDown <= 1.5 * median(up).median)
bar("emit per-call spread over a run (max/min slice)", worstSpread, "≤ 2.0", worstSpread <= 2.0)
bar("emit up × one blocking send(2)", median(up).median / peerCost, "≤ 1.0", median(up).median <= peerCost)
try? FileManager.default.removeItem(atPath: work)
