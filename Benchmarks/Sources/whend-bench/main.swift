import BenchSupport
import Foundation

// whend-bench: the ingest benchmark of whend against rsyslog (imptcp on a Unix socket → omfile
// with zstd level 3), on one generated corpus, in one run. Every bar is a ratio to a figure
// measured in the same run. Usage:
//   whend-bench --whend PATH --whenctl PATH --rsyslog-root DIR [--events N] [--work DIR]

var options: [String: String] = [:]
var argumentIterator = CommandLine.arguments.dropFirst().makeIterator()
while let key = argumentIterator.next() {
    guard key.hasPrefix("--"), let value = argumentIterator.next() else {
        FileHandle.standardError.write(
            Data("usage: whend-bench --whend PATH --whenctl PATH --rsyslog-root DIR [--events N] [--work DIR]\n".utf8))
        exit(2)
    }
    options[String(key.dropFirst(2))] = value
}
func absolute(_ path: String?) -> String? {
    guard let path else { return nil }
    return path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
}
@MainActor func required(_ option: String) -> String {
    guard let path = absolute(options[option]) else {
        FileHandle.standardError.write(Data("whend-bench: --whend, --whenctl and --rsyslog-root are required\n".utf8))
        exit(2)
    }
    return path
}
let whend = required("whend")
let whenctl = required("whenctl")
let rsyslogRoot = required("rsyslog-root")
let eventCount = Int(options["events"] ?? "") ?? 1_000_000
// Each run is repeated, interleaved with its peer, and the median reported: these machines are
// shared, and one run can be off by a third.
let rounds = max(1, Int(options["rounds"] ?? "") ?? 3)
// `--only shipped`: whend as it ships beside rsyslog and nothing else, for working on pipelines.
let onlyShipped = options["only"] == "shipped"
// `--hold SECONDS`: whend as shipped is left running, caught up, for a look at its processes.
let holdSeconds = Double(options["hold"] ?? "") ?? 0
// `--only latency`: the fdatasync floor and whend's ack latency at a steady rate, nothing else.
let onlyLatency = options["only"] == "latency"
// `--only subscriptions`: a subscriber's latency, and ingest beside 100 subscribers, nothing else.
let onlySubscriptions = options["only"] == "subscriptions"
// `--only ingest`: the ingest rows (rsyslog, whend with and without acks, 1 and 4 connections),
// nothing else, for working on the ingest path.
let onlyIngest = options["only"] == "ingest"
// `--only plan`: whend with a tracking plan of 100 events beside whend without, nothing else.
let onlyPlan = options["only"] == "plan"
let work = options["work"] ?? "/tmp/whend-bench-\(getpid())"
try? FileManager.default.removeItem(atPath: work)
try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)

func say(_ s: String) {
    FileHandle.standardError.write(Data((s + "\n").utf8))
}

// MARK: The corpus

say("generating a corpus of \(eventCount) events…")
var generator = CorpusGenerator()
let sessions = generator.sessions(count: eventCount)
var allLines: [[UInt8]] = []
allLines.reserveCapacity(eventCount + 100)
for s in sessions { for l in s.lines { allLines.append(Array(l.utf8)) } }
let corpusEvents = allLines.count
let corpusPath = work + "/corpus.ndjson"
var corpusBytes: [UInt8] = []
for l in allLines {
    corpusBytes += l
    corpusBytes.append(0x0A)
}
try Data(corpusBytes).write(to: URL(fileURLWithPath: corpusPath))
var typeCounts: [String: Int] = [:]
for s in sessions {
    for l in s.lines {
        let t = l.dropFirst(9).prefix { $0 != "\"" }
        typeCounts[String(t), default: 0] += 1
    }
}

/// The corpus split over `k` connections, each session on one connection, in order. Made once,
/// before any clock starts: splitting a million events takes a third of a second, which would
/// count against every system measured alike and pull their ratios towards 1.
func split(_ k: Int) -> [[UInt8]] {
    var result = Array(repeating: [UInt8](), count: k)
    for (i, s) in sessions.enumerated() {
        for l in s.lines {
            result[i % k] += Array(l.utf8)
            result[i % k].append(0x0A)
        }
    }
    return result
}
let splits = [1: split(1), 4: split(4)]
func parts(_ k: Int) -> [[UInt8]] { splits[k]! }

say("zstd -3 over the whole corpus (the compression reference)…")
try shell("zstd -q -3 -f -o \(work)/corpus.zst \(corpusPath)")
let zstdBytesPerEvent = Double(fileSize(work + "/corpus.zst")) / Double(corpusEvents)

if onlyLatency {
    printLatencies(try measureLatencies())
    exit(0)
}

if onlyPlan {
    print("whend with a tracking plan — \(corpusEvents) events, medians of \(rounds) rounds")
    printPlan(try measurePlan())
    exit(0)
}

if onlySubscriptions {
    print("whend's subscriptions — \(corpusEvents) events, medians of \(rounds) rounds")
    printSubscriptions(try measureSubscriptions())
    exit(0)
}

// MARK: Runs

struct Run {
    var name: String
    var connections: Int
    var eventsPerSecond: Double
    var cpuMicrosPerEvent: Double
    var peakRSSMiB: Double
    var bytesOnDiskPerEvent: Double
    var stored: Int
}

var runs: [Run] = []
let rsyslogLibraries = rsyslogRoot + "/usr/lib/x86_64-linux-gnu"

var allRounds: [String: [Run]] = [:]
var shippedRounds: [ShippedRun] = []
for round in 1...rounds {
    if !onlyIngest {
        say("round \(round)/\(rounds): rsyslog, 4 connections, beside whend as shipped…")
        allRounds["rsyslog-shipped", default: []].append(try runRsyslog(connections: 4))
        say(
            "round \(round)/\(rounds): whend as shipped (built-in pipelines on), acks and fsync, 4 connections, to the end of every pipeline…"
        )
        shippedRounds.append(try runWhendShipped(connections: 4))
    }
    for connections in [1, 4] where !onlyShipped {
        say("round \(round)/\(rounds): rsyslog, \(connections) connection(s)…")
        allRounds["rsyslog-\(connections)", default: []].append(try runRsyslog(connections: connections))
        say("round \(round)/\(rounds): whend, no acks, \(connections) connection(s)…")
        allRounds["noacks-\(connections)", default: []].append(
            try runWhend(connections: connections, acks: false, durability: "fsync"))
        say("round \(round)/\(rounds): whend, acks and fsync, \(connections) connection(s)…")
        allRounds["acks-\(connections)", default: []].append(
            try runWhend(connections: connections, acks: true, durability: "fsync"))
    }
}
for connections in [1, 4] where !onlyShipped {
    for kind in ["rsyslog", "noacks", "acks"] { runs.append(median(allRounds["\(kind)-\(connections)"]!)) }
}

func fmt(_ v: Double, _ digits: Int = 0) -> String { String(format: "%.\(digits)f", v) }
func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
func lpad(_ s: String, _ n: Int) -> String { s.count >= n ? s : String(repeating: " ", count: n - s.count) + s }

@MainActor func printIngestTable() {
    print(
        pad("run", 26) + lpad("conns", 6) + lpad("events/s", 12) + lpad("× rsyslog", 11) + lpad("CPU µs/ev", 11)
            + lpad("peak RSS MiB", 14) + lpad("disk B/ev", 11) + lpad("stored", 10))
    for run in runs {
        let peer = runs.first { $0.name == "rsyslog" && $0.connections == run.connections }!
        print(
            pad(run.name, 26) + lpad("\(run.connections)", 6) + lpad(fmt(run.eventsPerSecond), 12)
                + lpad(fmt(run.eventsPerSecond / peer.eventsPerSecond, 2), 11) + lpad(fmt(run.cpuMicrosPerEvent, 2), 11)
                + lpad(fmt(run.peakRSSMiB, 1), 14) + lpad(fmt(run.bytesOnDiskPerEvent, 1), 11)
                + lpad("\(run.stored)", 10))
    }
}

if onlyIngest {
    print("whend ingest beside rsyslog — \(corpusEvents) events, medians of \(rounds) rounds")
    printIngestTable()
    exit(0)
}
let shippedPeer = median(allRounds["rsyslog-shipped"]!)
let shipped = shippedRounds.sorted { $0.endToEndEventsPerSecond < $1.endToEndEventsPerSecond }[shippedRounds.count / 2]
let shippedIngest = median(shippedRounds.map(\.ingest))
var shippedWorkerPeaks: [String: Double] = [:]
for r in shippedRounds {
    for (k, v) in r.workerPeakRSSMiB { shippedWorkerPeaks[k] = max(shippedWorkerPeaks[k] ?? 0, v) }
}

@MainActor func printShipped() {
    print("whend as it ships (embedded defaults: the four built-in pipelines on), 4 connections, acks and fsync:")
    print(
        "  ingest: \(fmt(shippedIngest.eventsPerSecond)) events/s (\(fmt(shippedIngest.eventsPerSecond / shippedPeer.eventsPerSecond, 2)) × rsyslog \(fmt(shippedPeer.eventsPerSecond)) events/s), CPU of whend and its workers \(fmt(shippedIngest.cpuMicrosPerEvent, 2)) µs/event, daemon peak RSS \(fmt(shippedIngest.peakRSSMiB, 1)) MiB"
    )
    print(
        "  end to end (first byte → every pipeline's lag 0): \(fmt(shipped.endToEndEventsPerSecond)) events/s (\(fmt(shipped.endToEndEventsPerSecond / shippedPeer.eventsPerSecond, 2)) × rsyslog); \(shipped.derived) derived records"
    )
    print(
        "  CPU µs per event: "
            + shipped.cpuMicrosPerEvent.sorted { $0.key < $1.key }.map { "\($0.key) \(fmt($0.value, 2))" }.joined(
                separator: ", "))
    print(
        "  CPU µs per event end to end, whend and its workers: \(fmt(shipped.cpuMicrosPerEvent.values.reduce(0, +), 2)) (rsyslog \(fmt(shippedPeer.cpuMicrosPerEvent, 2)))"
    )
    print(
        "  the whole service's PSS (whend and its workers): idle \(fmt(shipped.pssIdleMiB, 1)) MiB, after the run \(fmt(shipped.pssAfterMiB, 1)) MiB (\(shipped.pssAfterParts.map { "\($0.name) \(fmt($0.mib, 1))" }.joined(separator: ", "))), \(Int(settleSeconds)) s later \(fmt(shipped.pssSettledParts.map(\.mib).reduce(0, +), 1)) MiB (\(shipped.pssSettledParts.map { "\($0.name) \(fmt($0.mib, 1))" }.joined(separator: ", ")))"
    )
    print(
        "  their private pages (no other process maps them): idle \(fmt(shipped.privateIdleMiB, 1)) MiB, \(Int(settleSeconds)) s after the run \(fmt(shipped.privateSettledMiB, 1)) MiB"
    )
    print(
        "  pipeline processes' peak RSS: "
            + shippedWorkerPeaks.sorted { $0.key < $1.key }.map { "\($0.key) \(fmt($0.value, 1)) MiB" }.joined(
                separator: ", "))
}

if onlyShipped {
    print("whend as shipped beside rsyslog — \(corpusEvents) events, medians of \(rounds) rounds")
    printShipped()
    exit(0)
}

// MARK: fdatasync on this filesystem, and whend's ack latency at a steady rate

/// The fdatasync latency of this filesystem (the floor under any durable ack), sorted, and
/// whend's ack latencies at a steady 50k events/s, sorted, with the rate reached.
@MainActor func measureLatencies() throws -> (sync: [Double], acks: [Double], rate: Double) {
    // The runs before left gigabytes of dirty pages: written back now, they would be written
    // back during the measurement instead, and every fdatasync would wait behind them.
    say("writing back what the runs before left in the page cache…")
    Glibc.sync()
    say("fdatasync latency of this filesystem…")
    var sync: [Double] = []
    let path = work + "/fdatasync-probe"
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    let block = [UInt8](repeating: 0x61, count: 4096)
    for _ in 0..<2000 {
        _ = block.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let t = monotonicSeconds()
        fdatasync(fd)
        sync.append((monotonicSeconds() - t) * 1e6)
    }
    close(fd)
    say("ack latency at a steady 50k events/s…")
    let (daemon, socket) = try startWhend(work + "/whend-latency")
    let lines = Array(allLines.prefix(250_000))
    let (latencies, seconds) = try pacedLatency(socket: socket, lines: lines, rate: 50_000)
    _ = daemon.stop()
    return (sync.sorted(), latencies.sorted(), Double(lines.count) / seconds)
}

func printLatencies(_ l: (sync: [Double], acks: [Double], rate: Double)) {
    print(
        "fdatasync of a 4 KiB append on this filesystem: p50 \(fmt(percentile(l.sync, 0.5))) µs, p99 \(fmt(percentile(l.sync, 0.99))) µs, p999 \(fmt(percentile(l.sync, 0.999))) µs"
    )
    print(
        "ack latency, 1 connection, steady \(fmt(l.rate)) events/s, fsync: p50 \(fmt(percentile(l.acks, 0.5))) µs, p99 \(fmt(percentile(l.acks, 0.99))) µs, p999 \(fmt(percentile(l.acks, 0.999))) µs"
    )
}

let latencyFigures = try measureLatencies()
let subscriptionFigures = try measureSubscriptions()
let syncLatencies = latencyFigures.sync
let sortedLatencies = latencyFigures.acks

// MARK: whenctl cat

say("whenctl cat to /dev/null…")
let catJournal = "\(work)/whend-4-noacks-fsync/state/journal"
var catTimes: [Double] = []
for _ in 1...rounds {
    let catStart = monotonicSeconds()
    try shell("\(whenctl) cat --journal \(catJournal) > /dev/null")
    catTimes.append(monotonicSeconds() - catStart)
}
let catSeconds = catTimes.sorted()[catTimes.count / 2]

// MARK: whenctl replay

// The same journal through a pipeline of one plugin that does nothing, offline: what replay
// itself costs, beside `whenctl cat` over the same journal.
var replaySeconds: Double?
if let noop = absolute(options["noop-plugin"]) {
    say("whenctl replay through a no-op plugin…")
    let replayStart = monotonicSeconds()
    try shell("\(whenctl) replay --journal \(catJournal) --plugin \(noop) --state-out \(work)/replay > /dev/null 2>&1")
    replaySeconds = monotonicSeconds() - replayStart
}

// MARK: whenctl replay, each built-in plugin

// Each built-in plugin alone, offline, over the same journal as `whenctl cat`: what it costs
// per record beside reading the journal. Plugins are found beside whend (a build tree).
let pluginDirectory = (whend as NSString).deletingLastPathComponent
var pluginReplaySeconds: [(String, Double)] = []
for plugin in ["screen-tracking", "analytics", "crash-reports", "session-recorder"] {
    let library = "\(pluginDirectory)/lib\(plugin).so"
    guard FileManager.default.fileExists(atPath: library) else { continue }
    say("whenctl replay --plugin \(plugin)…")
    var times: [Double] = []
    for round in 1...rounds {
        let out = "\(work)/replay-\(plugin)-\(round)"
        let start = monotonicSeconds()
        try shell("\(whenctl) replay --journal \(catJournal) --plugin \(library) --state-out \(out) > /dev/null 2>&1")
        times.append(monotonicSeconds() - start)
        try? FileManager.default.removeItem(atPath: out)
    }
    pluginReplaySeconds.append((plugin, times.sorted()[times.count / 2]))
}

// MARK: NATS JetStream forwarding

// The same journal forwarded by a live whend through its nats pipeline to a local JetStream
// (one node, file storage): from the daemon's start to the pipeline's cursor at the last record,
// and the stream checked to hold every record once. Its peer, round by round: libnats alone
// (`--nats-peer`, Benchmarks/nats-peer.c) publishing the same records the same way to a fresh
// server, with nothing else to do.
var natsSeconds: Double?
var natsPeerSeconds: Double?
/// A JetStream node of its own for one run, in `dir`.
func startNatsServer(_ path: String, _ dir: String) throws -> SpawnedProcess {
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let server = try SpawnedProcess(
        path, ["-js", "-sd", dir + "/js", "-a", "127.0.0.1", "-p", "24222", "-m", "25222"], log: dir + "/nats.log")
    usleep(500_000)
    return server
}
@MainActor func forwardThroughWhend(_ natsServer: String, _ natsDir: String) throws -> Double {
    try FileManager.default.createDirectory(atPath: natsDir + "/state", withIntermediateDirectories: true)
    try shell("cp -r \(catJournal) \(natsDir)/state/journal")
    let nats = try startNatsServer(natsServer, natsDir)
    defer { _ = nats.stop() }
    try """
    pipeline.forward = nats
    plugin.nats = {"url": "nats://127.0.0.1:24222", "stream": "WHEND", "create_stream": true, "max_in_flight": 4000}
    """.write(toFile: natsDir + "/whend.conf", atomically: true, encoding: .utf8)
    let start = monotonicSeconds()
    let (forwarder, _) = try startWhend(
        natsDir + "/whend", ["--state-dir", natsDir + "/state", "--config", natsDir + "/whend.conf"])
    let cursorPath = natsDir + "/state/pipelines/forward/cursor"
    while (try? String(contentsOfFile: cursorPath, encoding: .utf8)).flatMap({
        Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
    }) ?? 0
        < corpusEvents, monotonicSeconds() - start < 600
    {
        usleep(20_000)
    }
    let seconds = monotonicSeconds() - start
    _ = forwarder.stop()
    let streamState = httpGet("http://127.0.0.1:25222/jsz?streams=true")
    let json = try? JSONSerialization.jsonObject(with: Data(streamState.utf8)) as? [String: Any]
    let streams = (json?["account_details"] as? [[String: Any]])?.flatMap {
        $0["stream_detail"] as? [[String: Any]] ?? []
    }
    let state = streams?.first { $0["name"] as? String == "WHEND" }?["state"] as? [String: Any]
    guard state?["messages"] as? Int == corpusEvents, state?["last_seq"] as? Int == corpusEvents else {
        throw BenchError(
            "the JetStream stream does not hold exactly \(corpusEvents) messages: \(String(describing: state))")
    }
    try? FileManager.default.removeItem(atPath: natsDir)
    return seconds
}
@MainActor func publishThroughPeer(_ natsServer: String, _ peer: String, _ records: String, _ dir: String) throws
    -> Double
{
    let nats = try startNatsServer(natsServer, dir)
    defer { _ = nats.stop() }
    let out = try shell("\(peer) nats://127.0.0.1:24222 PEER whend.peer.app.event \(records) 4000")
    let fields = out.split(separator: " ")
    guard fields.count == 3, let seconds = Double(fields[0]), Int(fields[1]) == corpusEvents, fields[2].hasPrefix("0")
    else { throw BenchError("the NATS peer did not publish every record once: \(out)") }
    try? FileManager.default.removeItem(atPath: dir)
    return seconds
}
if let natsServer = options["nats-server"] {
    say("forwarding the journal to NATS JetStream…")
    let peer = absolute(options["nats-peer"])
    let records = work + "/records.ndjson"
    if peer != nil { try shell("\(whenctl) cat --journal \(catJournal) > \(records)") }
    var whendTimes: [Double] = []
    var peerTimes: [Double] = []
    for round in 1...rounds {
        whendTimes.append(try forwardThroughWhend(natsServer, work + "/nats-\(round)"))
        if let peer {
            peerTimes.append(try publishThroughPeer(natsServer, peer, records, work + "/nats-peer-\(round)"))
        }
    }
    natsSeconds = whendTimes.sorted()[whendTimes.count / 2]
    natsPeerSeconds = peerTimes.isEmpty ? nil : peerTimes.sorted()[peerTimes.count / 2]
}

// MARK: Idle connections

say("1000 idle connections…")
let (idleDaemon, idleSocket) = try startWhend(work + "/whend-idle")
usleep(200_000)
let rssBefore = idleDaemon.rssKiB
var idle: [Int32] = []
for _ in 0..<1000 {
    let fd = try connectUnix(idleSocket)
    Array(#"{"hello":{"protocol":1,"acks":true}}"#.utf8 + [0x0A]).withUnsafeBytes { sendAll(fd, $0) }
    idle.append(fd)
}
usleep(1_000_000)
let rssWithIdle = idleDaemon.rssKiB
for fd in idle { close(fd) }
_ = idleDaemon.stop()

// MARK: Report

let averageBytes = Double(corpusBytes.count) / Double(corpusEvents)
print(
    "whend ingest benchmark — \(corpusEvents) events, \(fmt(averageBytes)) bytes each on average, \(sessions.count) sessions"
)
print("types: " + typeCounts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
print("machine: \(ProcessInfo.processInfo.activeProcessorCount) cores; every ratio below is to rsyslog in the same run")
print("each row: the median of \(rounds) interleaved rounds (peak RSS: the highest)")
print("")
printShipped()
print("")
printIngestTable()
print("")
print("zstd -3 over the whole corpus: \(fmt(zstdBytesPerEvent, 1)) bytes/event")
printLatencies(latencyFigures)
printSubscriptions(subscriptionFigures)
print("whenctl cat to /dev/null: \(fmt(Double(corpusEvents) / catSeconds)) records/s")
if let natsSeconds {
    print(
        "forwarding to NATS JetStream (whend's nats pipeline, 1 local node): \(fmt(Double(corpusEvents) / natsSeconds)) records/s (\(fmt(catSeconds / natsSeconds, 2)) × whenctl cat); the stream holds each record once"
    )
}
if let natsSeconds, let natsPeerSeconds {
    print(
        "libnats alone publishing the same records the same way: \(fmt(Double(corpusEvents) / natsPeerSeconds)) records/s; whend's forwarding × libnats alone: \(fmt(natsPeerSeconds / natsSeconds, 2))"
    )
}
if let replaySeconds {
    print(
        "whenctl replay through a no-op plugin: \(fmt(Double(corpusEvents) / replaySeconds)) records/s (\(fmt(catSeconds / replaySeconds, 2)) × whenctl cat)"
    )
}
for (plugin, seconds) in pluginReplaySeconds {
    print(
        "whenctl replay --plugin \(plugin): \(fmt(Double(corpusEvents) / seconds)) records/s (\(fmt(catSeconds / seconds, 2)) × whenctl cat)"
    )
}
print(
    "1000 idle connections: RSS \(rssBefore / 1024) MiB → \(rssWithIdle / 1024) MiB (\(fmt(Double(rssWithIdle - rssBefore) / 1000, 1)) KiB per connection)"
)
print("")

func bar(_ name: String, _ value: Double, _ target: String, _ ok: Bool) {
    print(pad(name, 48) + lpad(fmt(value, 2), 10) + "  " + pad(target, 14) + (ok ? "reached" : "NOT reached"))
}
let r4 = runs.first { $0.name == "rsyslog" && $0.connections == 4 }!
let w4 = runs.first { $0.name == "whend no acks, fsync" && $0.connections == 4 }!
let a4 = runs.first { $0.name == "whend acks, fsync" && $0.connections == 4 }!
let worstCPU = runs.filter { $0.name == "whend acks, fsync" }.map(\.cpuMicrosPerEvent).max() ?? 0
let diskRatio = w4.bytesOnDiskPerEvent / zstdBytesPerEvent
print("bars:")
bar(
    "whend as shipped, end to end, × rsyslog", shipped.endToEndEventsPerSecond / shippedPeer.eventsPerSecond, "≥ 0.4",
    shipped.endToEndEventsPerSecond / shippedPeer.eventsPerSecond >= 0.4)
bar("whole service PSS idle (MiB)", shipped.pssIdleMiB, "≤ 35", shipped.pssIdleMiB <= 35)
bar("whole service PSS after the run (MiB)", shipped.pssAfterMiB, "≤ 70", shipped.pssAfterMiB <= 70)
for (plugin, seconds) in pluginReplaySeconds {
    bar("replay --plugin \(plugin) × whenctl cat", catSeconds / seconds, "≥ 0.5", catSeconds / seconds >= 0.5)
}
bar(
    "whend no acks, 4 connections, × rsyslog", w4.eventsPerSecond / r4.eventsPerSecond, "≥ 1.5",
    w4.eventsPerSecond / r4.eventsPerSecond >= 1.5)
bar(
    "whend acks + fsync, 4 connections, × rsyslog", a4.eventsPerSecond / r4.eventsPerSecond, "≥ 1.3",
    a4.eventsPerSecond / r4.eventsPerSecond >= 1.3)
bar("whend CPU µs per event, acks + fsync (worst run)", worstCPU, "≤ 1.5", worstCPU <= 1.5)
bar("whend bytes on disk × zstd -3 of the corpus", diskRatio, "≤ 1.10", diskRatio <= 1.10)
bar(
    "ack p99 at 50k events/s (ms)", percentile(sortedLatencies, 0.99) / 1000, "≤ 1.0",
    percentile(sortedLatencies, 0.99) <= 1000)
bar(
    "whenctl cat (M records/s)", Double(corpusEvents) / catSeconds / 1e6, "≥ 3.0",
    Double(corpusEvents) / catSeconds >= 3e6)
if let natsSeconds {
    bar("NATS forwarding × whenctl cat", catSeconds / natsSeconds, "≥ 0.1", catSeconds / natsSeconds >= 0.1)
}
if let replaySeconds {
    bar(
        "whenctl replay, no-op plugin (M records/s)", Double(corpusEvents) / replaySeconds / 1e6, "≥ 1.0",
        Double(corpusEvents) / replaySeconds >= 1e6)
}
