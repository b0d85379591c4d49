import CLinux
import CWhendPlugin
import Foundation
import Logging
import WhendConfiguration
import WhendPluginHost
import WhendSystem
import WhendWire

/// Creates every plugin instance a configuration asks for, and destroys them again, before the
/// configuration is taken up (`whend --check-config`, reload): a configuration a plugin's
/// `create` refuses is refused with the plugin's own message, and the one in force stays.
///
/// The instances are created in a short-lived process of their own, `whend --plugin-check`,
/// the way a pipeline's worker creates them: a plugin whose `create` crashes or hangs takes
/// that process down, not the daemon, and the daemon runs no pipeline plugin's code to check
/// it. Each instance gets an empty scratch state directory, removed afterwards, so that a check
/// touches none of what the running instances keep (a spool, an index, crash reports).
package enum PluginCheck {
    /// What a chain's plugins must be able to do.
    package enum Role: String, Codable, Sendable {
        case ingest
        case pipeline
    }

    /// One chain to create: the ingest middleware, or one pipeline.
    package struct Chain: Codable, Sendable {
        /// As messages name it: "ingest", "pipeline NAME".
        package var what: String
        package var role: Role
        package var stages: [PipelineSpec.Stage]
        /// A built-in pipeline nobody asked for by name: a plugin that is not installed turns
        /// it off (as at start) rather than refusing the configuration.
        package var optional: Bool = false
        /// The pipeline's name, for a pipeline: the outcome tells its stages' names by it.
        package var pipeline: String?
    }

    package struct Request: Codable, Sendable {
        package var chains: [Chain]
        package var pluginDirectories: [String]
        /// Whether each plugin's `create` is tried too (a reload, `--check-config`), or only its
        /// library loaded and checked (whend's start: a pipeline whose plugin refuses its
        /// configuration then fails in its own worker, with backoff, and ingest goes on).
        package var create = true
    }

    package struct Outcome: Sendable {
        /// Why the configuration is refused, naming the chain and the plugin; nil if every
        /// instance was created.
        package var refusal: String?
        /// Built-in pipelines that are off, and why.
        package var off: [String] = []
        /// The names of the built-in pipelines that are off.
        package var offPipelines: Set<String> = []
        /// Each pipeline's stages' names as their libraries give them (what `_origin` says):
        /// learnt here, in the check's process, so that whend never loads a pipeline plugin's
        /// library (its constructors and entry point would run in the daemon).
        package var origins: [String: [String]] = [:]
    }

    /// Every chain of `configuration`: its ingest middleware and each of its pipelines.
    package static func request(for configuration: DaemonConfiguration) -> Request {
        func stages(_ names: [String]) -> [PipelineSpec.Stage] {
            names.map {
                PipelineSpec.Stage(
                    plugin: $0, configuration: configuration.pluginConfigurations[$0] ?? "{}",
                    secrets: configuration.secrets(of: $0).sorted())
            }
        }
        var chains: [Chain] = []
        if !configuration.ingestPlugins.isEmpty {
            chains.append(Chain(what: "ingest", role: .ingest, stages: stages(configuration.ingestPlugins)))
        }
        for (name, plugins) in configuration.effectivePipelines.sorted(by: { $0.key < $1.key }) {
            chains.append(
                Chain(
                    what: "pipeline \(name)", role: .pipeline, stages: stages(plugins),
                    optional: configuration.isImplicitBuiltin(name), pipeline: name))
        }
        return Request(chains: chains, pluginDirectories: configuration.pluginDirectories)
    }

    /// The pipelines of `specs`, as chains to check; those `optional` says are built-in
    /// pipelines nobody asked for by name.
    package static func request(
        for specs: [PipelineSpec], pluginDirectories: [String], optional: (String) -> Bool = { _ in false },
        create: Bool = true
    ) -> Request {
        Request(
            chains: specs.sorted { $0.name < $1.name }.map {
                Chain(
                    what: "pipeline \($0.name)", role: .pipeline, stages: $0.stages, optional: optional($0.name),
                    pipeline: $0.name)
            }, pluginDirectories: pluginDirectories, create: create)
    }

    // MARK: - The daemon's side

    /// Runs the check in `whend --plugin-check` and waits for it, at most `timeout` seconds (a
    /// `create` that hangs is killed, and the configuration refused).
    package static func run(_ request: Request, timeout: TimeInterval) -> Outcome {
        guard !request.chains.isEmpty else { return Outcome() }
        let executable = WhendExecutable.path
        var input: [Int32] = [0, 0]
        var reports: [Int32] = [0, 0]
        guard pipe(&input) == 0 else { return failed("pipe: \(String(cString: strerror(errno)))") }
        guard pipe(&reports) == 0 else {
            close(input[0])
            close(input[1])
            return failed("pipe: \(String(cString: strerror(errno)))")
        }
        for fd in input + reports { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        // The request goes over standard input, never on the command line: it holds plugin
        // configuration, secrets included, and /proc/PID/cmdline is readable by all. Reports
        // come back on descriptor 3; a plugin's own output (standard output and error) goes to
        // whend's log.
        let spawned = HelperProcess.spawn(
            executable, "--plugin-check", standardInput: input[0], descriptors: [(reports[1], 3)])
        close(input[0])
        close(reports[1])
        let pid: pid_t
        switch spawned {
        case .success(let started): pid = started
        case .failure(let error):
            close(input[1])
            close(reports[0])
            return failed("cannot start \(executable) --plugin-check: \(error)")
        }
        let body = Array((try? JSONEncoder().encode(request)) ?? Data())
        writeAll(input[1], body)
        close(input[1])

        var outcome = Outcome()
        /// What the check was doing, for a check that died or hung: the plugin to blame.
        var during = ""
        var scratch: String?
        var finished = false
        var framer = LineFramer(maxLineBytes: 1 << 20)
        var buffer = [UInt8](repeating: 0, count: 65536)
        let deadline = Date().addingTimeInterval(timeout)
        var timedOut = false
        reading: while true {
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else {
                timedOut = true
                kill(pid, SIGKILL)
                break
            }
            var pfd = pollfd(fd: reports[0], events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, Int32(min(left, 3600) * 1000) + 1)
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { read(reports[0], $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            buffer.withUnsafeBufferPointer {
                framer.feed(UnsafeBufferPointer(rebasing: $0[0..<n])) { piece in
                    guard case .line(let line) = piece,
                        let report = try? JSONSerialization.jsonObject(with: Data(buffer: line)) as? [String: Any]
                    else { return }
                    if let path = report["scratch"] as? String { scratch = path }
                    if let what = report["creating"] as? String { during = " while \(what) was created" }
                    if let what = report["loading"] as? String { during = " while \(what) were loaded" }
                    if let off = report["off"] as? String {
                        outcome.off.append(off)
                        if let pipeline = report["pipeline"] as? String { outcome.offPipelines.insert(pipeline) }
                    }
                    if let pipeline = report["pipeline"] as? String, let origins = report["origins"] as? [String] {
                        outcome.origins[pipeline] = origins
                    }
                    if let refusal = report["refused"] as? String { outcome.refusal = refusal }
                    if report["ok"] as? Bool == true { finished = true }
                }
            }
        }
        close(reports[0])
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // A check that died cannot have removed its scratch directory.
        if let scratch, scratch.contains("/whend-plugin-check-") {
            try? FileManager.default.removeItem(atPath: scratch)
        }
        if outcome.refusal != nil { return outcome }
        let signalled = status & 0x7F
        let advice = during.isEmpty ? "" : "; fix that plugin or take it out of the configuration"
        if timedOut {
            outcome.refusal =
                "the plugin check did not finish within \(Settings.number(timeout)) s\(during); it was killed\(advice)"
        } else if signalled != 0 {
            outcome.refusal = "the plugin check was killed by signal \(signalled)\(during)\(advice)"
        } else if !finished || status != 0 {
            outcome.refusal = "the plugin check exited with status \((status >> 8) & 0xFF)\(during)\(advice)"
        }
        return outcome
    }

    private static func failed(_ why: String) -> Outcome {
        Outcome(refusal: "the plugins could not be checked: \(why)")
    }

    private static func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            done += n
        }
    }

    // MARK: - The check's side

    /// `whend --plugin-check`: reads a `Request` on standard input, loads and creates every
    /// chain's plugins as a worker would, destroys them, and reports on descriptor 3, one JSON
    /// object a line: `scratch`, then a pipeline's stages' names (`origins`), `creating` before
    /// each `create`, `off` for a built-in pipeline whose plugin is not installed, and `ok` or
    /// `refused` at the end.
    package static func serve(logger: Logger) -> Never {
        // The report pipe moves out of the plugins' way before any is loaded, as a worker's do:
        // a plugin's constructor that wrote to, or closed, descriptor 3 forged or broke the check.
        guard let reportDescriptor = HelperProcess.takeDescriptors([WorkerFrame.reportDescriptor])?.first else {
            exit(4)
        }
        let reports = FileHandle(fileDescriptor: reportDescriptor, closeOnDealloc: false)
        func report(_ object: [String: Any]) {
            guard let data = try? JSONSerialization.data(withJSONObject: object) else { return }
            try? reports.write(contentsOf: data + Data("\n".utf8))
        }
        guard
            let request = try? JSONDecoder().decode(Request.self, from: FileHandle.standardInput.readDataToEndOfFile())
        else {
            report(["refused": "whend --plugin-check: standard input holds no check request"])
            exit(2)
        }
        var template = Array(
            ((NSTemporaryDirectory() as NSString).appendingPathComponent("whend-plugin-check-XXXXXX")).utf8CString)
        guard
            let scratch = template.withUnsafeMutableBufferPointer({ buffer in
                mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
            })
        else {
            report([
                "refused": "the plugins could not be checked: no scratch directory: \(String(cString: strerror(errno)))"
            ])
            exit(1)
        }
        report(["scratch": scratch])
        func refuse(_ why: String) -> Never {
            try? FileManager.default.removeItem(atPath: scratch)
            report(["refused": why])
            exit(1)
        }
        for (number, chain) in request.chains.enumerated() {
            // A library's constructors run as it loads: one that crashes or hangs is named.
            report(["loading": "the libraries of \(chain.what) (\(chain.stages.map(\.plugin).joined(separator: ", ")))"]
            )
            let libraries: [PluginLibrary]
            do {
                switch chain.role {
                case .ingest:
                    libraries = try PluginLibrary.loadChain(
                        chain.stages.map(\.plugin), directories: request.pluginDirectories)
                case .pipeline:
                    libraries = try PipelineChainBuilder.libraries(
                        chain.stages.map(\.plugin), directories: request.pluginDirectories)
                }
            } catch  where chain.optional {
                report(["off": "built-in \(chain.what) is off: \(error)", "pipeline": chain.pipeline ?? ""])
                continue
            } catch {
                refuse("\(chain.what): \(error)")
            }
            for (stage, library) in zip(chain.stages, libraries) where chain.role == .ingest {
                guard library.roles & WHEND_ROLE_INGEST != 0 else {
                    refuse("plugin \(stage.plugin) (\(library.path)) is not ingest middleware; it cannot be in ingest")
                }
            }
            if let pipeline = chain.pipeline {
                report(["pipeline": pipeline, "origins": libraries.map(\.name)])
            }
            guard request.create else { continue }
            var instances: [PluginInstance] = []
            for (stage, library) in zip(chain.stages, libraries) {
                report(["creating": "plugin \(stage.plugin) of \(chain.what)"])
                do {
                    instances.append(
                        try PluginInstance(
                            library: library, configuration: stage.configuration, secrets: Set(stage.secrets ?? []),
                            stateDirectory: "\(scratch)/\(number)/\(stage.plugin)", logger: logger))
                } catch {
                    refuse("\(chain.what): \(error)")
                }
            }
            // Destroyed in the order a worker's chain goes: each plugin's `destroy` runs here.
            instances.removeAll()
        }
        try? FileManager.default.removeItem(atPath: scratch)
        report(["ok": true])
        exit(0)
    }
}
