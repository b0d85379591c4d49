import ArgumentParser
import Foundation
import WhendControl
import WhendWire

/// `whenctl ui`: the debugger page, served on the loopback interface to whoever has its token.
struct UI: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ui",
        abstract: "Serve a debugger page for the running whend on 127.0.0.1, until Ctrl-C.",
        discussion: """
            The first line printed is the page's address, with a token made for this run: \
            http://whenctl-….localhost:PORT/#token=… (a host name of this run's own, which \
            browsers resolve to 127.0.0.1). Open it in a browser on this machine. The page shows \
            the records live as whend stores them (filters, pause, raw or pretty), the events \
            whend refused lately, sessions and a session's timeline, an app's screen flow, \
            crash reports with their breadcrumbs, the pipelines, and the ingest and pipeline \
            rates of the last minutes. It reads what this user may read: records through a \
            subscription on the event socket (whend's user, root or subscribe_group), status \
            through the control socket, sessions and crash reports from the state directory. \
            Requests for data without the token (the page sends it as Authorization: Bearer, or \
            ?token= for its event stream), and requests naming another host than that one, \
            127.0.0.1:PORT or localhost:PORT, are refused. whend itself opens no TCP port.
            """)

    @OptionGroup var options: ControlOptions

    @Option(name: .long, help: "The TCP port on 127.0.0.1 to serve on (default: a free one).")
    var port: Int = 0

    @Option(
        name: .long,
        help: "The state directory to read sessions and crash reports from (default: the one whend says it uses).")
    var stateDir: String?

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port takes 0…65535; got \(port)") }
    }

    func run() throws {
        let eventSocket = options.socket ?? SocketLocation.eventSocket()
        try refuseUnsafeSocketDirectory(eventSocket)
        // whend must be there to start with: a page that can show nothing helps nobody. A user
        // the control socket refuses (a member of subscribe_group, not an operator) still gets
        // the records.
        var status: StatusAnswer?
        do {
            let answer = try options.answer(.status, timeout: 10)
            guard answer.ok else { throw Failure("whend refused status: \(answer.error ?? "it did not say why")") }
            status = answer.status
        } catch let failure as Failure {
            guard (try? BlockingSocket(path: eventSocket)) != nil else { throw failure }
            printError(
                "whenctl ui: warning: \(failure); the page shows records, but not whend's status, pipelines, rates or rejected events"
            )
        }
        let token = UIToken.make()
        let site = "whenctl-" + UIToken.make().prefix(16) + ".localhost"
        let sampler = UISampler(control: options)
        sampler.start()
        let source = UISource(
            control: options, eventSocket: eventSocket, sampler: sampler,
            stateDirectory: stateDir ?? status?.stateDir ?? SocketLocation.readerStateDirectory())
        let stopped = DispatchSemaphore(value: 0)
        let failure = UIFailureBox()
        UIServer.stopOnSignals()
        Task {
            do {
                try await UIServer(port: port, token: token, site: site, source: source).run { boundPort in
                    // The first line, flushed at once: scripts and tests read the address from it.
                    let line = "http://\(site):\(boundPort)/#token=\(token)\n"
                    FileHandle.standardOutput.write(Data(line.utf8))
                    printError(
                        "whenctl ui: serving whend at \(eventSocket) on 127.0.0.1:\(boundPort) until Ctrl-C; open the address above on this machine"
                    )
                }
            } catch {
                failure.set("cannot serve on 127.0.0.1:\(port) (\(error)); try another --port, or none for a free one")
            }
            stopped.signal()
        }
        stopped.wait()
        if let message = failure.message { throw Failure(message) }
    }
}

/// What went wrong in the server's task, for the command's thread to report.
final class UIFailureBox: @unchecked Sendable {
    // Unchecked: `value` is guarded by `lock`.
    private let lock = NSLock()
    private var value: String?
    func set(_ message: String) { lock.withLock { value = message } }
    var message: String? { lock.withLock { value } }
}

/// The page's secret: 32 bytes from the system's generator (getrandom(2)), in hex.
enum UIToken {
    static func make() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }

    /// Compares in time that does not depend on where they differ.
    static func matches(_ given: Substring?, _ token: String) -> Bool {
        guard let given else { return false }
        let a = Array(given.utf8)
        let b = Array(token.utf8)
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<a.count { difference |= a[i] ^ b[i] }
        return difference == 0
    }
}
