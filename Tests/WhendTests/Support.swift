import Foundation
import TestScratch
import Testing
import WhendJournal
import WhendWire

/// The built executables sit beside the test bundle.
func executable(_ name: String) -> String {
    if let override = ProcessInfo.processInfo.environment["WHEND_BIN_DIR"] { return override + "/" + name }
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return (me as NSString).deletingLastPathComponent + "/" + name
}

/// The repository's root: the fixtures, and the tests' Python environment (`make test-deps`).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().path

/// The Python of the tests' own environment, with the readers from PyPI (`make test-deps`).
let testPython = repositoryRoot + "/.build/test-venv/bin/python"

func scratchDirectory(_ name: String) -> String { ScratchDirectory.make(name) }

struct TestFailure: Error, CustomStringConvertible {
    var description: String
}

/// How long `exchange` waits for whend's next answer, or its close: far longer than any answer
/// takes, even under the whole suite.
let exchangeDeadline: Int = 60

/// Sends `lines` on a fresh connection, half-closes, and returns every line the daemon
/// answered before it closed, parsed.
func exchange(
    _ socketPath: String, _ lines: [String], raw: [UInt8]? = nil, within seconds: Int = exchangeDeadline
) throws -> [[String: Any]] {
    let connection = try BlockingSocket(path: socketPath).bounded(seconds)
    // whend may close a connection before all of it is sent (a hello it refuses): what it
    // answered until then is still there to read, and is what the test looks at.
    var sendError: (any Error)?
    do {
        if let raw { try connection.send(raw) }
        for line in lines { try connection.send(line + "\n") }
    } catch {
        sendError = error
    }
    connection.finishSending()
    var answers: [[String: Any]] = []
    do {
        try connection.receiveLines { line in
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { answers.append(o) }
        }
    } catch let failure as BlockingSocket.Failure where failure.timedOut {
        throw TestFailure(
            description: "whend at \(socketPath) neither answered nor closed within \(seconds) s of the "
                + "last line; answered so far: \(answers)")
    }
    if answers.isEmpty, let sendError { throw sendError }
    return answers
}

extension BlockingSocket {
    /// Each send and each receive waits at most `seconds` (SO_SNDTIMEO, SO_RCVTIMEO): a whend
    /// that neither reads, answers nor closes fails the test instead of holding the suite.
    func bounded(_ seconds: Int = exchangeDeadline) -> BlockingSocket {
        var within = timeval(tv_sec: seconds, tv_usec: 0)
        for option in [SO_SNDTIMEO, SO_RCVTIMEO] {
            setsockopt(fd, SOL_SOCKET, option, &within, socklen_t(MemoryLayout<timeval>.size))
        }
        return self
    }
}

extension Array where Element == [String: Any] {
    var acks: [Int] { compactMap { $0["ack"] as? Int } }
    var errors: [(event: Int?, code: String, message: String)] {
        compactMap { o in
            guard let e = o["error"] as? [String: Any] else { return nil }
            return (e["event"] as? Int, e["code"] as? String ?? "", e["message"] as? String ?? "")
        }
    }
}

let helloWithAcks = #"{"hello":{"protocol":1,"app":"com.example.mail","session":"s1","acks":true}}"#

func runCommand(
    _ path: String, _ arguments: [String], environment: [String: String] = [:], within seconds: Double = 600
) throws -> (
    status: Int32, output: String, error: String
) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    for (k, v) in environment { env[k] = v }
    p.environment = env
    let out = Pipe()
    let err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    // Standard error is read on a thread of its own: a command that fills its pipe (64 KiB)
    // before it closes standard output would otherwise wait on us while we wait on it.
    final class Box: @unchecked Sendable { var data = Data() }  // written before `done`, read after
    let errBox = Box()
    let done = DispatchSemaphore(value: 0)
    Thread {
        errBox.data = err.fileHandleForReading.readDataToEndOfFile()
        done.signal()
    }.start()
    // A command that hangs fails its test instead of holding the suite.
    let overdue = Flag()
    let pid = p.processIdentifier
    let watch = DispatchWorkItem {
        overdue.set()
        kill(pid, SIGKILL)
    }
    DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: watch)
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    done.wait()
    let errData = errBox.data
    p.waitUntilExit()
    watch.cancel()
    if overdue.isSet {
        let command = ([path] + arguments).joined(separator: " ")
        let wrote = String(decoding: outData + errData, as: UTF8.self).suffix(4000)
        throw TestFailure(description: "\(command) did not end within \(seconds) s; killed. It wrote: \(wrote)")
    }
    return (p.terminationStatus, String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self))
}

/// Sends `parts` connections of 30 events each, with random padding so that they do not compress
/// to nothing (small segments then rotate), numbered from `first`; expects every one acked.
func sendNoisyParts(_ daemon: TestDaemon, _ parts: Range<Int>) throws {
    for part in parts {
        let events = (1...30).map {
            #"{"type":"when","name":"e","params":{"n":\#(part * 30 + $0),"noise":"\#(noise(64))"}}"#
        }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 30)
    }
}

extension TestDaemon {
    /// The control socket: beside the event socket unless the test says otherwise.
    var controlPath: String { directory + "/control.sock" }

    /// Runs whenctl against this daemon's control socket.
    func whenctl(_ arguments: [String]) throws -> (status: Int32, output: String, error: String) {
        try runCommand(executable("whenctl"), arguments + ["--control", controlPath])
    }

    /// `whenctl status --json`, parsed.
    func status() throws -> [String: Any] {
        let r = try whenctl(["status", "--json"])
        guard r.status == 0, let o = try JSONSerialization.jsonObject(with: Data(r.output.utf8)) as? [String: Any]
        else { throw TestFailure(description: "whenctl status failed: \(r.error)") }
        return o
    }

    /// Waits until the daemon's log contains `text`.
    func waitForLog(_ text: String, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if log.contains(text) { return true }
            usleep(50_000)
        }
        return false
    }
}

/// A small ext4 filesystem in a file, loop-mounted, that a test can freeze (`fsfreeze`): every
/// write to it then blocks in the kernel until it is thawed, as on a hung disk.
final class LoopFilesystem {
    let mountPoint: String
    private let image: String
    private var frozen = false

    init(_ name: String, megabytes: Int = 32) throws {
        mountPoint = scratchDirectory(name)
        image = mountPoint + ".img"
        guard (try runCommand("/usr/bin/truncate", ["-s", "\(megabytes)M", image])).status == 0,
            (try runCommand("/sbin/mkfs.ext4", ["-q", image])).status == 0,
            (try runCommand("/bin/mount", ["-o", "loop", image, mountPoint])).status == 0
        else { throw TestFailure(description: "cannot loop-mount \(image)") }
    }

    func freeze() throws {
        guard (try runCommand("/sbin/fsfreeze", ["-f", mountPoint])).status == 0 else {
            throw TestFailure(description: "fsfreeze -f \(mountPoint) failed")
        }
        frozen = true
    }

    func thaw() {
        if frozen { _ = try? runCommand("/sbin/fsfreeze", ["-u", mountPoint]) }
        frozen = false
    }

    deinit {
        thaw()
        _ = try? runCommand("/bin/umount", [mountPoint])
        unlink(image)
    }

    /// Root, mkfs.ext4, fsfreeze and loop devices: not every sandbox has them.
    static let isAvailable: Bool = {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/sbin/fsfreeze"),
            FileManager.default.isExecutableFile(atPath: "/sbin/mkfs.ext4")
        else { return false }
        return (try? LoopFilesystem("loop-probe", megabytes: 8)) != nil
    }()
}

/// A line on standard error every tenth of a long run of rounds (`make soak`): long jobs show
/// how far they are.
func reportRound(_ what: String, _ round: Int, of rounds: Int, _ detail: @autoclosure () -> String) {
    guard rounds > 20, round % max(1, rounds / 10) == 0 || round == rounds else { return }
    FileHandle.standardError.write(Data("\(what): round \(round) of \(rounds), \(detail())\n".utf8))
}

/// Waits until `condition` holds, at most `seconds`.
func eventually(_ seconds: Double = 20, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(50_000)
    }
    return condition()
}

/// whenctl for commands that need no control socket (those read the state directory).
func whenctl(_ arguments: [String]) throws -> (status: Int32, output: String, error: String) {
    try runCommand(executable("whenctl"), arguments)
}

/// Sends `events` as one app session on one connection with acks: each must be stored.
func sendSession(_ daemon: TestDaemon, app: String, session: String, _ events: [String]) throws {
    let hello = #"{"hello":{"protocol":1,"app":"\#(app)","session":"\#(session)","acks":true}}"#
    let answers = try exchange(daemon.socketPath, [hello] + events)
    #expect(answers.errors.isEmpty, "\(answers.errors)")
    #expect(answers.acks.last == events.count)
}

/// What screen-tracking derived, as stored: each record's plugin part and cause, in journal order.
func liveDerived(_ daemon: TestDaemon) -> [(cause: Int, text: String)] {
    var out: [(Int, String)] = []
    JournalReader(directory: daemon.journal).read { record, _ in
        let text = String(decoding: record.line, as: UTF8.self)
        if text.contains(#""_origin":"screen-tracking""#), let part = derivedPart(text) { out.append(part) }
        return true
    } onProblem: {
        Issue.record("journal problem: \($0)")
    }
    return out
}

/// What screen-tracking derived live in `daemon` (stopped) is, byte for byte and in the order of
/// its causes, what `whenctl replay` of the pipeline `screens` derives from the same journal in
/// one go; at least `atLeast` records, so that the comparison is about something.
func expectReplayDerivesWhatWasLive(
    _ daemon: TestDaemon, config: String? = nil, atLeast: Int, sourceLocation: SourceLocation = #_sourceLocation
) throws {
    let live = liveDerived(daemon)
    let replay = try whenctl(
        ["replay", "--state-dir", daemon.stateDirectory, "--pipeline", "screens"]
            + (config.map { ["--config", $0] } ?? []) + ["--state-out", scratchDirectory("replay-out")])
    #expect(replay.status == 0, "\(replay.error)", sourceLocation: sourceLocation)
    let replayed = replay.output.split(separator: "\n").compactMap { derivedPart(String($0)) }
    #expect(live.count > atLeast, "\(live.count) derived records", sourceLocation: sourceLocation)
    #expect(
        live.count == replayed.count, "live \(live.count), replay \(replayed.count)", sourceLocation: sourceLocation)
    if let i = (0..<min(live.count, replayed.count)).first(where: {
        live[$0].cause != replayed[$0].cause || live[$0].text != replayed[$0].text
    }) {
        Issue.record(
            "first difference at \(i): live _cause \(live[i].cause) \(live[i].text) / replay _cause \(replayed[i].cause) \(replayed[i].text)",
            sourceLocation: sourceLocation)
    }
}

/// The members a plugin wrote (before the trusted `_origin`…), and the `_cause`.
func derivedPart(_ text: String) -> (cause: Int, text: String)? {
    guard let origin = text.range(of: #","_origin":"#),
        let cause = text.range(of: #""_cause":"#).flatMap({ Int(text[$0.upperBound...].prefix { $0.isNumber }) })
    else { return nil }
    var start = text.index(after: text.startIndex)
    if text.hasPrefix(#"{"_seq":"#), let comma = text.firstIndex(of: ",") { start = text.index(after: comma) }
    return (cause, String(text[start..<origin.lowerBound]))
}

extension BlockingSocket {
    /// Every `{"ack":N}` the daemon sends until it closes the connection, in order.
    func receivedAcks() throws -> [Int] {
        var acks: [Int] = []
        try receiveLines { line in
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                let a = o["ack"] as? Int
            {
                acks.append(a)
            }
        }
        return acks
    }
}

/// whend-demo streaming the seeds' journeys to `daemon` in the background, its output dropped.
func startDemo(_ daemon: TestDaemon, _ arguments: [String]) throws -> Process {
    let demo = Process()
    demo.executableURL = URL(fileURLWithPath: executable("whend-demo"))
    demo.arguments = ["--socket", daemon.socketPath, "--quiet"] + arguments
    demo.standardOutput = FileHandle.nullDevice
    demo.standardError = FileHandle.nullDevice
    try demo.run()
    return demo
}

/// `parent`/plugins, made for the plugin libraries a test builds, 0755 whatever the umask: whend
/// refuses a plugin directory others may write.
func pluginDirectory(in parent: String) throws -> String {
    let plugins = parent + "/plugins"
    try FileManager.default.createDirectory(atPath: plugins, withIntermediateDirectories: true)
    chmod(plugins, 0o755)
    return plugins
}

/// Fills the file system `directory` is on until a write fails for want of space. Returns the
/// file that fills it (unlink it to make room again).
@discardableResult
func fillFileSystem(under directory: String) -> String {
    let filler = directory + "/filler"
    let fd = open(filler, O_WRONLY | O_CREAT, 0o600)
    let block = [UInt8](repeating: 1, count: 4096)
    while write(fd, block, block.count) > 0 {}
    close(fd)
    return filler
}

/// Random hex of `count` bytes' worth: what no compressor makes smaller, so the journal grows.
func incompressible(_ count: Int) -> String {
    (0..<count).map { _ in String(UInt8.random(in: 0...255), radix: 16) }.joined()
}

/// A flag set once, read from any thread.
final class Flag: @unchecked Sendable {
    // Unchecked: `value` is guarded by `lock`.
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}
