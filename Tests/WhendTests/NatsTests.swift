import Foundation
import Testing
import WhenClient

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

private let natsServer = "/usr/sbin/nats-server"

/// A real nats-server with JetStream, one node of a cluster or alone, on loopback ports.
private final class NatsNode: @unchecked Sendable {
    let name: String
    let port: Int
    let monitorPort: Int
    let configPath: String
    private var pid: pid_t = 0

    init(name: String, directory: String, port: Int, clusterPort: Int?, routes: [Int]) throws {
        self.name = name
        self.port = port
        monitorPort = port + 1000
        configPath = directory + "/\(name).conf"
        var config = """
            server_name: \(name)
            listen: 127.0.0.1:\(port)
            http: 127.0.0.1:\(monitorPort)
            jetstream { store_dir: "\(directory)/\(name)-store" }

            """
        if let clusterPort {
            config += """
                cluster {
                  name: whend-test
                  listen: 127.0.0.1:\(clusterPort)
                  routes: [\(routes.map { "nats-route://127.0.0.1:\($0)" }.joined(separator: ", "))]
                }

                """
        }
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    func start() throws {
        pid = try spawn(natsServer, ["-c", configPath], log: configPath + ".log")
    }

    func kill() {
        Glibc.kill(pid, SIGKILL)
        _ = waitForExit(pid)
    }

    deinit {
        Glibc.kill(pid, SIGKILL)
    }

    /// The stream's state as this node's monitoring endpoint reports it.
    func stream(_ stream: String) -> (messages: Int, lastSeq: Int)? {
        guard let url = URL(string: "http://127.0.0.1:\(monitorPort)/jsz?streams=true") else { return nil }
        let body = Box()
        let done = DispatchSemaphore(value: 0)
        URLSession.shared.dataTask(with: url) { data, _, _ in
            body.data = data
            done.signal()
        }.resume()
        _ = done.wait(timeout: .now() + 5)
        guard let data = body.data, let json = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            return nil
        }
        for account in json["account_details"] as? [[String: Any]] ?? [] {
            for s in account["stream_detail"] as? [[String: Any]] ?? [] where s["name"] as? String == stream {
                let state = s["state"] as? [String: Any] ?? [:]
                return (state["messages"] as? Int ?? -1, state["last_seq"] as? Int ?? -1)
            }
        }
        return nil
    }

    final class Box: @unchecked Sendable { var data: Data? }
}

@Suite(.serialized, .enabled(if: FileManager.default.isExecutableFile(atPath: natsServer), "needs nats-server"))
struct NatsTests {
    @Test func aSingleNode() throws { try forward(nodes: 1) }
    @Test func aThreeNodeCluster() throws { try forward(nodes: 3) }

    /// Each field of the subject template is one token whatever its value: every dot, space,
    /// wildcard or control byte becomes `_`, byte by byte (a dot followed by a combining mark
    /// too), and a missing field is `none`. The stream takes only the exact subjects expected,
    /// so a record published on any other is never stored.
    @Test func subjectTokensAreMadeSafeByteByByte() throws {
        let directory = scratchDirectory("nats-subjects")
        let port = Int.random(in: 41_000...45_000)
        let node = try NatsNode(name: "s1", directory: directory, port: port, clusterPort: nil, routes: [])
        try node.start()
        defer { node.kill() }
        let expected = [
            "whend.h.com_example_my_app_v_.when.none", "whend.h.a_\u{301}b.when.none", "whend.h.rig.screen.Home_Detail",
        ]
        let config = directory + "/whend.conf"
        try """
        pipeline.forward = nats
        plugin.nats = {"url": "nats://127.0.0.1:\(port)", "host": "h", "subject": "whend.{host}.{app}.{type}.{screen}", "stream": "SUBJECTS", "create_stream": true, "subjects": [\(expected.map { "\"\($0)\"" }.joined(separator: ", "))], "ack_timeout": 1, "max_backoff": 0.2}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live("nats-subjects", arguments: ["--config", config, "--durability", "write"])
        try daemon.start()
        defer { daemon.stop() }
        for (app, body) in [
            ("com.example my*app>v\t", #"{"type":"when","name":"a"}"#), ("a.\u{301}b", #"{"type":"when","name":"b"}"#),
            ("rig", #"{"type":"screen","name":"c","screen":"Home.Detail"}"#),
        ] {
            var configuration = WhenClient.Configuration(app: app, session: "s", socketPath: daemon.socketPath)
            configuration.maxBackoff = 0.2
            let client = WhenClient(configuration)
            _ = client.emit(try JSONSerialization.jsonObject(with: Data(body.utf8)) as! [String: Any])
            #expect(client.flush(timeout: 10))
        }
        let deadline = Date().addingTimeInterval(30)
        while (node.stream("SUBJECTS")?.messages ?? 0) < expected.count && Date() < deadline { usleep(100_000) }
        #expect(node.stream("SUBJECTS")?.messages == expected.count)
    }

    /// 100,000 records through whend into JetStream; whend and one NATS node SIGKILLed midway
    /// and restarted; the stream must hold exactly 100,000 messages, none twice.
    private func forward(nodes count: Int) throws {
        let directory = scratchDirectory("nats-\(count)")
        let base = Int.random(in: 20_000...40_000)
        let clusterPorts = (0..<count).map { base + 500 + $0 }
        let nodes = try (0..<count).map { i in
            try NatsNode(
                name: "n\(i + 1)", directory: directory, port: base + i, clusterPort: count > 1 ? clusterPorts[i] : nil,
                routes: clusterPorts)
        }
        for node in nodes { try node.start() }
        let servers = nodes.map { "\"nats://127.0.0.1:\($0.port)\"" }.joined(separator: ", ")
        let config = directory + "/whend.conf"
        try """
        pipeline.forward = nats
        plugin.nats = {"servers": [\(servers)], "stream": "WHEND", "create_stream": true, "replicas": \(count), "max_in_flight": 2000, "ack_timeout": 2}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live("nats-d\(count)", arguments: ["--config", config, "--durability", "write"])
        try daemon.start()

        var configuration = WhenClient.Configuration(
            app: "rig", session: "nats-\(count)", socketPath: daemon.socketPath)
        configuration.queueCapacity = 200_000
        configuration.maxBackoff = 0.2
        let client = WhenClient(configuration)
        let total = 100_000
        for i in 0..<total { client.emit(["type": "when", "name": "step", "params": ["n": i]]) }

        // Midway: the daemon and one NATS node die together, as soon as a tenth is forwarded
        // (polled often and read once: a whole forwarding can take under a second).
        let victim = nodes[count - 1]
        let deadline = Date().addingTimeInterval(60)
        var before = 0
        while before < total / 10 && Date() < deadline {
            usleep(5_000)
            before = nodes[0].stream("WHEND")?.messages ?? 0
        }
        #expect(before > 0 && before < total, "midway: \(before) messages in the stream")
        daemon.crash()
        victim.kill()
        usleep(500_000)
        try victim.start()
        try daemon.start()

        #expect(client.flush(timeout: 120))
        let forwarded = Date().addingTimeInterval(120)
        while (nodes[0].stream("WHEND")?.messages ?? 0) < total && Date() < forwarded { usleep(100_000) }
        usleep(1_000_000)  // anything sent twice would show now
        let state = nodes[0].stream("WHEND")
        #expect(state?.messages == total, "\(String(describing: state))")
        #expect(state?.lastSeq == total, "a message stored twice would take a sequence number")
        if count > 1 {
            // The node that was killed catches up too: nats-server's own replication, not
            // whend's, and slower while the rest of the suite runs beside it (99,959 of 100,000
            // after two minutes once, in CI, while the leader held all 100,000). What whend
            // promises is the stream as the cluster holds it, checked above; a replica that is
            // late is reported, never more than the total.
            let caughtUp = Date().addingTimeInterval(120)
            while (victim.stream("WHEND")?.messages ?? 0) < total && Date() < caughtUp { usleep(100_000) }
            let replica = victim.stream("WHEND")
            #expect((replica?.messages ?? 0) <= total && (replica?.lastSeq ?? 0) <= total)
            withKnownIssue("nats-server's catch-up of a restarted node can outlast two minutes", isIntermittent: true) {
                #expect(replica?.messages == total)
            }
        }
        daemon.stop()
        #expect(daemon.records().count == total)
        for node in nodes { node.kill() }
    }
}
