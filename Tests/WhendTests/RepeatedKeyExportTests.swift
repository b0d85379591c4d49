import Foundation
import Testing

/// A `when` event whose params give a key twice (once as `\u006b`, the same key to any JSON
/// reader), in nested objects too, and whose own members give an app key twice: whend stores it
/// as sent, and its readers take the first. What leaves whend says the same to readers it did
/// not write: Python's `json` (which takes the last of a repeated key) reading analytics' events
/// and a crash report's breadcrumbs, and OpenTelemetry's own decoder reading otlp's request, in
/// which each key of a list is given once. Before, Python read the last values, and the OTLP
/// lists held each repeated key twice.
@Suite(.serialized) struct RepeatedKeyExportTests {
    static let tapped =
        #"{"type":"when","name":"tapped","extra":"first","extra":"second","params":{"k":1,"k":2,"\u006b":3,"o":{"x":"first","y":0,"x":"second"},"a":[{"y":1,"y":2},{"k":[1],"k":[2]}]}}"#

    /// Keys that are not repeats (two spellings Unicode takes for "Å"), and lone surrogates,
    /// which analytics and otlp write as U+FFFD: to their readers, one key, given three times.
    static let distinct =
        #"{"type":"when","name":"distinct","params":{"\u00c5":1,"\u212b":2,"s":{"\ud800":"a","\udc00":"b","\ufffd":"c"}}}"#

    /// What a reader that takes the first of each key reads of the params.
    static var firstParams: NSDictionary { ["k": 1, "o": ["x": "first", "y": 0], "a": [["y": 1], ["k": [1]]]] }

    @Test func everyExportCarriesTheFirstOfARepeatedKey() throws {
        let collector = try HTTPTestServer(answers: [.init(status: 200)])
        defer { collector.stop() }
        let daemon = try daemonWithBuiltins(
            "repeated-keys",
            settings: """
                pipeline.otel = otlp
                plugin.otlp = {"endpoint": "http://127.0.0.1:\(collector.port)/v1/logs", "flush_interval": 0.2}
                """)
        defer { daemon.stop() }
        try sendSession(
            daemon, app: "com.example.keys", session: "r-1",
            [Self.tapped, Self.distinct, #"{"type":"error","message":"boom","fatal":true}"#])
        let analyticsFile = daemon.stateDirectory + "/plugins/analytics/events.ndjson"
        let reports = daemon.stateDirectory + "/plugins/crash-reports/reports"
        func caughtUp() -> Bool {
            let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]] ?? []
            return pipelines.count == 5 && pipelines.allSatisfy { $0["lag"] as? Int == 0 }
        }
        #expect(eventually(30) { caughtUp() }, "\((try? daemon.status())?["pipelines"] ?? "no status")")
        #expect(daemon.stop() == 0)

        // Python's json takes the last of a repeated key: it must find none to take.
        let read = try runCommand(
            testPython,
            [
                "-c",
                """
                import glob, json, sys
                events = [e for line in open(sys.argv[1]) for e in json.loads(line)["batch"]]
                print(json.dumps([e["properties"] for e in events if e.get("event") == "tapped"]))
                distinct = [e["properties"] for e in events if e.get("event") == "distinct"][0]
                print(json.dumps({"keys": [[ord(c) for c in k] for k in distinct], "s": distinct["s"]}))
                report = json.load(open(glob.glob(sys.argv[2] + "/*-error.json")[0]))
                print(json.dumps([c["params"] for c in report["breadcrumbs"] if c.get("name") == "tapped"]))
                """, analyticsFile, reports,
            ])
        #expect(read.status == 0, "\(read.error)")
        let lines = read.output.split(separator: "\n").map {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [NSDictionary]
        }
        #expect(lines.first??.first == Self.firstParams, "analytics' properties: \(read.output)")
        #expect(lines.last??.first == Self.firstParams, "the crash report's breadcrumb: \(read.output)")
        let distinct = read.output.split(separator: "\n").dropFirst().first.flatMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(distinct?["keys"] as? [[Int]] == [[0xC5], [0x212B], [0x73]], "\(read.output)")
        #expect(distinct?["s"] as? [String: String] == ["\u{FFFD}": "a"], "\(read.output)")

        // OpenTelemetry's decoder: each key of each list once, with the first value.
        let requests = try decodedOTLP(collector.requests, in: daemon.directory)
        #expect("\(requests)".contains("tapped"), "no log record of the event")
        var lists: [[[String: Any]]] = []
        func collect(_ value: Any) {
            if let o = value as? [String: Any] {
                if let list = (o["kvlist_value"] as? [String: Any])?["values"] as? [[String: Any]] {
                    lists.append(list)
                }
                o.values.forEach(collect)
            } else if let a = value as? [Any] {
                a.forEach(collect)
            }
        }
        collect(requests)
        #expect(lists.count >= 5, "the body, params, o and a's two objects: \(lists.count) lists")
        // Keys by their code points: Swift's `String` takes the two "Å" for one.
        func scalars(_ key: Any?) -> [UInt32] { (key as? String)?.unicodeScalars.map(\.value) ?? [] }
        for list in lists {
            let keys = list.map { scalars($0["key"]) }
            #expect(keys.count == Set(keys).count, "a key twice in one list: \(keys)")
        }
        let values = lists.flatMap { $0 }
        func value(_ key: String) -> [[String: Any]] {
            values.filter { scalars($0["key"]) == scalars(key) }.compactMap { $0["value"] as? [String: Any] }
        }
        #expect(value("\u{C5}").compactMap { $0["int_value"] as? String } == ["1"])
        #expect(value("\u{212B}").compactMap { $0["int_value"] as? String } == ["2"])
        #expect(value("\u{FFFD}").compactMap { $0["string_value"] as? String } == ["a"])
        #expect(value("extra").compactMap { $0["string_value"] as? String } == ["first"])
        #expect(value("x").compactMap { $0["string_value"] as? String } == ["first"])
        #expect(value("y").compactMap { $0["int_value"] as? String } == ["0", "1"])
        let ks = value("k")
        #expect(ks.first?["int_value"] as? String == "1" && ks.count == 2, "params' k and a[1]'s: \(ks)")
    }
}
