import Foundation
import Testing
import WhendWire

/// The crash reports on disk, as `whenctl crashes` finds them.
/// What the otlp plugin posted, decoded by OpenTelemetry's own generated code (PyPI's
/// opentelemetry-proto) in protobuf's JSON mapping.
func decodedOTLP(_ bodies: [Data], in directory: String) throws -> [[String: Any]] {
    var files: [String] = []
    for (i, body) in bodies.enumerated() {
        let file = directory + "/otlp-\(i).binpb"
        try body.write(to: URL(fileURLWithPath: file))
        files.append(file)
    }
    let decoded = try runCommand(testPython, [repositoryRoot + "/Tests/Fixtures/otlp_decode.py"] + files)
    guard decoded.status == 0 else { throw TestFailure(description: "otlp_decode.py: \(decoded.error)") }
    return try JSONSerialization.jsonObject(with: Data(decoded.output.utf8)) as? [[String: Any]] ?? []
}

/// Every log record of decoded requests, with its resource's `service.name` and its scope.
private func logRecords(_ requests: [[String: Any]]) -> [(service: String?, scope: [String: Any], log: [String: Any])] {
    var out: [(String?, [String: Any], [String: Any])] = []
    for r in requests {
        for resource in (r["request"] as? [String: Any])?["resource_logs"] as? [[String: Any]] ?? [] {
            let attributes = (resource["resource"] as? [String: Any])?["attributes"] as? [[String: Any]] ?? []
            let service =
                (attributes.first { $0["key"] as? String == "service.name" }?["value"] as? [String: Any])?[
                    "string_value"] as? String
            for scope in resource["scope_logs"] as? [[String: Any]] ?? [] {
                for log in scope["log_records"] as? [[String: Any]] ?? [] {
                    out.append((service, scope["scope"] as? [String: Any] ?? [:], log))
                }
            }
        }
    }
    return out
}

private func attribute(_ log: [String: Any], _ key: String) -> [String: Any]? {
    (log["attributes"] as? [[String: Any]])?.first { $0["key"] as? String == key }?["value"] as? [String: Any]
}

/// Nanoseconds since 1970 of an RFC 3339 time, as protobuf's JSON mapping writes a fixed64.
private func nanosText(_ time: String) -> String? {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    guard let date = formatter.date(from: time) ?? ISO8601DateFormatter().date(from: time) else { return nil }
    // Exact from the text's digits: a Double of the date is not exact to the nanosecond.
    let fraction = time.split(separator: ".").dropFirst().first.map { String($0.prefix { $0.isNumber }) } ?? ""
    let seconds = Int64(date.timeIntervalSince1970.rounded(.down))
    let nanos = Int64((fraction + "000000000").prefix(9)) ?? 0
    return String(seconds * 1_000_000_000 + nanos)
}

@Suite(.serialized) struct OTLPExportTests {
    /// otlp exports every record of its pipeline as an OpenTelemetry log record; OpenTelemetry's
    /// own decoder reads each request without an unknown field, and each record holds what the
    /// docs/plugins.md's mapping says, field by field. A collector that answers 503 holds the pipeline's
    /// cursor (a deferred stage) and loses nothing: the same batch goes again.
    @Test func otlpLogRecordsAreWhatOpenTelemetrysOwnDecoderReadsFieldByField() throws {
        let server = try HTTPTestServer(answers: [.init(status: 503)])
        defer { server.stop() }
        let daemon = try daemonWithBuiltins(
            "builtin-otlp",
            settings: """
                pipeline.otel = otlp
                plugin.otlp = {"endpoint": "http://127.0.0.1:\(server.port)/v1/logs", "flush_interval": 0.2, "max_backoff": 0.3, "headers": {"Authorization": "Bearer t0k"}}
                """)
        defer { daemon.stop() }
        let tap =
            #"{"type":"when","name":"userTypesNewEmail","params":{"userEmail":"a@example.com","n":2,"r":1.5,"ok":true,"tags":["x",3],"none":null},"user":"u-7","ts":"2026-11-18T11:38:17.320Z"}"#
        try sendSession(
            daemon, app: "com.example.mail", session: "s-1",
            [
                navigation("root", "ChangeEmail"), tap, navigation("push", "Done"),
                #"{"type":"error","message":"boom","fatal":true}"#,
            ])
        try sendSession(daemon, app: "com.example.other", session: "s-2", [navigation("root", "Home")])

        // Refused for now: the otel pipeline holds its cursor before the first record.
        #expect(eventually(30) { server.requests.count >= 2 })
        let held = try daemon.status()["pipelines"] as? [[String: Any]]
        #expect((held?.first { $0["name"] as? String == "otel" }?["lag"] as? Int ?? 0) > 0)

        server.answer([.init(status: 200)])
        func otelLag() -> Int? {
            let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]]
            return pipelines?.first { $0["name"] as? String == "otel" }?["lag"] as? Int
        }
        #expect(eventually(30) { otelLag() == 0 })
        daemon.stop()
        let records = daemon.records()
        let bodies = server.requests
        let all = try decodedOTLP(bodies, in: daemon.directory)
        #expect(all.allSatisfy { $0["unknown_fields"] as? Int == 0 && $0["reencoded_equal"] as? Bool == true })
        #expect(server.requestHeads.allSatisfy { $0.contains("\r\nContent-Type: application/x-protobuf") })
        #expect(server.requestHeads.allSatisfy { $0.contains("\r\nAuthorization: Bearer t0k") })
        #expect(server.requestHeads.allSatisfy { $0.hasPrefix("POST /v1/logs ") })

        // Every stored record once among the accepted requests (the retried one is the same).
        let refusedCount = bodies.prefix { $0 == bodies.first }.count - 1
        #expect(refusedCount >= 1, "the batch refused is sent again as it was")
        let accepted = logRecords(Array(all.dropFirst(max(0, refusedCount))))
        let seqs = accepted.compactMap { (attribute($0.log, "whend.seq")?["int_value"] as? String).flatMap(Int.init) }
        #expect(seqs.sorted() == records.compactMap { $0["_seq"] as? Int }, "each record once")
        #expect(seqs.count == Set(seqs).count)

        func exported(_ record: [String: Any]) -> (service: String?, scope: [String: Any], log: [String: Any])? {
            accepted.first {
                attribute($0.log, "whend.seq")?["int_value"] as? String == "\(record["_seq"] as? Int ?? -1)"
            }
        }
        for record in records {
            guard let e = exported(record) else { continue }
            #expect(e.service == record["app"] as? String)
            #expect(e.scope["name"] as? String == "whend")
            #expect(e.log["observed_time_unix_nano"] as? String == nanosText(record["_rt"] as? String ?? ""))
            #expect(attribute(e.log, "whend.rt")?["string_value"] as? String == record["_rt"] as? String)
            #expect(attribute(e.log, "session.id")?["string_value"] as? String == record["session"] as? String)
            // The body: the app's members, in the stored order, none of whend's.
            let body = (e.log["body"] as? [String: Any])?["kvlist_value"] as? [String: Any]
            let keys = (body?["values"] as? [[String: Any]])?.compactMap { $0["key"] as? String }
            #expect(keys?.contains { $0.hasPrefix("_") } == false)
            #expect(Set(keys ?? []) == Set(record.keys.filter { !$0.hasPrefix("_") }))
        }

        let when = try #require(records.first { $0["name"] as? String == "userTypesNewEmail" }.flatMap(exported))
        #expect(when.log["event_name"] as? String == "whend.when.userTypesNewEmail")
        #expect(when.log["time_unix_nano"] as? String == "1795001897320000000")
        #expect(when.log["severity_number"] as? String == "SEVERITY_NUMBER_INFO")
        #expect(when.log["severity_text"] as? String == "INFO")
        #expect(attribute(when.log, "user.id")?["string_value"] as? String == "u-7")
        let members =
            ((when.log["body"] as? [String: Any])?["kvlist_value"] as? [String: Any])?["values"] as? [[String: Any]]
        let params = (members?.first { $0["key"] as? String == "params" }?["value"] as? [String: Any])?["kvlist_value"]
        let values = (params as? [String: Any])?["values"] as? [[String: Any]] ?? []
        func param(_ key: String) -> [String: Any]? {
            values.first { $0["key"] as? String == key }?["value"] as? [String: Any]
        }
        #expect(values.compactMap { $0["key"] as? String } == ["userEmail", "n", "r", "ok", "tags", "none"])
        #expect(param("userEmail")?["string_value"] as? String == "a@example.com")
        #expect(param("n")?["int_value"] as? String == "2")
        #expect(param("r")?["double_value"] as? Double == 1.5)
        #expect(param("ok")?["bool_value"] as? Bool == true)
        let tags = (param("tags")?["array_value"] as? [String: Any])?["values"] as? [[String: Any]]
        #expect(tags?.first?["string_value"] as? String == "x")
        #expect(tags?.last?["int_value"] as? String == "3")
        #expect(param("none")?.isEmpty == true, "null: an AnyValue with no value")

        let lifecycleLess = try #require(records.first { $0["action"] as? String == "push" }.flatMap(exported))
        #expect(lifecycleLess.log["event_name"] as? String == "whend.navigation")
        #expect(attribute(lifecycleLess.log, "app.screen.name")?["string_value"] as? String == "Done")

        // Time on screen, derived by screen-tracking, as its own log record.
        let time = try #require(records.first { $0["type"] as? String == "screen_time" }.flatMap(exported))
        #expect(time.log["event_name"] as? String == "whend.screen_time")
        #expect(attribute(time.log, "app.screen.name")?["string_value"] as? String == "ChangeEmail")
        #expect(attribute(time.log, "whend.screen_time.seconds")?["double_value"] is Double)
        #expect(attribute(time.log, "whend.origin")?["string_value"] as? String == "screen-tracking")
        #expect(attribute(time.log, "whend.cause")?["int_value"] != nil)

        let crash = try #require(records.first { $0["type"] as? String == "error" }.flatMap(exported))
        #expect(crash.log["severity_number"] as? String == "SEVERITY_NUMBER_FATAL")
        #expect(crash.log["event_name"] as? String == "whend.error")
        #expect(Set(accepted.compactMap(\.service)) == ["com.example.mail", "com.example.other"])
    }

    /// A collector that takes a request but rejects some of its records says so in its answer
    /// (an ExportLogsServiceResponse with partial_success): otlp logs it with the collector's
    /// message, and goes on.
    @Test func otlpReportsWhatTheCollectorRejectedInAnAcceptedRequest() throws {
        // partial_success (1) { rejected_log_records (1) = 2, error_message (2) = message }: a
        // message with a line that would read as whend's own, and a terminal escape.
        let message = Array("too old\ncritical whend: FORGED\u{1B}[2J".utf8)
        let inner: [UInt8] = [0x08, 0x02, 0x12, UInt8(message.count)] + message
        let partialSuccess: [UInt8] = [0x0A, UInt8(inner.count)] + inner
        let server = try HTTPTestServer(answers: [.init(status: 200, body: partialSuccess)])
        defer { server.stop() }
        let daemon = try daemonWithBuiltins(
            "builtin-otlp-partial",  // live: the exporter's log is on whend's standard error
            settings: """
                pipeline.otel = otlp
                plugin.otlp = {"endpoint": "http://127.0.0.1:\(server.port)/v1/logs", "flush_interval": 0.2, "types": ["when"]}
                """, .live)
        defer { daemon.stop() }
        try sendSession(daemon, app: "com.example.mail", session: "p", [#"{"type":"when","name":"tapped"}"#])
        #expect(
            daemon.waitForLog(
                #"otlp: the collector rejected 2 log records: too old\ncritical whend: FORGED\u{1b}[2J"#, seconds: 20),
            "\(daemon.log.suffix(1000))")
        #expect(!daemon.log.contains("\ncritical whend: FORGED"), "a line of the collector's in whend's log")
        #expect(!daemon.log.contains("\u{1B}"))
        #expect(server.requests.count == 1, "accepted: not sent again")
    }
}
