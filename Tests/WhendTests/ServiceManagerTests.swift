import Foundation
import Testing
import WhendWire

/// A stand-in for the service manager's notification socket: a Unix datagram socket.
final class NotifySocket {
    let path: String
    let fd: Int32

    init(directory: String) throws {
        path = directory + "/notify.sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
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
        let daemon = DaemonProcess("notify")
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

    @Test func withoutANotifySocketNothingChanges() throws {
        let daemon = DaemonProcess("nonotify")
        daemon.environment = ["WATCHDOG_USEC": "200000"]
        try daemon.start()
        #expect(try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"A"}"#]).acks.last == 1)
        #expect(daemon.stop() == 0)
    }
}
