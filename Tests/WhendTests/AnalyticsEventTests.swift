import Foundation
import SeededRandom
import Testing
import WhendJournal
import WhendWire

/// analytics' Segment events carry what the app sent, decoded: for any string an app may send
/// as its app, session, user, id, screen or names (escaped or not, quotes, backslashes, control
/// characters, non-ASCII, pairs and lone halves of surrogates, ids long enough to be digested),
/// each event read by a strict JSON reader holds exactly those strings where Segment's shape
/// puts them, a lone half of a surrogate as U+FFFD whether the event decodes the string or
/// copies it as stored. The events are built straight as bytes; this is the promise that
/// copying keeps.
@Suite struct AnalyticsEventTests {
    /// A piece of text as the app means it and as its JSON spells it.
    private static let pieces: [(text: String, json: String)] = [
        ("a", "a"), ("Zz9", "Zz9"), (":", ":"), (" ", " "), ("-", "-"), ("\"", #"\""#), ("\\", #"\\"#),
        ("\n", #"\n"#), ("\u{1}", #"\u0001"#), ("\u{1F}", #"\u001f"#), ("/", #"\/"#), ("A", #"\u0041"#),
        ("é", "é"), ("é", #"\u00e9"#), ("日本", "日本"), ("😀", "😀"), ("😀", #"\ud83d\ude00"#),
        ("\u{FFFD}", #"\ud800"#), ("\u{7F}", "\u{7F}"), ("~", "~"),
        // Lone halves that no neighbour can pair, and a backslash before "ud800" (no escape).
        ("-\u{FFFD}", #"-\udc00"#), ("\u{FFFD}-", #"\uDBFF-"#), ("\\ud800", #"\\ud800"#),
    ]

    /// A string of 1 to `most` pieces whose JSON spelling stays within `bytes`.
    private static func text(_ random: inout SplitMix64, most: Int, bytes: Int = 120) -> (text: String, json: String) {
        var text = ""
        var json = ""
        for _ in 0..<(1 + random.int(most)) {
            let piece = pieces[random.int(pieces.count)]
            guard json.utf8.count + piece.json.utf8.count <= bytes, text.utf8.count + piece.text.utf8.count <= bytes
            else { break }
            text += piece.text
            json += piece.json
        }
        if text.isEmpty { return ("a", "a") }
        return (text, json)
    }

    private struct Sent {
        var isWhen: Bool
        var app: String
        var session: String
        var user: String?
        var id: String?
        var name: String
        var screen: String?
        var previous: String?
        var params: String?
        var line: String
    }

    private static func generate(seed: UInt64, count: Int) -> [Sent] {
        var random = SplitMix64(state: seed)
        var sent: [Sent] = []
        for _ in 0..<count {
            let app = text(&random, most: 6)
            let session = text(&random, most: 6)
            let user = random.int(3) == 0 ? text(&random, most: 4) : nil
            // Some ids long enough that `whend-<seq>-<id>` reaches Segment's 100 characters.
            let id: (text: String, json: String)?
            switch random.int(4) {
            case 0: id = nil
            case 1:
                let long = String(repeating: "x", count: 80 + random.int(48))
                id = (long, long)
            default: id = text(&random, most: 30)
            }
            let isWhen = random.int(2) == 0
            var fields = [
                #""app":"\#(app.json)""#, #""session":"\#(session.json)""#,
            ]
            if let user { fields.append(#""user":"\#(user.json)""#) }
            if let id { fields.append(#""id":"\#(id.json)""#) }
            let name: String
            var screen: (text: String, json: String)?
            var previous: (text: String, json: String)?
            var params: String?
            if isWhen {
                name = "userDoes" + String(random.int(1000))
                screen = random.int(2) == 0 ? text(&random, most: 5) : nil
                let param = text(&random, most: 6)
                params = param.text
                fields = [#""type":"when""#, #""name":"\#(name)""#, #""params":{"k":"\#(param.json)"}"#] + fields
                if let screen { fields.append(#""screen":"\#(screen.json)""#) }
            } else {
                let shown = text(&random, most: 6)
                name = shown.text
                previous = random.int(2) == 0 ? text(&random, most: 5) : nil
                fields = [#""type":"screen""#, #""name":"\#(shown.json)""#] + fields
                if let previous { fields.append(#""previous":"\#(previous.json)""#) }
            }
            sent.append(
                Sent(
                    isWhen: isWhen, app: app.text, session: session.text, user: user?.text, id: id?.text,
                    name: name, screen: screen?.text, previous: previous?.text, params: params,
                    line: "{" + fields.joined(separator: ",") + "}"))
        }
        return sent
    }

    private static func messageID(seq: UInt64, id: String) -> String {
        let plain = "whend-\(seq)-" + id
        guard plain.utf8.count >= 100 else { return plain }
        var hash = SipHash128()
        hash.write(Array(id.utf8))
        let (a, b) = hash.finalize()
        return "whend-\(seq)-" + String(a, radix: 16) + String(b, radix: 16)
    }

    @Test(arguments: [1, 2, 3] as [UInt64])
    func everyEventCarriesTheStringsTheAppSentDecoded(seed: UInt64) throws {
        let sent = Self.generate(seed: seed, count: 437)
        let daemon = TestDaemon("analytics-strings-\(seed)")
        try daemon.start()
        let answers = try exchange(daemon.socketPath, [#"{"hello":{"protocol":1,"acks":true}}"#] + sent.map(\.line))
        #expect(answers.errors.isEmpty, "refused: \(answers.errors.prefix(3))")
        #expect(answers.acks.last == sent.count)
        _ = daemon.stop()

        var seqs: [UInt64] = []
        JournalReader(directory: daemon.journal).read { record, _ in
            if let seq = record.seq { seqs.append(seq) }
            return true
        } onProblem: {
            Issue.record("journal problem: \($0)")
        }
        try #require(seqs.count == sent.count, "\(seqs.count) records stored of \(sent.count)")

        let out = scratchDirectory("analytics-strings-out-\(seed)")
        let replay = try whenctl([
            "replay", "--journal", daemon.stateDirectory + "/journal", "--plugin", executable("libanalytics.so"),
            "--plugin-config", #"{"screens_from":"app"}"#, "--state-out", out,
        ])
        try #require(replay.status == 0, "\(replay.error)")
        let file = FileManager.default.contents(atPath: out + "/analytics/events.ndjson") ?? Data()
        let events = file.split(separator: 0x0A).flatMap { line -> [[String: Any]] in
            let batch = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any]
            return batch?["batch"] as? [[String: Any]] ?? []
        }
        try #require(events.count == sent.count, "\(events.count) events for \(sent.count) records")

        var wrong: [String] = []
        for (i, (event, s)) in zip(events, sent).enumerated() {
            func check(_ what: String, _ got: Any?, _ expected: String?) {
                let value = got as? String
                if value != expected || (expected == nil && got != nil && !(got is NSNull)) {
                    wrong.append("event \(i) \(what): \(String(describing: got)) ≠ \(String(describing: expected))")
                }
            }
            let context = event["context"] as? [String: Any] ?? [:]
            check("type", event["type"], s.isWhen ? "track" : "screen")
            check("anonymousId", event["anonymousId"], s.user == nil ? s.app + ":" + s.session : nil)
            check("userId", event["userId"], s.user)
            check("context.app.name", (context["app"] as? [String: Any])?["name"], s.app)
            check("context.session", context["session"], s.session)
            check("context.screen", context["screen"], s.isWhen ? s.screen : nil)
            check("messageId", event["messageId"], Self.messageID(seq: seqs[i], id: s.id ?? s.app + ":" + s.session))
            check(s.isWhen ? "event" : "name", event[s.isWhen ? "event" : "name"], s.name)
            let properties = event["properties"] as? [String: Any]
            if s.isWhen {
                check("properties.k", properties?["k"], s.params)
            } else {
                check("properties.previous", properties?["previous"], s.previous)
            }
        }
        #expect(wrong.isEmpty, "\(wrong.count) fields wrong: \(wrong.prefix(5))")
    }

    /// An app filter selects the app ids spelled exactly as configured: spellings Unicode takes
    /// for the same text ("é" and "e" with a combining accent, the Ångström sign and "Å") are
    /// different apps, and excluding one leaves the others.
    @Test func appFiltersMatchTheBytesOfAnAppNotWhatItLooksLike() throws {
        let spellings = ["\u{E9}", "e\u{301}", "\u{C5}", "\u{212B}", "A\u{30A}"]
        var random = SplitMix64(state: 7)
        let apps = (0..<200).map { _ in spellings[random.int(spellings.count)] }
        let daemon = TestDaemon("analytics-filter")
        try daemon.start()
        let lines = apps.map { #"{"type":"when","name":"tap","app":"\#($0)","session":"s"}"# }
        let answers = try exchange(daemon.socketPath, [#"{"hello":{"protocol":1,"acks":true}}"#] + lines)
        #expect(answers.errors.isEmpty && answers.acks.last == apps.count)
        _ = daemon.stop()

        func replayedApps(_ configuration: String) throws -> [[UInt8]] {
            let out = scratchDirectory("analytics-filter-out")
            let replay = try whenctl([
                "replay", "--journal", daemon.stateDirectory + "/journal", "--plugin",
                executable("libanalytics.so"), "--plugin-config", configuration, "--state-out", out,
            ])
            try #require(replay.status == 0, "\(replay.error)")
            let file = FileManager.default.contents(atPath: out + "/analytics/events.ndjson") ?? Data()
            return file.split(separator: 0x0A).flatMap { line -> [[UInt8]] in
                let batch = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any]
                return (batch?["batch"] as? [[String: Any]] ?? []).map {
                    let context = $0["context"] as? [String: Any]
                    return Array(((context?["app"] as? [String: Any])?["name"] as? String ?? "").utf8)
                }
            }
        }
        for chosen in spellings {
            let bytes = Array(chosen.utf8)
            let included = try replayedApps(#"{"include_apps":["\#(chosen)"]}"#)
            #expect(included.count == apps.filter { Array($0.utf8) == bytes }.count, "include \(bytes)")
            #expect(included.allSatisfy { $0 == bytes }, "include \(bytes)")
            let excluded = try replayedApps(#"{"exclude_apps":["\#(chosen)"]}"#)
            #expect(excluded.count == apps.filter { Array($0.utf8) != bytes }.count, "exclude \(bytes)")
            #expect(!excluded.contains(bytes), "exclude \(bytes)")
        }
    }

    /// With only a file, the pipeline writes the batches itself: whatever `batch_events` and
    /// `batch_max_bytes` say and whatever the events' sizes, each line is one batch within those
    /// bounds (its events and separators at most the bytes less 64), and the lines together hold
    /// every event once, in the journal's order, but an event no batch can hold: that one is
    /// left out as oversized, however high `event_max_bytes`.
    @Test(arguments: [11, 12, 13] as [UInt64])
    func fileBatchesKeepTheirBoundsAndEveryEventOnce(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let daemon = TestDaemon("analytics-batches-\(seed)")
        try daemon.start()
        let count = 300 + random.int(300)
        let huge = random.int(count)
        let lines = (0..<count).map { i in
            let size = i == huge ? 41_000 : random.int(3000)
            return
                #"{"type":"when","name":"e\#(i)","app":"a","session":"s","params":{"p":"\#(String(repeating: "x", count: size))"}}"#
        }
        let answers = try exchange(daemon.socketPath, [#"{"hello":{"protocol":1,"acks":true}}"#] + lines)
        #expect(answers.errors.isEmpty && answers.acks.last == count)
        _ = daemon.stop()
        let batchEvents = 1 + random.int(120)
        let batchBytes = 8_000 + random.int(33_000)
        let out = scratchDirectory("analytics-batches-out")
        let replay = try whenctl([
            "replay", "--journal", daemon.stateDirectory + "/journal", "--plugin", executable("libanalytics.so"),
            "--plugin-config",
            #"{"batch_events":\#(batchEvents),"batch_max_bytes":\#(batchBytes),"event_max_bytes":100000}"#,
            "--state-out", out,
        ])
        try #require(replay.status == 0, "\(replay.error)")
        let file = FileManager.default.contents(atPath: out + "/analytics/events.ndjson") ?? Data()
        var names: [String] = []
        for line in file.split(separator: 0x0A) {
            let batch = try #require(
                (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any], "a line is not JSON")
            let events = batch["batch"] as? [[String: Any]] ?? []
            #expect(!events.isEmpty && events.count <= batchEvents, "\(events.count) events, at most \(batchEvents)")
            // The events as the batch joins them, between `{"batch":[` and `],"sentAt"`; the sender's
            // measure is each event's bytes and one separator: one byte more.
            let text = String(decoding: line, as: UTF8.self)
            let end = try #require(text.range(of: #"],"sentAt":"#))
            let eventBytes =
                text.utf8.distance(from: text.startIndex, to: end.lowerBound) - #"{"batch":["#.utf8.count + 1
            #expect(eventBytes <= batchBytes - 64, "\(eventBytes) bytes, at most \(batchBytes - 64)")
            names += events.compactMap { $0["event"] as? String }
        }
        #expect(names == (0..<count).filter { $0 != huge }.map { "e\($0)" }, "\(names.count) events of \(count)")
    }

    /// Events a spool holds when the endpoint leaves the configuration (the destination was
    /// down) reach the file, each once, before the new ones; and the spool goes, since nothing
    /// would send what waits in it.
    @Test func eventsASpoolHoldsReachTheFileWhenOnlyAFileIsLeft() throws {
        let server = try HTTPTestServer(answers: [.init(status: 503)])
        defer { server.stop() }
        let endpoint =
            #"plugin.analytics = {"endpoint": "http://127.0.0.1:\#(server.port)/v1/batch", "file": null, "max_backoff": 0.2}"#
        let first = try daemonWithBuiltins("analytics-drain", settings: endpoint)
        let early = (1...30).map { #"{"type":"when","name":"early\#($0)"}"# }
        try sendSession(first, app: "com.example.drain", session: "d", early)
        #expect(try first.waitForPipeline("analytics", cursor: early.count))
        _ = first.stop()
        let spool = first.stateDirectory + "/plugins/analytics/spool.ndjson"
        let waiting = (try? String(contentsOfFile: spool, encoding: .utf8))?.split(separator: "\n").count ?? 0
        #expect(waiting == early.count, "\(waiting) events in the spool")
        // What a write cut short, or anyone else, left in it: not events, and left out.
        let damage = FileHandle(forWritingAtPath: spool)
        damage?.seekToEndOfFile()
        damage?.write(Data("not an event\n{\"batch\":[{\"messageId\":\"torn".utf8))
        try damage?.close()

        let directory = scratchDirectory("analytics-drain-conf")
        try "\n".write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let second = TestDaemon(
            "analytics-drain-2", arguments: ["--builtin-pipelines", "true", "--config", directory + "/whend.conf"],
            stateDirectory: first.stateDirectory)
        try second.start()
        defer { second.stop() }
        let late = (1...20).map { #"{"type":"when","name":"late\#($0)"}"# }
        try sendSession(second, app: "com.example.drain", session: "d", late)
        #expect(try second.waitForPipelinesToCatchUp())
        let file = second.stateDirectory + "/plugins/analytics/events.ndjson"
        func names() -> [String] {
            let data = FileManager.default.contents(atPath: file) ?? Data()
            return data.split(separator: 0x0A).flatMap { line -> [String] in
                let batch = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any]
                return (batch?["batch"] as? [[String: Any]] ?? []).compactMap { $0["event"] as? String }
            }
        }
        let expected = (1...30).map { "early\($0)" } + (1...20).map { "late\($0)" }
        #expect(eventually(30) { names() == expected }, "\(names())")
        let lines = (FileManager.default.contents(atPath: file) ?? Data()).split(separator: 0x0A)
        #expect(lines.allSatisfy { (try? JSONSerialization.jsonObject(with: Data($0))) != nil }, "a line is not JSON")
        func damaged() -> Int? {
            let counters = (try? second.pipeline("analytics"))?["counters"] as? [String: Any]
            return (counters?["analytics"] as? [String: Any])?["spool_lines_damaged"] as? Int
        }
        #expect(eventually { damaged() == 2 }, "\(String(describing: damaged())) damaged lines counted")
        #expect(!FileManager.default.fileExists(atPath: spool), "the spool is still there")
    }

    /// A disk that fills under the spool (an endpoint down meanwhile): the record whose event
    /// could not be written is retried until there is room, and its event is spooled once, not
    /// once per attempt; every event reaches the endpoint once it answers, each once.
    @Test(.enabled(if: canMountTmpfs(), "needs to mount a small tmpfs (root in a sandbox that allows it)"))
    func aFullDiskUnderTheSpoolSpoolsEachEventOnce() throws {
        let server = try HTTPTestServer(answers: [.init(status: 503)])
        defer { server.stop() }
        let state = scratchDirectory("analytics-full")
        let plugin = state + "/plugins/analytics"
        try FileManager.default.createDirectory(atPath: plugin, withIntermediateDirectories: true)
        try #require(mount(plugin, size: "2m"))
        defer { unmount(plugin) }
        let directory = scratchDirectory("analytics-full-conf")
        let endpoint = "http://127.0.0.1:\(server.port)/v1/batch"
        try #"plugin.analytics = {"endpoint": "\#(endpoint)", "file": null, "max_backoff": 0.2, "flush_interval": 0.1}"#
            .write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let daemon = TestDaemon(
            "analytics-full", arguments: ["--builtin-pipelines", "true", "--config", directory + "/whend.conf"],
            stateDirectory: state)
        try daemon.start()
        defer { daemon.stop() }
        let filler = fillFileSystem(under: plugin)
        // Events of 20 KB: a few fill the spool's 64 KiB buffer between two of the pipeline's
        // flushes, so that the buffer's write fails in the middle of a record's handling.
        let noise = String(repeating: "n", count: 20_000)
        let names = (1...40).map { "e\($0)" }
        try sendSession(
            daemon, app: "com.example.full", session: "f",
            names.map { #"{"type":"when","name":"\#($0)","params":{"noise":"\#(noise)"}}"# })
        func failures() -> Int { (try? daemon.pipeline("analytics"))?["failures"] as? Int ?? 0 }
        #expect(eventually(30) { failures() >= 3 }, "the spool never met the full disk")
        unlink(filler)
        #expect(try daemon.waitForPipeline("analytics", cursor: names.count))
        let refusedBefore = server.requests.count
        server.answer([.init(status: 200)])
        func delivered() -> [String] {
            server.requests.dropFirst(refusedBefore).flatMap { body -> [String] in
                let batch = (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["batch"]
                return (batch as? [[String: Any]] ?? []).compactMap { $0["event"] as? String }
            }
        }
        #expect(eventually(30) { Set(delivered()) == Set(names) }, "delivered: \(delivered().count)")
        let counts = Dictionary(delivered().map { ($0, 1) }, uniquingKeysWith: +)
        #expect(
            counts.values.allSatisfy { $0 == 1 }, "sent more than once: \(counts.filter { $0.value > 1 }.keys.sorted())"
        )
    }
}
