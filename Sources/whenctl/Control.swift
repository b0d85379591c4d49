import ArgumentParser
import Foundation
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

    /// Sends one command and returns the reply; fails, saying why, when whend cannot be asked.
    func request(_ command: String, as name: String, _ arguments: [String: String] = [:]) throws -> [String: Any] {
        let path = self.path
        try refuseUnsafeSocketDirectory(path)
        do {
            let connection = try BlockingSocket(path: path)
            var request: [String: String] = arguments
            request["command"] = command
            let data = try JSONSerialization.data(withJSONObject: request)
            try connection.send(Array(data) + [0x0A])
            connection.finishSending()
            var reply: [String: Any]?
            try connection.receiveLines { line in
                if reply == nil {
                    reply = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                }
            }
            guard let reply else {
                throw Failure("whend closed \(path) without an answer; its log says why")
            }
            return reply
        } catch let failure as Failure {
            throw failure
        } catch {
            throw unreachable(.control, at: path, error)
        }
    }
}

/// Prints the daemon's refusal and exits 1.
func failIfRefused(_ reply: [String: Any], as name: String) throws {
    if reply["ok"] as? Bool != true {
        printError("whenctl \(name): \(reply["error"] as? String ?? "whend refused")")
        throw ExitCode(1)
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show what the running whend is doing: clients, rates, journal, pipelines.")

    @OptionGroup var options: ControlOptions

    @Flag(name: .long, help: "Print the status as JSON.")
    var json = false

    func run() throws {
        let reply = try options.request("status", as: "status")
        try failIfRefused(reply, as: "status")
        let status = reply["status"] as? [String: Any] ?? [:]
        if json {
            let data = try JSONSerialization.data(withJSONObject: status, options: [.sortedKeys, .prettyPrinted])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        let journal = status["journal"] as? [String: Any] ?? [:]
        func value(_ object: [String: Any], _ key: String) -> String {
            guard let v = object[key], !(v is NSNull) else { return "-" }
            return "\(v)"
        }
        print("whend \(value(status, "version")), pid \(value(status, "pid")), up \(value(status, "uptime_seconds")) s")
        print("  events socket   \(value(status, "socket"))")
        print("  control socket  \(value(status, "control_socket"))")
        print(
            "  configuration   \(value(status, "config_file") == "-" ? "embedded defaults" : value(status, "config_file"))"
        )
        print("  clients         \(value(status, "connections"))")
        print("  events/s        \(value(status, "events_per_second"))")
        print("  received        \(value(status, "events_received")) events, \(value(status, "bytes_received")) bytes")
        let rejected = (status["events_rejected"] as? [String: Any] ?? [:]).sorted { $0.key < $1.key }
        print(
            "  rejected        \(rejected.isEmpty ? "none" : rejected.map { "\($0.key) \($0.value)" }.joined(separator: ", "))"
        )
        print("  journal         \(value(journal, "directory"))")
        print(
            "                  last _seq \(value(journal, "last_seq")), \(value(journal, "segments")) segment(s), \(value(journal, "bytes")) bytes, durability \(value(journal, "durability"))"
        )
        if let failing = journal["failing"] as? String { print("                  FAILING: \(failing)") }
        let pipelines = status["pipelines"] as? [[String: Any]] ?? []
        print("  pipelines       \(pipelines.isEmpty ? "none" : "\(pipelines.count)")")
        if let reload = status["last_reload"] as? [String: Any] {
            print("  last reload     \(value(reload, "at")): \(value(reload, "outcome"))")
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
        let reply = try options.request("reload", as: "reload")
        try failIfRefused(reply, as: "reload")
        let changed = reply["changed"] as? [String] ?? []
        print(changed.isEmpty ? "reloaded: nothing changed" : "reloaded:")
        for line in changed { print("  \(line)") }
        for key in reply["need_restart"] as? [String] ?? [] {
            print("  \(key) changed; it takes effect when whend restarts")
        }
    }
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print whend's metrics in the Prometheus text format.")

    @OptionGroup var options: ControlOptions

    func run() throws {
        let reply = try options.request("metrics", as: "metrics")
        try failIfRefused(reply, as: "metrics")
        print(reply["metrics"] as? String ?? "", terminator: "")
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
            let reply = try options.request(verb, as: "plugins \(verb)", ["plugin": action[1]])
            try failIfRefused(reply, as: "plugins \(verb)")
            print(verb == "unload" ? "\(action[1]) unloaded: no records are routed to it" : "\(action[1]) loaded")
            return
        }
        if action.first == "restart" {
            guard action.count == 2 else { throw ValidationError("whenctl plugins restart PIPELINE") }
            let reply = try options.request("restart", as: "plugins restart", ["pipeline": action[1]])
            try failIfRefused(reply, as: "plugins restart")
            print("restarting pipeline \(action[1]) from its cursor")
            return
        }
        guard action.isEmpty else {
            throw ValidationError("unknown action \(action[0]); try whenctl plugins restart PIPELINE")
        }
        let reply = try options.request("plugins", as: "plugins")
        try failIfRefused(reply, as: "plugins")
        let plugins = reply["plugins"] as? [[String: Any]] ?? []
        let pipelines = reply["pipelines"] as? [[String: Any]] ?? []
        if json {
            let data = try JSONSerialization.data(
                withJSONObject: ["plugins": plugins, "pipelines": pipelines], options: [.sortedKeys, .prettyPrinted])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        if plugins.isEmpty && pipelines.isEmpty { print("no plugins loaded") }
        for p in pipelines {
            let stages = (p["plugins"] as? [String] ?? []).joined(separator: " → ")
            print(
                "pipeline \(p["name"] ?? "?"): \(stages); \(p["state"] ?? "?") (pid \(p["pid"] ?? "-")), cursor \(p["cursor"] ?? 0), lag \(p["lag"] ?? 0), failures \(p["failures"] ?? 0), dead letters \(p["dead_letters"] ?? 0), restarts \(p["restarts"] ?? 0)\(retentionLosses(p))"
            )
            // Each stage's own counters (host.count), since whend started.
            let counters = p["counters"] as? [String: [String: Any]] ?? [:]
            for stage in p["plugins"] as? [String] ?? [] {
                guard let values = counters[stage], !values.isEmpty else { continue }
                print(
                    "  \(stage): "
                        + values.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
            }
        }
        for p in plugins {
            let routes = (p["routes"] as? [String] ?? []).joined(separator: ", ")
            let counters = (p["counters"] as? [String: Any] ?? [:]).sorted { $0.key < $1.key }
                .map { "\($0.key) \($0.value)" }.joined(separator: ", ")
            if p["state"] as? String == "unloaded" {
                print("\(p["name"] ?? "?") unloaded (no records routed to it)")
                continue
            }
            print(
                "\(p["name"] ?? "?") \(p["version"] ?? "?") (ABI \(p["abi"] ?? "?")) \(p["state"] ?? "?") in \(routes)\(counters.isEmpty ? "" : "; \(counters)")"
            )
            print("  \(p["path"] ?? "")")
        }
    }
}

extension Plugins {
    /// Until every pipeline's cursor is at the journal's last _seq as it was asked, then
    /// again for what they derived meanwhile (a chain of derivations is short); not until the
    /// lag is 0, which a steady stream of events may never allow.
    func waitUntilCaughtUp() throws {
        let deadline = Date().addingTimeInterval(timeout)
        func snapshot() throws -> (last: Int, cursors: [String: Int]) {
            let reply = try options.request("status", as: "plugins --wait")
            try failIfRefused(reply, as: "plugins --wait")
            let status = reply["status"] as? [String: Any] ?? [:]
            let last = (status["journal"] as? [String: Any])?["last_seq"] as? Int ?? 0
            var cursors: [String: Int] = [:]
            // A pipeline whose worker is restarting counts too, at its cursor: it has not
            // handled what it is behind (after a failed store, say, its worker is started again).
            for p in status["pipelines"] as? [[String: Any]] ?? [] {
                cursors[p["name"] as? String ?? "?"] = p["cursor"] as? Int ?? 0
            }
            return (last, cursors)
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
func retentionLosses(_ pipeline: [String: Any]) -> String {
    let lost = pipeline["lost_to_retention"] as? Int ?? 0
    let skipped = pipeline["skipped"] as? Int ?? 0
    guard lost > 0 || skipped > 0 else { return "" }
    return ", LOST TO RETENTION \(lost) records (the worker skipped \(skipped))"
}
