import ArgumentParser
import Foundation
import WhendControl
import WhendWire

/// Where the control socket is: `--control`, else `$WHEND_CONTROL_SOCKET`, else `control.sock`
/// beside the event socket (`--socket`, `$WHEND_SOCKET` or the usual places).
struct ControlOptions: ParsableArguments {
    @Option(name: .long, help: "The control socket (default: $WHEND_CONTROL_SOCKET, else beside the event socket).")
    var control: String?

    @Option(name: .long, help: "The event socket whose control socket to use.")
    var socket: String?

    var path: String {
        if let control { return control }
        if let path = ProcessInfo.processInfo.environment["WHEND_CONTROL_SOCKET"], !path.isEmpty { return path }
        return SocketLocation.controlSocket(besideEventSocket: socket ?? SocketLocation.eventSocket())
    }

    /// How long whenctl waits for whend's whole answer (a reload checks plugins first).
    static let answerTimeout: TimeInterval = 120

    /// Sends one request and returns whend's answer; fails, saying why, when whend cannot be
    /// asked, and (exit 1) when it refuses.
    func request(_ request: ControlRequest, as name: String) throws -> ControlAnswer {
        let answer = try self.answer(request)
        if !answer.ok {
            let why =
                answer.error.flatMap { $0.isEmpty ? nil : $0 } ?? "whend refused without saying why; its log may say"
            printError("whenctl \(name): \(printable(why))")
            throw ExitCode(1)
        }
        return answer
    }

    /// whend's answer to `request`, refusal or not; fails, saying why, when whend cannot be asked
    /// or its answer cannot be read.
    func answer(_ request: ControlRequest, timeout: TimeInterval = Self.answerTimeout) throws -> ControlAnswer {
        let path = self.path
        let line = try exchange(request.encoded(), timeout: timeout)
        guard let decoded = ControlAnswer.decode(line) else {
            throw Failure(
                "whend's answer on \(path) is not one this whenctl reads: \(printable(String(decoding: line.prefix(200), as: UTF8.self), limit: 200))"
            )
        }
        return decoded
    }

    /// Sends one request line (without its newline) and returns whend's answer line as it came.
    func exchange(_ requestLine: [UInt8], timeout: TimeInterval = Self.answerTimeout) throws -> [UInt8] {
        let path = self.path
        try refuseUnsafeSocketDirectory(path)
        let connection: BlockingSocket
        do { connection = try BlockingSocket(path: path) } catch { throw unreachable(.control, at: path, error) }
        // A whend that answered at once (it is stopping) and closed may have done so before
        // the request was sent: its answer is read all the same.
        var sendError: Error?
        do {
            try connection.send(requestLine + [0x0A])
            connection.finishSending()
        } catch {
            sendError = error
        }
        let first: BlockingSocket.FirstLine
        do {
            first = try connection.receiveFirstLine(timeout: timeout)
        } catch {
            throw unanswered(at: path, because: sendError ?? error)
        }
        switch first {
        case .timedOut:
            // A whend that accepts and never answers (stopped, or out of descriptors) is said so.
            throw Failure(
                "whend accepted on \(path) but did not answer within \(Int(timeout)) s; its log (journalctl -u whend, or make run's terminal) says why"
            )
        case .closed:
            throw unanswered(at: path, because: sendError)
        case .tooLong:
            throw Failure(
                "whend's answer on \(path) is longer than \(BlockingSocket.maxAnswerBytes >> 20) MiB, more than whenctl reads; what was asked may have been done: `whenctl status` and whend's log say"
            )
        case .line(let bytes):
            return bytes
        }
    }
}

/// Prints `value` as indented JSON, its keys sorted.
func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show what the running whend is doing: clients, rates, journal, pipelines.")

    @OptionGroup var options: ControlOptions

    @Flag(name: .long, help: "Print the status as JSON.")
    var json = false

    func run() throws {
        guard let status = try options.request(.status, as: "status").status else {
            throw Failure("whend answered status without one")
        }
        if json {
            try printJSON(status)
            return
        }
        let journal = status.journal
        print("whend \(status.version), pid \(status.pid), up \(status.uptimeSeconds) s")
        print("  events socket   \(status.socket)")
        print("  control socket  \(status.controlSocket)")
        print("  configuration   \(status.configFile ?? "embedded defaults")")
        print("  clients         \(status.connections)")
        print("  events/s        \(status.eventsPerSecond)")
        print("  received        \(status.eventsReceived) events, \(status.bytesReceived) bytes")
        let rejected = status.eventsRejected.sorted { $0.key < $1.key }
        print(
            "  rejected        \(rejected.isEmpty ? "none" : rejected.map { "\($0.key) \($0.value)" }.joined(separator: ", "))"
        )
        print("  journal         \(journal.directory)")
        print(
            "                  last _seq \(journal.lastSeq), \(journal.segments) segment(s), \(journal.bytes) bytes, durability \(journal.durability)"
        )
        if let failing = journal.failing { print("                  FAILING: \(failing)") }
        print("  pipelines       \(status.pipelines.isEmpty ? "none" : "\(status.pipelines.count)")")
        if let reload = status.lastReload {
            print("  last reload     \(reload.at): \(reload.outcome)")
        }
    }
}

struct Reload: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make the running whend re-read its configuration and apply what changed.",
        discussion: """
            The same as SIGHUP, but it waits for the outcome. An invalid configuration is \
            refused (exit 1) and the one in force stays; settings that need a restart are named.
            """)

    @OptionGroup var options: ControlOptions

    func run() throws {
        let answer = try options.request(.reload, as: "reload")
        let changed = answer.changed ?? []
        print(changed.isEmpty ? "reloaded: nothing changed" : "reloaded:")
        // Each as one line a terminal shows as it is: the values are the configuration's.
        for line in changed { print("  \(printable(line))") }
        for key in answer.needRestart ?? [] {
            print("  \(printable(key)) changed; it takes effect when whend restarts")
        }
    }
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print whend's metrics in the Prometheus text format.")

    @OptionGroup var options: ControlOptions

    func run() throws {
        print(try options.request(.metrics, as: "metrics").metrics ?? "", terminator: "")
    }
}

struct Rejections: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the event lines whend refused lately (the newest 100), oldest first.",
        discussion: """
            Each with when, the error code and message its sender was given, the sender (app, \
            pid, uid) and the line's first 1024 bytes, control characters escaped. --json prints \
            the control socket's answer as it is.
            """)

    @OptionGroup var options: ControlOptions

    @Flag(name: .long, help: "Print the list as JSON.")
    var json = false

    func run() throws {
        let list = try options.request(.rejections, as: "rejections").rejections ?? []
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            print(String(decoding: try encoder.encode(["rejections": list]), as: UTF8.self))
            return
        }
        if list.isEmpty { print("no event refused since whend started (it keeps the newest 100)") }
        for r in list {
            let app = r.app.map { printable($0) } ?? "-"
            print("\(r.time) \(r.code) app=\(app) pid=\(r.pid) uid=\(r.uid): \(printable(r.message))")
            if let line = r.line { print("  " + printable(line) + (r.truncated ? " …" : "")) }
        }
    }
}

struct Plugins: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the running whend's plugins and pipelines, unload or load a plugin, or restart a pipeline.",
        discussion: """
            whenctl plugins [--json] lists them, with each plugin's counters and each pipeline's \
            cursor and lag; whenctl plugins unload NAME stops routing records to a plugin (its \
            pipelines wait at their cursors) and load NAME routes them again; whenctl plugins \
            restart PIPELINE restarts its worker from its cursor.
            """)

    @OptionGroup var options: ControlOptions

    @Argument(help: "load PLUGIN, unload PLUGIN, restart PIPELINE, or nothing to list")
    var action: [String] = []

    @Flag(name: .long, help: "Print the list as JSON.")
    var json = false

    @Flag(
        name: .long,
        help:
            "First wait until every pipeline has handled the journal as it is now, and what they derived from it.")
    var wait = false

    @Option(name: .long, help: "How long --wait waits, in seconds, before it fails.")
    var timeout: Double = 60

    func run() throws {
        if wait { try waitUntilCaughtUp() }
        if let verb = action.first, verb == "load" || verb == "unload" {
            guard action.count == 2 else { throw ValidationError("whenctl plugins \(verb) PLUGIN") }
            _ = try options.request(
                verb == "load" ? .load(plugin: action[1]) : .unload(plugin: action[1]), as: "plugins \(verb)")
            print(verb == "unload" ? "\(action[1]) unloaded: no records are routed to it" : "\(action[1]) loaded")
            return
        }
        if action.first == "restart" {
            guard action.count == 2 else { throw ValidationError("whenctl plugins restart PIPELINE") }
            _ = try options.request(.restart(pipeline: action[1]), as: "plugins restart")
            print("restarting pipeline \(action[1]) from its cursor")
            return
        }
        guard action.isEmpty else {
            throw ValidationError("unknown action \(action[0]); try whenctl plugins restart PIPELINE")
        }
        let answer = try options.request(.plugins, as: "plugins")
        let plugins = answer.plugins ?? []
        let pipelines = answer.pipelines ?? []
        if json {
            try printJSON(ControlAnswer.PluginsList(plugins: plugins, pipelines: pipelines))
            return
        }
        if plugins.isEmpty && pipelines.isEmpty { print("no plugins loaded") }
        for p in pipelines {
            let stages = p.plugins.joined(separator: " → ")
            print(
                "pipeline \(p.name): \(stages); \(p.state) (pid \(p.pid)), cursor \(p.cursor), lag \(p.lag), failures \(p.failures), dead letters \(p.deadLetters), restarts \(p.restarts)\(retentionLosses(p))"
            )
            // Each stage's own counters (host.count), since whend started.
            for stage in p.plugins {
                guard let values = p.counters[stage], !values.isEmpty else { continue }
                print(
                    "  \(stage): "
                        + values.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
            }
        }
        for p in plugins {
            let routes = (p.routes ?? []).joined(separator: ", ")
            let counters = (p.counters ?? [:]).sorted { $0.key < $1.key }
                .map { "\($0.key) \($0.value)" }.joined(separator: ", ")
            if p.state == "unloaded" {
                print("\(p.name) unloaded (no records routed to it)")
                continue
            }
            print(
                "\(p.name) \(p.version ?? "?") (ABI \(p.abi.map(String.init) ?? "?")) \(p.state) in \(routes)\(counters.isEmpty ? "" : "; \(counters)")"
            )
            print("  \(p.path ?? "")")
        }
    }
}

extension Plugins {
    /// Until every pipeline's cursor is at the journal's last _seq as it was asked, then
    /// again for what they derived meanwhile (a chain of derivations is short); not until the
    /// lag is 0, which a steady stream of events may never allow.
    func waitUntilCaughtUp() throws {
        let deadline = Date().addingTimeInterval(timeout)
        func snapshot() throws -> (last: UInt64, cursors: [String: UInt64]) {
            guard let status = try options.request(.status, as: "plugins --wait").status else {
                throw Failure("whend answered status without one")
            }
            var cursors: [String: UInt64] = [:]
            // A pipeline whose worker is restarting counts too, at its cursor: it has not
            // handled what it is behind (after a failed store, say, its worker is started again).
            for p in status.pipelines { cursors[p.name] = p.cursor }
            return (status.journal.lastSeq, cursors)
        }
        var target = try snapshot().last
        for _ in 0..<8 {
            while true {
                let now = try snapshot()
                if now.cursors.values.allSatisfy({ $0 >= target }) {
                    if now.last == target { return }
                    target = now.last
                    break
                }
                guard Date() < deadline else {
                    let behind = now.cursors.filter { $0.value < target }.sorted { $0.key < $1.key }
                        .map { "\($0.key) at \($0.value)" }.joined(separator: ", ")
                    throw Failure(
                        "pipelines still behind _seq \(target) after \(timeout) s: \(behind); `whenctl plugins` shows their state, --timeout waits longer"
                    )
                }
                usleep(50_000)
            }
        }
    }
}

/// ", lost to retention N (skipped M)" when retention deleted records before a pipeline read them.
func retentionLosses(_ pipeline: PipelineStatus) -> String {
    guard pipeline.lostToRetention > 0 || pipeline.skipped > 0 else { return "" }
    return ", LOST TO RETENTION \(pipeline.lostToRetention) records (the worker skipped \(pipeline.skipped))"
}
