import Foundation
import Testing
import WhendSystem
import WhendWire

/// A listening Unix stream socket, as a service manager's `.socket` unit holds one, or a peer
/// standing in for whend.
final class UnixTestListener: Sendable {
    let fd: Int32

    init(path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard withUnixSocketAddress(path, { bind(fd, $0, $1) }) == 0, listen(fd, 128) == 0 else {
            throw TestFailure(description: "listen on \(path): \(String(cString: strerror(errno)))")
        }
    }

    deinit { close(fd) }

    /// Accepts one connection on a thread of its own and hands it to `body`, which owns it.
    func serveOne(_ body: @escaping @Sendable (Int32) -> Void) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        Thread { [self] in
            let connection = accept(fd, nil, nil)
            if connection >= 0 { body(connection) }
            done.signal()
        }.start()
        return done
    }

    /// Accepts a connection and, once its request has come, closes it unread: the peer's
    /// connection is reset, as when a process ends with a request in its socket.
    func resetOneConnectionOnceItAsks() {
        let connection = accept(fd, nil, nil)
        guard connection >= 0 else { return }
        var pfd = pollfd(fd: connection, events: Int16(POLLIN), revents: 0)
        _ = poll(&pfd, 1, 10_000)
        close(connection)
    }
}

/// A stand-in for the service manager's notification socket: a Unix datagram socket.
final class NotifySocket {
    let path: String
    let fd: Int32

    init(directory: String) throws {
        path = directory + "/notify.sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let rc = withUnixSocketAddress(path) { bind(fd, $0, $1) }
        guard rc == 0 else { throw TestFailure(description: "bind \(path): \(String(cString: strerror(errno)))") }
    }

    deinit { close(fd) }

    /// The messages received within `seconds`, each split into its KEY=VALUE lines.
    func messages(for seconds: Double) -> [[String]] {
        var result: [[String]] = []
        let deadline = Date().addingTimeInterval(seconds)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while Date() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 50) > 0 else { continue }
            let n = recv(fd, &buffer, buffer.count, 0)
            if n > 0 {
                result.append(String(decoding: buffer[0..<n], as: UTF8.self).split(separator: "\n").map(String.init))
            }
        }
        return result
    }
}

@Suite(.serialized) struct ServiceManagerTests {
    @Test func readyStatusWatchdogAndStoppingReachTheServiceManager() throws {
        let daemon = TestDaemon.live("notify")
        let notify = try NotifySocket(directory: daemon.directory)
        daemon.environment = ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"]
        try daemon.start()
        let first = notify.messages(for: 1.0)
        // READY=1 once the socket listens (start() returned only once it accepts), with figures.
        let ready = try #require(first.first { $0.contains("READY=1") })
        #expect(ready.contains { $0.hasPrefix("STATUS=") && $0.contains("last _seq 0") })
        // Pings at half the watchdog interval: about ten in a second.
        let pings = first.filter { $0.contains("WATCHDOG=1") }.count
        #expect(pings >= 5 && pings <= 15, "\(pings) pings in a second")
        kill(daemon.process!.processIdentifier, SIGTERM)
        let last = notify.messages(for: 1.0)
        #expect(last.contains { $0.contains("STOPPING=1") })
        daemon.stop()
    }

    /// The states the service manager sees, in order (watchdog pings and STATUS= updates left
    /// out): start, a reload by SIGHUP, a reload by whenctl, a refused reload, stop.
    @Test func startReloadAndStopSendTheExactSequence() throws {
        let daemon = TestDaemon.live("sequence")
        let config = daemon.directory + "/whend.conf"
        try "durability = fsync\n".write(toFile: config, atomically: true, encoding: .utf8)
        let notify = try NotifySocket(directory: daemon.directory)
        daemon.environment = ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000", "WHEND_CONFIG": config]
        try daemon.start()
        var received = notify.messages(for: 0.5)
        kill(daemon.process!.processIdentifier, SIGHUP)
        received += notify.messages(for: 0.5)
        try "durability = write\n".write(toFile: config, atomically: true, encoding: .utf8)
        #expect(try daemon.whenctl(["reload"]).status == 0)
        received += notify.messages(for: 0.3)
        try "durability = sometimes\n".write(toFile: config, atomically: true, encoding: .utf8)
        #expect(try daemon.whenctl(["reload"]).status == 1)
        received += notify.messages(for: 0.3)
        kill(daemon.process!.processIdentifier, SIGTERM)
        received += notify.messages(for: 1.0)
        #expect(daemon.stop() == 0)

        let states = received.compactMap { message in
            message.first { ["READY=1", "RELOADING=1", "STOPPING=1"].contains($0) }
        }
        #expect(
            states == [
                "READY=1", "RELOADING=1", "READY=1", "RELOADING=1", "READY=1", "RELOADING=1", "READY=1", "STOPPING=1",
            ])
        // Each RELOADING=1 carries the moment it began on CLOCK_MONOTONIC, as sd_notify asks.
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let nowMicros = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
        let reloads = received.filter { $0.contains("RELOADING=1") }
        #expect(reloads.count == 3)
        for message in reloads {
            let stamp = message.first { $0.hasPrefix("MONOTONIC_USEC=") }.flatMap { UInt64($0.dropFirst(15)) }
            #expect(stamp.map { $0 <= nowMicros && nowMicros - $0 < 10_000_000 } == true, "\(message)")
        }
        #expect(received.filter { $0.contains("WATCHDOG=1") }.count >= 5)
        #expect(daemon.log.contains("durability: fsync → write"))
        #expect(daemon.log.contains("refused") && daemon.log.contains("sometimes"))
    }

    /// The watchdog is fed by the journal writer's loop: when a write hangs (the journal's
    /// filesystem frozen), the pings stop, so that the service manager restarts a stuck whend;
    /// when the write goes through, they come back and the event is acked.
    @Test(.enabled(if: LoopFilesystem.isAvailable, "needs root, loop devices, mkfs.ext4 and fsfreeze"))
    func aStuckWriterStopsTheWatchdogPings() throws {
        let filesystem = try LoopFilesystem("frozen")
        let daemon = TestDaemon.live("watchdog", stateDirectory: filesystem.mountPoint + "/state")
        let notify = try NotifySocket(directory: daemon.directory)
        daemon.environment = ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"]
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"Before"}"#]).acks == [1])
        #expect(notify.messages(for: 0.6).filter { $0.contains("WATCHDOG=1") }.count >= 3)

        try filesystem.freeze()
        // Whatever ends the test: a whend whose write waits on a frozen file system cannot die.
        defer { filesystem.thaw() }
        let connection = try BlockingSocket(path: daemon.socketPath)
        try connection.send(helloWithAcks + "\n" + #"{"type":"screen","name":"During"}"# + "\n")
        connection.finishSending()
        _ = notify.messages(for: 0.3)  // a ping already on its way
        let whileStuck = notify.messages(for: 1.5).filter { $0.contains("WATCHDOG=1") }.count
        filesystem.thaw()
        #expect(whileStuck == 0, "\(whileStuck) pings while the writer was stuck")
        #expect(notify.messages(for: 1.0).filter { $0.contains("WATCHDOG=1") }.count >= 3)
        let acks = try connection.receivedAcks()
        #expect(acks == [1])
        #expect(daemon.stop() == 0)
        #expect(daemon.records().map { $0["name"] as? String } == ["Before", "During"])
    }

    @Test func withoutANotifySocketNothingChanges() throws {
        let daemon = TestDaemon.live("nonotify")
        daemon.environment = ["WATCHDOG_USEC": "200000"]
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#]).acks.last == 1)
        #expect(daemon.stop() == 0)
    }
}

/// Starts whend as a service manager does under socket activation: the listening socket at
/// descriptor 3, LISTEN_FDS/LISTEN_FDNAMES set, and LISTEN_PID naming whend itself.
func spawnActivated(listeningFD: Int32, socketPath: String, stateDirectory: String, log: String) throws -> pid_t {
    let script = #"LISTEN_PID=$$ exec "$0" "$@""#
    var environment = ProcessInfo.processInfo.environment
    environment["LISTEN_FDS"] = "1"
    environment["LISTEN_FDNAMES"] = "events"
    environment["LISTEN_PID"] = nil
    return try spawn(
        "/bin/sh",
        [
            "-c", script, executable("whend"), "--socket", socketPath, "--state-dir", stateDirectory,
            "--builtin-pipelines", "false",
        ], environment: environment, log: log, descriptor3: listeningFD)
}

/// Starts a program with posix_spawn, its standard error appended to `log` (and `descriptor3`,
/// if given, as its descriptor 3).
func spawn(
    _ path: String, _ arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment,
    log: String, descriptor3: Int32? = nil
) throws -> pid_t {
    let spawned = spawnProcess(path, arguments, environment: environment) { actions in
        if let descriptor3 { posix_spawn_file_actions_adddup2(&actions, descriptor3, 3) }
        posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
    }
    return try spawned.mapError { TestFailure(description: "posix_spawn \(path): \($0)") }.get()
}

/// The exit status of child `pid`, waited for at most `seconds`; past that, the test fails and
/// the child is SIGKILLed (a stop that hangs must not hold the suite).
func waitForExit(_ pid: pid_t, seconds: Double = TestDaemon.stopDeadline) -> Int32 {
    var status: Int32 = 0
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        let reaped = waitpid(pid, &status, WNOHANG)
        if reaped == pid || (reaped < 0 && errno != EINTR) { return status }
        usleep(10_000)
    }
    Issue.record("process \(pid) did not exit within \(seconds) s; killing it")
    kill(pid, SIGKILL)
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    return status
}

@Suite(.serialized) struct SocketActivationTests {
    @Test func theEventSocketFromTheServiceManagerKeepsConnectionsAcrossARestart() throws {
        let directory = scratchDirectory("activate")
        let path = directory + "/events.sock"
        let state = directory + "/state"
        // What the .socket unit does: bind and listen, and keep the socket for the whole time.
        let socketUnit = try UnixTestListener(path: path)
        let listener = socketUnit.fd

        var pid = try spawnActivated(
            listeningFD: listener, socketPath: path, stateDirectory: state, log: directory + "/log")
        var answers: [[String: Any]] = []
        let deadline = Date().addingTimeInterval(30)
        while answers.isEmpty, Date() < deadline {
            // Short: until whend takes the socket, a connection waits in the test's own backlog.
            answers = (try? exchange(path, [helloWithAcks, #"{"type":"screen","name":"First"}"#], within: 5)) ?? []
            if answers.isEmpty { usleep(50_000) }
        }
        #expect(answers.acks.last == 1)
        kill(pid, SIGTERM)
        #expect(waitForExit(pid) == 0)
        // whend is down; the socket is not. A client connects and sends now…
        let early = try BlockingSocket(path: path).bounded()
        try early.send(helloWithAcks + "\n" + #"{"type":"screen","name":"WhileDown"}"# + "\n")
        early.finishSending()
        // …and is answered by the next whend.
        pid = try spawnActivated(
            listeningFD: listener, socketPath: path, stateDirectory: state, log: directory + "/log")
        let acks = try early.receivedAcks()
        #expect(acks.last == 1)
        kill(pid, SIGTERM)
        #expect(waitForExit(pid) == 0)
        // The path is the service manager's: whend left it in place.
        #expect(FileManager.default.fileExists(atPath: path))
        let log = (try? String(contentsOfFile: directory + "/log", encoding: .utf8)) ?? ""
        #expect(log.contains("from the service manager"))
        let cat = try runCommand(executable("whenctl"), ["cat", "-o", "short", "--state-dir", state])
        #expect(cat.output.contains("screen: First") && cat.output.contains("screen: WhileDown"))
    }
}

@Suite(.serialized) struct SystemdSocketActivateTests {
    /// systemd's own activation tool: it binds both sockets, waits for the first connection,
    /// then starts whend with them (LISTEN_FDS=2, LISTEN_FDNAMES=events:control).
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-socket-activate")))
    func bothSocketsFromSystemdSocketActivate() throws {
        let directory = scratchDirectory("sd-activate")
        let events = directory + "/events.sock"
        let control = directory + "/control.sock"
        let log = directory + "/log"
        // Not Foundation's Process: systemd-socket-activate closes every descriptor it does not
        // pass on, which Process would take for the child's exit.
        let pid = try spawn(
            "/usr/bin/systemd-socket-activate",
            [
                "-l", events, "-l", control, "--fdname=events:control",
                executable("whend"), "--socket", events, "--state-dir", directory + "/state",
                "--builtin-pipelines", "false",
            ], log: log)
        var exited = false
        defer { if !exited { kill(pid, SIGKILL) } }
        // The sockets exist before whend does; the first connection starts it.
        var answers: [[String: Any]] = []
        let deadline = Date().addingTimeInterval(30)
        while answers.acks.isEmpty, Date() < deadline {
            let lines = [helloWithAcks, #"{"type":"screen","name":"Activated"}"#]
            answers = (try? exchange(events, lines, within: 5)) ?? []
            if answers.acks.isEmpty { usleep(50_000) }
        }
        #expect(answers.acks == [1])
        let status = try runCommand(executable("whenctl"), ["status", "--json", "--control", control])
        #expect(status.status == 0, "\(status.error)")
        let object = try JSONSerialization.jsonObject(with: Data(status.output.utf8)) as? [String: Any]
        // systemd-socket-activate execs whend: the pid that answers is the one it started.
        #expect(object?["pid"] as? Int == Int(pid))
        #expect((object?["journal"] as? [String: Any])?["last_seq"] as? Int == 1)
        kill(pid, SIGTERM)
        #expect(waitForExit(pid) == 0)
        exited = true
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("the event socket from the service manager"))
        #expect(text.contains("the control socket from the service manager"))
    }
}

/// whend's steps run as one service group (`DaemonServices`): started in order, stopped in the
/// reverse order, at SIGTERM and when a step cannot start.
@Suite(.serialized) struct ServiceGroupTests {
    /// The processes that hold a file open under `directory`.
    func holders(of directory: String) -> [Int32] {
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { Int32($0) }
        return pids.filter { pid in
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
            return fds.contains {
                ((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")) ?? "")
                    .hasPrefix(directory + "/")
            }
        }
    }

    /// A stop or a reload asked for while whend starts — its handlers in place (it has begun
    /// running), the journal not yet open or the sockets not yet listening — is acted on once
    /// it runs: SIGTERM and SIGINT stop it gracefully (exit 0, the segment sealed), SIGHUP
    /// reloads. They used to end it by their default action, or be lost when SIGINT was ignored
    /// at start (a background job of a script). Each signal goes as soon as `/proc` shows whend
    /// catching it; at least one round of each must land before whend listens.
    @Test(arguments: [SIGTERM, SIGINT, SIGHUP])
    func aSignalWhileWhendStartsIsActedOnOnceItRuns(signal: Int32) throws {
        var early = 0
        for round in 0..<5 {
            let directory = scratchDirectory("early-\(signal)-\(round)")
            let socket = directory + "/events.sock"
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/bin/sh")
            // As a script starts a background job: SIGINT ignored.
            p.arguments = [
                "-c", #"trap '' INT; exec "$0" "$@""#, executable("whend"), "--socket", socket, "--state-dir",
                directory + "/state", "--builtin-pipelines", "false",
            ]
            var environment = ProcessInfo.processInfo.environment
            environment["WHEND_CONFIG"] = "/dev/null"
            p.environment = environment
            let log = FileHandle(forWritingAtPath: "/dev/null")
            p.standardError = log
            try p.run()
            let pid = p.processIdentifier
            // The bit of `signal` in SigCgt: whend (not sh) catches it.
            func catching() -> Bool {
                let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
                guard status.contains("Name:\twhend"),
                    let line = status.split(separator: "\n").first(where: { $0.hasPrefix("SigCgt:") }),
                    let mask = UInt64(line.dropFirst("SigCgt:".count).trimmingCharacters(in: .whitespaces), radix: 16)
                else { return false }
                return mask & (1 << UInt64(signal - 1)) != 0
            }
            let deadline = Date().addingTimeInterval(20)
            while !catching() && p.isRunning && Date() < deadline { usleep(200) }
            if !FileManager.default.fileExists(atPath: socket) { early += 1 }
            kill(pid, signal)
            if signal == SIGHUP {
                #expect(
                    eventually { (try? BlockingSocket(path: socket)) != nil }, "whend died of a SIGHUP while starting")
                kill(pid, SIGTERM)
            }
            if !eventually(20, { !p.isRunning }) {
                Issue.record("round \(round): whend ran on after the signal")
                kill(pid, SIGKILL)
            }
            p.waitUntilExit()
            #expect(p.terminationReason == .exit && p.terminationStatus == 0, "round \(round): \(p.terminationStatus)")
            let verify = try runCommand(executable("whenctl"), ["verify", "--state-dir", directory + "/state"])
            #expect(verify.status == 0, "\(verify.output)")
        }
        #expect(early > 0, "no round reached whend before it listened")
    }

    @Test func sigtermStopsTheStepsInReverseOrder() throws {
        let daemon = TestDaemon.live("group-stop", arguments: ["--builtin-pipelines", "true", "--log-level", "info"])
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"when","name":"a"}"#]).acks.last == 1)
        #expect(daemon.stop() == 0)
        let log = daemon.log
        // Ready only once every step has started: the line comes after the pipelines'.
        let order = ["listening on", "stopping: draining", "sealed", "stopped at _seq"].map {
            log.range(of: $0)?.lowerBound
        }
        #expect(order.allSatisfy { $0 != nil }, "\(log)")
        #expect(order.compactMap { $0 } == order.compactMap { $0 }.sorted(), "\(log)")
        #expect(holders(of: daemon.stateDirectory).isEmpty, "a worker outlived whend")
    }

    /// A whend that cannot listen (another one has the socket) stops what it had started — its
    /// pipelines' workers, its journal — in order, and exits 1 saying why.
    @Test func aStepThatCannotStartStopsTheOnesBeforeIt() throws {
        let first = TestDaemon.live("group-first")
        try first.start()
        let second = TestDaemon.live("group-second")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable("whend"))
        p.arguments = [
            "--socket", first.socketPath, "--control-socket", second.directory + "/control.sock", "--state-dir",
            second.stateDirectory, "--builtin-pipelines", "true", "--log-level", "info",
        ]
        let log = Pipe()
        p.standardError = log
        p.standardOutput = log
        try p.run()
        let text = String(decoding: log.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(p.terminationStatus == 1, "\(text)")
        #expect(text.contains("another whend is already listening on \(first.socketPath)"), "\(text)")
        #expect(text.contains("stopped at _seq 0"), "the journal step was not stopped: \(text)")
        #expect(!text.contains("whend \(WhendVersion.current) listening on"), "it said it was ready: \(text)")
        #expect(holders(of: second.stateDirectory).isEmpty, "a worker of the failed whend is still running")
        first.stop()
    }
}
