import Foundation
import Testing
import WhendWire

@testable import WhendDaemon

/// A subscriber from `oldest` running as nobody in the group `users` (gid 100), writing
/// what it receives to the pipe, pausing `pause` seconds after each read, until whend closes.
func memberSubscriber(_ daemon: TestDaemon, pause: Double) throws -> (Process, Pipe) {
    let client = """
        import socket, sys, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sys.argv[1])
        s.sendall(b'{"subscribe":{"from":"oldest"}}\\n')
        while True:
            chunk = s.recv(16384)
            if not chunk: break
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            time.sleep(float(sys.argv[2]))
        """
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
    p.arguments = [
        "--reuid=65534", "--regid=100", "--clear-groups", "/usr/bin/python3", "-c", client, daemon.socketPath,
        String(pause),
    ]
    let out = Pipe()
    p.standardOutput = out
    try p.run()
    return (p, out)
}

/// Who may subscribe: whend's user, root, and members of `subscribe_group`, as the kernel
/// tells the peer's user and groups — tried from processes of other users (setpriv).
@Suite struct SubscriberAccessTests {
    /// The first line whend answers a subscription from a process of `uid`, primary group
    /// `gid` and supplementary `groups`.
    func firstAnswer(_ daemon: TestDaemon, uid: Int, gid: Int, groups: [Int]) throws -> String {
        let client = """
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            s.sendall(b'{"subscribe":{"from":"oldest"}}\\n')
            data = b''
            while b'\\n' not in data:
                chunk = s.recv(4096)
                if not chunk: break
                data += chunk
            print(data.split(b'\\n')[0].decode())
            """
        let groupFlag = groups.isEmpty ? "--clear-groups" : "--groups=" + groups.map(String.init).joined(separator: ",")
        let result = try runCommand(
            "/usr/bin/setpriv",
            ["--reuid=\(uid)", "--regid=\(gid)", groupFlag, "/usr/bin/python3", "-c", client, daemon.socketPath])
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A reload that takes a subscriber's group out of `subscribe_group` ends its open
    /// subscription with `forbidden` within about a second: access is not kept for as long as
    /// the connection lasts.
    @Test func aReloadThatRemovesTheGroupEndsItsOpenSubscriptions() throws {
        let file = scratchDirectory("subscribe-revoke-conf") + "/whend.conf"
        try "subscribe_group = users\n".write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = TestDaemon("subscribe-revoke", arguments: ["--config", file])
        try daemon.start()
        defer { daemon.stop() }
        chmod(daemon.directory, 0o755)
        let (p, out) = try memberSubscriber(daemon, pause: 0)
        defer { if p.isRunning { p.terminate() } }
        try sendSession(daemon, app: "a", session: "s", [#"{"type":"when","name":"n"}"#])
        usleep(500_000)
        #expect(p.isRunning, "the member's subscription is open")
        try "subscribe_group = \n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try daemon.whenctl(["reload"]).status == 0)
        #expect(eventually(5) { !p.isRunning }, "the subscription ended after the reload")
        if p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        let lines = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            .split(separator: "\n")
        #expect(lines.first?.contains(#""subscribed""#) == true, "\(lines)")
        #expect(lines.contains { $0.contains(#""name":"n""#) })
        #expect(lines.last?.contains(#""code":"forbidden""#) == true, "\(lines)")
        #expect(lines.last?.contains("subscribe_group is now unset") == true, "\(lines)")
    }

    @Test func onlyWhendsUserRootAndTheGroupMaySubscribe() throws {
        // The sockets' directory must let other users reach the socket.
        let closed = TestDaemon("subscribe-access")
        try closed.start()
        defer { closed.stop() }
        chmod(closed.directory, 0o755)
        let nobody = try firstAnswer(closed, uid: 65534, gid: 65534, groups: [])
        #expect(nobody.contains(#""code":"forbidden""#), "\(nobody)")
        #expect(nobody.contains("subscribe_group is not set"))

        let open = TestDaemon("subscribe-group", arguments: ["--subscribe-group", "users"])
        try open.start()
        defer { open.stop() }
        chmod(open.directory, 0o755)
        let users = 100
        // In the group as its primary group, or among its supplementary groups (SO_PEERGROUPS).
        #expect(try firstAnswer(open, uid: 65534, gid: users, groups: []).contains(#""subscribed""#))
        #expect(try firstAnswer(open, uid: 65534, gid: 65534, groups: [65534, users]).contains(#""subscribed""#))
        // Not in it.
        let outsider = try firstAnswer(open, uid: 65534, gid: 65534, groups: [65534])
        #expect(outsider.contains(#""code":"forbidden""#), "\(outsider)")
    }
}
