import ArgumentParser
import Foundation
import Logging
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

/// `whenctl replay`: a range of the journal through a pipeline offline, or re-sent to a daemon.
struct Replay: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a range of the journal through a pipeline offline, or send it again to a live daemon.",
        discussion: """
            --pipeline NAME (or --plugin PATH) runs the records through the same plugin code as \
            the daemon's live pipelines, with the records' own times: derived records are printed \
            as JSON lines, byte for byte the same for the same input. The live cursors are not \
            touched; the plugins keep their state in --state-out (a new scratch directory unless \
            given). A record a plugin fails on is reported and not retried.

            --to-socket PATH sends the records again, as a client would (without their _ fields; \
            derived records are left out, the receiving daemon's pipelines derive their own), in \
            _seq order over one connection, so every session keeps its order; at --speed N the \
            original gaps between records are kept, divided by N.
            """
    )

    @OptionGroup var location: JournalLocationOptions
    @OptionGroup var filters: RecordFilterOptions

    @Option(name: .long, help: "Run this pipeline of the daemon's configuration.")
    var pipeline: String?

    @Option(name: .long, help: "Run this plugin library (lib<name>.so) alone.")
    var plugin: String?

    @Option(name: .long, help: "The configuration (a JSON object) for --plugin.")
    var pluginConfig: String = "{}"

    @Option(name: .long, help: "The daemon's configuration file (default: $WHEND_CONFIG, else /etc/whend/whend.conf).")
    var config: String?

    @Option(name: .long, help: "Where the replayed plugins keep their state.")
    var stateOut: String?

    @Option(name: .long, help: "Send the records to the daemon on this event socket.")
    var toSocket: String?

    @Option(name: .long, help: "With --to-socket: the original pace times N (default 1).")
    var speed: Double?

    @Flag(name: .long, help: "With --to-socket: no pauses.")
    var asFastAsPossible = false

    func validate() throws {
        let modes = [pipeline != nil, plugin != nil, toSocket != nil].filter { $0 }.count
        guard modes == 1 else { throw ValidationError("give one of --pipeline, --plugin or --to-socket") }
        if let speed, speed <= 0 || !speed.isFinite { throw ValidationError("--speed must be a number above 0") }
        if toSocket != nil && filters.output == .short {
            throw ValidationError("-o chooses how derived records print; --to-socket prints none")
        }
        if speed != nil && asFastAsPossible {
            throw ValidationError("--speed and --as-fast-as-possible exclude each other")
        }
    }

    func run() throws {
        let directory = try location.existingDirectory()
        let filter = try filters.filter()
        if let toSocket {
            try resend(directory: directory, filter: filter, socket: toSocket)
        } else {
            try runPipeline(directory: directory, filter: filter)
        }
    }

    // MARK: Offline through a pipeline

    private func runPipeline(directory: JournalDirectory, filter: RecordFilter) throws {
        let stages: [(plugin: String, configuration: String)]
        let pluginDirectories: [String]
        let title: String
        if let plugin {
            let file = (plugin as NSString).lastPathComponent
            guard file.hasPrefix("lib"), file.hasSuffix(".so") else {
                throw ValidationError("--plugin takes a library named lib<name>.so, not \(file)")
            }
            guard (try? JSONSerialization.jsonObject(with: Data(pluginConfig.utf8))) is [String: Any] else {
                throw ValidationError("--plugin-config must be a JSON object")
            }
            let name = String(file.dropFirst(3).dropLast(3))
            let absolute = plugin.hasPrefix("/") ? plugin : FileManager.default.currentDirectoryPath + "/" + plugin
            stages = [(name, pluginConfig)]
            pluginDirectories = [(absolute as NSString).deletingLastPathComponent]
            title = "plugin \(name)"
        } else {
            let (configuration, _) = try DaemonConfiguration.resolve(file: config)
            guard let pipeline, let found = PipelineReplay.stages(of: pipeline, in: configuration) else {
                let known = configuration.effectivePipelines.keys.sorted().joined(separator: ", ")
                throw Failure("no pipeline \(pipeline ?? "") in the configuration; there are: \(known)")
            }
            stages = found
            pluginDirectories = configuration.pluginDirectories
            title = "pipeline \(pipeline) (\(found.map(\.plugin).joined(separator: ", ")))"
        }
        let stateDirectory = stateOut ?? NSTemporaryDirectory() + "whenctl-replay-\(getpid())"
        try FileManager.default.createDirectory(atPath: stateDirectory, withIntermediateDirectories: true)
        var logger = Logger(label: "whenctl-replay") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = .warning
        let out = SharedOutput(short: filters.output == .short)
        let replay = try PipelineReplay(
            stages: stages, pluginDirectories: pluginDirectories, stateDirectory: stateDirectory, logger: logger
        ) { derived in out.write(derived) }

        var counts = (records: 0, passed: 0, dropped: 0, failed: 0)
        let progress = Progress(label: "replaying", total: estimatedTotal(directory, filter))
        JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
            record, _ in
            if filter.isPastEnd(record) { return false }
            guard filter.matches(record), let seq = record.seq else { return true }
            counts.records += 1
            switch replay.handle(record.line, seq: seq) {
            case .passed: counts.passed += 1
            case .dropped: counts.dropped += 1
            case .failed(let why):
                counts.failed += 1
                out.flush()
                printError("whenctl replay: _seq \(seq): \(why)")
            }
            progress.update(counts.records)
            return true
        } onProblem: { problem in
            out.flush()
            printError("whenctl replay: warning: \(problem)")
        }
        do {
            try replay.finish()
        } catch {
            out.flush()
            progress.finish()
            throw Failure("\(error); its state in \(stateDirectory) may lack the last records' effects")
        }
        out.flush()
        progress.finish()
        printError(
            "whenctl replay: \(counts.records) records through \(title): \(counts.passed) passed, \(counts.dropped) dropped, \(counts.failed) failed; \(out.lines) derived records; plugin state in \(stateDirectory)"
        )
        if counts.failed > 0 { throw ExitCode(1) }
    }

    // MARK: Again to a live daemon

    private func resend(directory: JournalDirectory, filter: RecordFilter, socket: String) throws {
        try refuseUnsafeSocketDirectory(socket)
        let connection: BlockingSocket
        do { connection = try BlockingSocket(path: socket) } catch { throw unreachable(.events, at: socket, error) }
        try connection.send(#"{"hello":{"protocol":1,"acks":true}}"# + "\n")
        let answers = AnswerReader(connection)
        answers.start()
        let pace = asFastAsPossible ? nil : (speed ?? 1)
        var firstTime: (record: Int64, wall: Double)?
        var sent = 0
        var skipped = 0
        var batch: [UInt8] = []
        let progress = Progress(label: "sending", total: estimatedTotal(directory, filter))
        var failure: Error?
        JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
            record, _ in
            if filter.isPastEnd(record) { return false }
            guard filter.matches(record) else { return true }
            // whend's scanner, not Foundation's: an event with an unpaired surrogate's escape or
            // a number past a Double is an app's event all the same, and is sent.
            guard let fields = try? record.fields(), !fields.isDerived else {
                skipped += 1
                return true
            }
            if let pace, let received = fields.receivedMicros {
                let now = monotonicSeconds()
                let start = firstTime ?? (received, now)
                firstTime = start
                let due = start.wall + Double(received - start.record) / 1e6 / pace
                if due > now {
                    if !batch.isEmpty {
                        do { try connection.send(batch) } catch { failure = error; return false }
                        batch.removeAll(keepingCapacity: true)
                    }
                    Thread.sleep(forTimeInterval: due - now)
                }
            }
            // The event as the app sent it, members as stored, less what whend added (its
            // trusted members, which the receiving whend would refuse).
            guard let line = try? appMembers(of: record.line) else {
                skipped += 1
                return true
            }
            batch += line
            batch.append(0x0A)
            sent += 1
            if batch.count > 1 << 16 {
                do { try connection.send(batch) } catch { failure = error; return false }
                batch.removeAll(keepingCapacity: true)
            }
            progress.update(sent + skipped)
            return true
        } onProblem: { problem in
            printError("whenctl replay: warning: \(problem)")
        }
        if let failure {
            throw Failure("whend closed \(socket) after \(sent) events: \(failure); what it acknowledged is stored")
        }
        if !batch.isEmpty { try connection.send(batch) }
        connection.finishSending()
        let (acked, errors) = answers.wait()
        progress.finish()
        printError(
            "whenctl replay: \(sent) records sent to \(socket), \(acked) acknowledged, \(errors.count) refused; \(skipped) derived or unreadable records left out"
        )
        for e in errors.prefix(10) { printError("  \(e)") }
        if !errors.isEmpty || acked < sent { throw ExitCode(1) }
    }

    /// How many records the range holds at most, for the progress bar (nil when there is no
    /// terminal to show it on).
    private func estimatedTotal(_ directory: JournalDirectory, _ filter: RecordFilter) -> Int? {
        guard isatty(2) == 1 else { return nil }
        let segments = directory.segments()
        guard let first = segments.first?.firstSeq else { return nil }
        var last: UInt64 = 0
        JournalReader(directory: directory).read(fromSeq: segments.last?.firstSeq) { record, _ in
            last = record.seq ?? last
            return true
        } onProblem: { _ in
        }
        let from = max(first, filter.fromSeq ?? first)
        let to = min(last, filter.toSeq ?? last)
        return to >= from ? Int(to - from + 1) : 0
    }
}

/// Standard output shared with the plugins' emit callback.
///
/// Plugins are code of someone else's that may print to their standard output (a C plugin's
/// `printf`): before any is loaded, the derived records keep standard output on a descriptor of
/// their own, and descriptor 1 becomes standard error, so that nothing a plugin prints ends up
/// among the records (as in whend, where a worker's standard output goes to whend's log).
final class SharedOutput: @unchecked Sendable {
    // Unchecked: a replay runs on one thread.
    private let out: Output = {
        fflush(nil)
        let records = fcntl(1, F_DUPFD_CLOEXEC, 3)
        guard records >= 0, dup2(2, 1) == 1 else { return Output() }
        return Output(descriptor: records)
    }()
    private(set) var lines = 0
    /// `-o short`: each derived record in cat's short form (it was accepted and ignored).
    private let short: Bool

    init(short: Bool) { self.short = short }

    func write(_ bytes: UnsafeBufferPointer<UInt8>) {
        lines += 1
        if short { out.write(shortForm(bytes)) } else { out.write(bytes) }
    }
    func flush() { out.flush() }
}

/// Reads acks and errors while records are sent.
final class AnswerReader: @unchecked Sendable {
    // Unchecked: `acked` and `errors` are written by the reader thread and read after `done`.
    private let connection: BlockingSocket
    private var acked = 0
    private var errors: [String] = []
    private let done = DispatchSemaphore(value: 0)

    init(_ connection: BlockingSocket) { self.connection = connection }

    func start() {
        Thread { [self] in
            try? connection.receiveLines { line in
                if let range = line.range(of: #""ack":"#) {
                    acked = Int(line[range.upperBound...].prefix { $0.isNumber }) ?? acked
                } else if line.contains(#""error""#) {
                    errors.append(line)
                }
            }
            done.signal()
        }.start()
    }

    func wait() -> (acked: Int, errors: [String]) {
        done.wait()
        return (acked, errors)
    }
}

/// A progress bar on standard error when it is a terminal, quiet otherwise.
final class Progress {
    private let label: String
    private let total: Int?
    private let enabled = isatty(2) == 1
    private var last = 0.0
    private let start = monotonicSeconds()

    init(label: String, total: Int?) {
        self.label = label
        self.total = total
    }

    func update(_ done: Int) {
        guard enabled else { return }
        let now = monotonicSeconds()
        guard now - last >= 0.1 else { return }
        last = now
        let rate = Double(done) / max(now - start, 1e-3)
        var text = "\r\(label) \(done)"
        if let total, total > 0 {
            let fraction = min(1, Double(done) / Double(total))
            let width = 30
            let filled = Int(fraction * Double(width))
            text =
                "\r\(label) [\(String(repeating: "#", count: filled))\(String(repeating: ".", count: width - filled))] \(Int(fraction * 100))% \(done)/\(total)"
        }
        text += String(format: ", %.0f records/s ", rate)
        FileHandle.standardError.write(Data(text.utf8))
    }

    func finish() {
        if enabled && last > 0 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// A stored record without its members whose keys begin with `_` (the trusted ones whend adds):
/// the others byte for byte, in their order.
func appMembers(of line: UnsafeBufferPointer<UInt8>) throws(WireError) -> [UInt8] {
    var scanner = JSONScanner(line)
    scanner.skipWhitespace()
    var out: [UInt8] = [UInt8(ascii: "{")]
    try scanner.scanObject { m throws(WireError) in
        let key = UnsafeBufferPointer(rebasing: line[m.key])
        if key.first == UInt8(ascii: "_") || (m.keyHasEscapes && decodeJSONString(key).first == UInt8(ascii: "_")) {
            return
        }
        if out.count > 1 { out.append(UInt8(ascii: ",")) }
        out += line[m.quotedKey]
        out.append(UInt8(ascii: ":"))
        out += line[m.value]
    }
    out.append(UInt8(ascii: "}"))
    return out
}
