import BenchSupport
import Foundation

func runRsyslog(connections: Int) throws -> Run {
    let dir = "\(work)/rsyslog-\(connections)"
    try? FileManager.default.removeItem(atPath: dir)
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let sock = dir + "/in.sock"
    let out = dir + "/out.log.zst"
    let config = """
        global(workDirectory="\(dir)" maxMessageSize="64k")
        main_queue(queue.size="200000" queue.dequeueBatchSize="1024" queue.timeoutShutdown="120000")
        module(load="builtin:omfile" compression.driver="zstd")
        module(load="imptcp" threads="2")
        input(type="imptcp" path="\(sock)" unlink="on" ruleset="bench")
        template(name="raw" type="string" string="%rawmsg%\\n")
        ruleset(name="bench") {
          action(type="omfile" file="\(out)" template="raw" zipLevel="3" ioBufferSize="1m" flushOnTXEnd="off")
        }
        """
    try config.write(toFile: dir + "/rsyslog.conf", atomically: true, encoding: .utf8)
    let daemon = try SpawnedProcess(
        rsyslogRoot + "/usr/sbin/rsyslogd",
        ["-n", "-f", dir + "/rsyslog.conf", "-i", dir + "/pid", "-M", rsyslogLibraries + "/rsyslog"],
        log: dir + "/log", environment: ["LD_LIBRARY_PATH": rsyslogLibraries])
    try waitForSocket(sock)
    let start = monotonicSeconds()
    _ = try blast(socket: sock, parts: parts(connections), hello: nil)
    let peakKiB = daemon.peakRSSKiB
    let usage = daemon.stop()
    let seconds = monotonicSeconds() - start
    let stored = Int(try shell("zstd -dc \(out) | wc -l").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    // A peer that did not compress or lost events would make every ratio meaningless.
    guard stored == corpusEvents,
        !((try? String(contentsOfFile: dir + "/log", encoding: .utf8)) ?? "").contains("without compression")
    else {
        throw BenchError("rsyslog stored \(stored) of \(corpusEvents) events, or did not compress; see \(dir)/log")
    }
    return Run(
        name: "rsyslog", connections: connections, eventsPerSecond: Double(stored) / seconds,
        cpuMicrosPerEvent: usage.cpuSeconds * 1e6 / Double(corpusEvents), peakRSSMiB: Double(peakKiB) / 1024,
        bytesOnDiskPerEvent: Double(fileSize(out)) / Double(corpusEvents), stored: stored)
}

/// whend on `dir`; `shipped` keeps the embedded defaults (the built-in pipelines on), else
/// ingest alone.
func startWhend(_ dir: String, _ extra: [String] = [], shipped: Bool = false) throws -> (SpawnedProcess, String) {
    try? FileManager.default.removeItem(atPath: dir)
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let sock = dir + "/events.sock"
    let daemon = try SpawnedProcess(
        whend,
        ["--socket", sock, "--state-dir", dir + "/state", "--log-level", "warning"]
            + (shipped ? [] : ["--builtin-pipelines", "false"]) + extra, log: dir + "/log")
    try waitForSocket(sock)
    return (daemon, sock)
}

func journalSize(_ dir: String) -> Int {
    let journal = dir + "/state/journal"
    return ((try? FileManager.default.contentsOfDirectory(atPath: journal)) ?? []).map { fileSize(journal + "/" + $0) }
        .reduce(0, +)
}

func storedRecords(_ dir: String) throws -> Int {
    let report = try shell("\(whenctl) verify --json --journal \(dir)/state/journal")
    let object = try JSONSerialization.jsonObject(with: Data(report.utf8)) as? [String: Any]
    guard object?["ok"] as? Bool == true else { throw BenchError("whenctl verify failed on \(dir): \(report)") }
    return (object?["records"] as? Int) ?? 0
}

func runWhend(connections: Int, acks: Bool, durability: String, extra: [String] = []) throws -> Run {
    let dir = "\(work)/whend-\(connections)-\(acks ? "acks" : "noacks")-\(durability)"
    let (daemon, sock) = try startWhend(dir, ["--durability", durability] + extra)
    let hello = acks ? #"{"hello":{"protocol":1,"acks":true}}"# : nil
    let start = monotonicSeconds()
    let result = try blast(socket: sock, parts: parts(connections), hello: hello)
    let peakKiB = daemon.peakRSSKiB
    let usage = daemon.stop()
    let seconds = monotonicSeconds() - start
    if result.errors > 0 { throw BenchError("whend answered \(result.errors) errors; see \(dir)/log") }
    let stored = try storedRecords(dir)
    if acks {
        let expected = parts(connections).map { UInt64($0.reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }) }
        if result.lastAcks != expected { throw BenchError("final acks \(result.lastAcks), expected \(expected)") }
    }
    return Run(
        name: "whend \(acks ? "acks" : "no acks"), \(durability)", connections: connections,
        eventsPerSecond: Double(stored) / seconds, cpuMicrosPerEvent: usage.cpuSeconds * 1e6 / Double(corpusEvents),
        peakRSSMiB: Double(peakKiB) / 1024, bytesOnDiskPerEvent: Double(journalSize(dir)) / Double(corpusEvents),
        stored: stored)
}

/// The daemon's status, asked on its control socket (as `whenctl status --json` does, without
/// a process per question: the benchmark asks every 20 ms).
func status(_ sock: String) -> [String: Any]? {
    let control = (sock as NSString).deletingLastPathComponent + "/control.sock"
    guard let fd = try? connectUnix(control) else { return nil }
    defer { close(fd) }
    Array(#"{"command":"status"}"#.utf8 + [0x0A]).withUnsafeBytes { sendAll(fd, $0) }
    var reply: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while !reply.contains(0x0A) {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { break }
        reply += buffer[0..<n]
    }
    let object = try? JSONSerialization.jsonObject(with: Data(reply)) as? [String: Any]
    return object?["status"] as? [String: Any]
}

/// whend as it ships (embedded defaults: the four built-in pipelines on), acks and fsync:
/// ingest until the last ack, and end to end until every pipeline's cursor reaches the
/// journal's last record. Peak RSS of the daemon and of each pipeline worker.
struct ShippedRun {
    var ingest: Run
    var endToEndEventsPerSecond: Double
    var workerPeakRSSMiB: [String: Double]
    /// CPU seconds per event of the daemon alone and of each pipeline's worker.
    var cpuMicrosPerEvent: [String: Double]
    var derived: Int
    /// The whole service's proportional set size (whend and its pipeline workers, shared pages
    /// counted once between them): with the pipelines up and nothing sent, and once every
    /// pipeline is at the journal's end.
    var pssIdleMiB: Double
    /// What whend and its pipeline processes have to themselves, idle and 11 s after the run.
    var privateIdleMiB: Double
    var privateSettledMiB: Double
    var pssAfterMiB: Double
    /// `pssAfterMiB` by process: whend, then each pipeline process (named by its pipelines).
    var pssAfterParts: [(name: String, mib: Double)]
    /// The same, `settleSeconds` later: once whend and the pipelines have given back what the
    /// burst freed (each does when it has been quiet a while; a pipeline every 10 s at most).
    var pssSettledParts: [(name: String, mib: Double)]
}

let settleSeconds = 11.0

/// `Pss:` of a process (its private pages, and its share of those it shares), in MiB.
func pssMiB(_ pid: Int) -> Double { smapsMiB(pid, ["Pss:"]) }

/// The pages of a process that no other maps (`Private_Clean` and `Private_Dirty`), in MiB:
/// unlike PSS, not lower when other processes on the machine map the same libraries (the Swift
/// runtime's pages split among every Swift process running, which made the idle PSS swing
/// between 26 and 37 MiB with what else ran).
func privateMiB(_ pid: Int) -> Double { smapsMiB(pid, ["Private_Clean:", "Private_Dirty:"]) }

func smapsMiB(_ pid: Int, _ fields: [String]) -> Double {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/smaps_rollup", encoding: .utf8) else { return 0 }
    var kib = 0.0
    for line in text.split(separator: "\n") where fields.contains(where: { line.hasPrefix($0) }) {
        kib += Double(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
    }
    return kib / 1024
}

/// The processes that run the pipelines, each named by the pipelines it runs ("screens", or
/// "analytics+crashes+screens+sessions" for the shared pipeline host).
func pipelineProcesses(_ pipelines: [[String: Any]]) -> [(name: String, pid: Int)] {
    var names: [Int: [String]] = [:]
    for p in pipelines {
        if let name = p["name"] as? String, let pid = p["pid"] as? Int, pid > 0 { names[pid, default: []].append(name) }
    }
    return names.map { (name: $0.value.sorted().joined(separator: "+"), pid: $0.key) }
}

/// whend's and the processes of its running pipelines' PSS, each process once.
func servicePSSMiB(_ daemon: Int, _ pipelines: [[String: Any]]) -> Double {
    servicePSSParts(daemon, pipelines).map(\.mib).reduce(0, +)
}

func servicePrivateMiB(_ daemon: Int, _ pipelines: [[String: Any]]) -> Double {
    privateMiB(daemon) + pipelineProcesses(pipelines).map { privateMiB($0.pid) }.reduce(0, +)
}

func servicePSSParts(_ daemon: Int, _ pipelines: [[String: Any]]) -> [(name: String, mib: Double)] {
    [("whend", pssMiB(daemon))] + pipelineProcesses(pipelines).map { ($0.name, pssMiB($0.pid)) }
}

func runWhendShipped(connections: Int) throws -> ShippedRun {
    let dir = "\(work)/whend-shipped-\(connections)"
    let (daemon, sock) = try startWhend(dir, shipped: true)
    // The pipelines are up before the first byte: their workers read from the first record.
    var pipelines: [[String: Any]] = []
    let ready = monotonicSeconds()
    while pipelines.count < 4 || pipelines.contains(where: { $0["state"] as? String != "running" }) {
        guard monotonicSeconds() - ready < 30 else {
            throw BenchError("the built-in pipelines did not start: \(pipelines)")
        }
        usleep(50_000)
        pipelines = status(sock)?["pipelines"] as? [[String: Any]] ?? []
    }
    // Idle: the workers' plugins loaded and waiting (a second for their first reports to settle).
    usleep(1_000_000)
    let idleList = status(sock)?["pipelines"] as? [[String: Any]] ?? pipelines
    let pssIdle = servicePSSMiB(Int(daemon.pid), idleList)
    let privateIdle = servicePrivateMiB(Int(daemon.pid), idleList)
    let start = monotonicSeconds()
    let result = try blast(
        socket: sock, parts: parts(connections), hello: #"{"hello":{"protocol":1,"acks":true}}"#)
    let ingestSeconds = monotonicSeconds() - start
    if result.errors > 0 { throw BenchError("whend answered \(result.errors) errors; see \(dir)/log") }
    var workerPeaks: [String: Double] = [:]
    var cpu: [String: Double] = [:]
    var derived = 0
    var pssAfterParts: [(name: String, mib: Double)] = []
    while true {
        guard let s = status(sock), let list = s["pipelines"] as? [[String: Any]],
            let last = (s["journal"] as? [String: Any])?["last_seq"] as? Int
        else { throw BenchError("whenctl status failed; see \(dir)/log") }
        for (name, pid) in pipelineProcesses(list) {
            let peak = Double(procStatusKiB(pid, "VmHWM:")) / 1024
            workerPeaks[name] = max(workerPeaks[name] ?? 0, peak)
            cpu[name] = cpuSeconds(pid) * 1e6 / Double(corpusEvents)
        }
        // Caught up: every pipeline's cursor at the journal's end, and the journal no longer
        // growing (derived records are records too).
        if list.allSatisfy({ ($0["lag"] as? Int) == 0 }) && last >= corpusEvents {
            derived = last - corpusEvents
            pssAfterParts = servicePSSParts(Int(daemon.pid), list)
            break
        }
        guard monotonicSeconds() - start < 1200 else {
            throw BenchError("the pipelines did not catch up within 20 minutes: \(list)")
        }
        usleep(20_000)
    }
    let endToEndSeconds = monotonicSeconds() - start
    usleep(UInt32(settleSeconds * 1e6))
    let settledList = status(sock)?["pipelines"] as? [[String: Any]] ?? []
    let pssSettledParts = servicePSSParts(Int(daemon.pid), settledList)
    let privateSettled = servicePrivateMiB(Int(daemon.pid), settledList)
    if holdSeconds > 0 {
        say("holding whend (pid \(daemon.pid)) for \(holdSeconds) s, its state in \(dir)")
        usleep(UInt32(holdSeconds * 1e6))
    }
    cpu["daemon"] = cpuSeconds(Int(daemon.pid)) * 1e6 / Double(corpusEvents)
    let peakKiB = daemon.peakRSSKiB
    let usage = daemon.stop()
    let stored = try storedRecords(dir)
    let ingest = Run(
        name: "whend as shipped, acks, fsync", connections: connections,
        eventsPerSecond: Double(corpusEvents) / ingestSeconds,
        cpuMicrosPerEvent: usage.cpuSeconds * 1e6 / Double(corpusEvents), peakRSSMiB: Double(peakKiB) / 1024,
        bytesOnDiskPerEvent: Double(journalSize(dir)) / Double(corpusEvents), stored: stored)
    return ShippedRun(
        ingest: ingest, endToEndEventsPerSecond: Double(corpusEvents) / endToEndSeconds,
        workerPeakRSSMiB: workerPeaks, cpuMicrosPerEvent: cpu, derived: derived, pssIdleMiB: pssIdle,
        privateIdleMiB: privateIdle, privateSettledMiB: privateSettled,
        pssAfterMiB: pssAfterParts.map(\.mib).reduce(0, +), pssAfterParts: pssAfterParts,
        pssSettledParts: pssSettledParts)
}

/// User and system CPU seconds of a running process so far.
func cpuSeconds(_ pid: Int) -> Double {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = text.lastIndex(of: ")")
    else { return 0 }
    // Fields after the command name: state is field 3, utime 14 and stime 15.
    let fields = text[text.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

func procStatusKiB(_ pid: Int, _ key: String) -> Int {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
    for line in text.split(separator: "\n") where line.hasPrefix(key) {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
    }
    return 0
}

func median(_ values: [Run]) -> Run {
    let sorted = values.sorted { $0.eventsPerSecond < $1.eventsPerSecond }
    var m = sorted[sorted.count / 2]
    m.cpuMicrosPerEvent = values.map(\.cpuMicrosPerEvent).sorted()[values.count / 2]
    m.peakRSSMiB = values.map(\.peakRSSMiB).max() ?? m.peakRSSMiB
    return m
}
