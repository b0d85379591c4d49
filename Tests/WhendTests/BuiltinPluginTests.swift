import Foundation
import Testing
import WhendWire

/// A daemon with the built-in pipelines on, configured by `settings` (a configuration file).
func daemonWithBuiltins(_ name: String, settings: String = "", _ mode: DaemonMode = .inProcess) throws -> TestDaemon {
    let directory = scratchDirectory(name + "-conf")
    let file = directory + "/whend.conf"
    try (settings + "\n").write(toFile: file, atomically: true, encoding: .utf8)
    let daemon = TestDaemon(name, arguments: ["--builtin-pipelines", "true", "--config", file], mode)
    try daemon.start()
    return daemon
}

func lifecycle(_ screen: String, _ status: String, _ flag: String? = nil) -> String {
    #"{"type":"lifecycle","screen":"\#(screen)","status":"\#(status)"\#(flag.map { ",\"\($0)\":true" } ?? "")}"#
}
func navigation(_ action: String, _ screen: String? = nil) -> String {
    #"{"type":"navigation","action":"\#(action)"\#(screen.map { ",\"screen\":\"\($0)\"" } ?? "")}"#
}

/// The characters list → character detail → back journey, lifecycle events in UIKit's order.
private let listAppears = [
    lifecycle("CharacterList", "willAppear", "isBeingPresentedInitially"),
    lifecycle("CharacterList", "didAppear", "isBeingPresentedInitially"),
]
private let listCovered = [lifecycle("CharacterList", "willDisappear"), lifecycle("CharacterList", "didDisappear")]
private let detailAppears = [
    lifecycle("CharacterDetail", "willAppear", "isBeingPresentedInitially"),
    lifecycle("CharacterDetail", "didAppear", "isBeingPresentedInitially"),
]
private let detailRemoved = [
    lifecycle("CharacterDetail", "willDisappear", "isBeingRemovedIndefinitely"),
    lifecycle("CharacterDetail", "didDisappear", "isBeingRemovedIndefinitely"),
]
private let listRevealed = [lifecycle("CharacterList", "willAppear"), lifecycle("CharacterList", "didAppear")]
private let tap = #"{"type":"when","when":{"userTapsCharacter":{"characterId":1009610}}}"#

@Suite(.serialized) struct BuiltinPluginTests {
    @Test func theCharactersJourneyIsThreeScreenViewsHoweverItIsReported() throws {
        let daemon = try daemonWithBuiltins("builtin-screens")
        let app = "com.example.marvel"
        let journeys: [String: [String]] = [
            // Navigation first, then lifecycle; lifecycle first, then navigation; and the app's own
            // `screen` events besides.
            "both": [navigation("root", "CharacterList")] + listAppears + [
                tap, navigation("present", "CharacterDetail"),
            ]
                + listCovered + detailAppears + detailRemoved + listRevealed + [navigation("dismiss")],
            "both-reversed": listAppears + [navigation("root", "CharacterList"), tap] + listCovered + detailAppears
                + [navigation("present", "CharacterDetail")] + [navigation("dismiss")] + detailRemoved + listRevealed,
            "with-app-screens": [#"{"type":"screen","name":"CharacterList"}"#, navigation("root", "CharacterList")]
                + listAppears + [
                    navigation("present", "CharacterDetail"), #"{"type":"screen","name":"CharacterDetail"}"#,
                ]
                + listCovered + detailAppears + detailRemoved + listRevealed + [navigation("dismiss")],
            "navigation-only": [
                navigation("root", "CharacterList"), tap, navigation("present", "CharacterDetail"),
                navigation("dismiss"),
            ],
            "lifecycle-only": listAppears + [tap] + listCovered + detailAppears + detailRemoved + listRevealed,
        ]
        for (session, events) in journeys { try sendSession(daemon, app: app, session: session, events) }

        func views(_ session: String) -> [[String: Any]] {
            daemon.records().filter {
                $0["type"] as? String == "screen" && $0["_origin"] as? String == "screen-tracking"
                    && $0["session"] as? String == session
            }
        }
        #expect(eventually { journeys.keys.allSatisfy { views($0).count >= 3 } })
        #expect(try daemon.waitForPipelinesToCatchUp())  // a fourth view would be stored by now
        // Its counters say what it derived: counted at its checkpoints, not at each record.
        func counted() -> [String: Int] {
            let pipeline = try? daemon.pipeline("screens")
            let counters = (pipeline?["counters"] as? [String: Any])?["screen-tracking"] as? [String: Any]
            return (counters ?? [:]).compactMapValues { $0 as? Int }
        }
        #expect(eventually { counted() == ["screen": 15, "screen_time": 10] }, "\(counted())")
        daemon.stop()
        for session in journeys.keys {
            let v = views(session)
            #expect(
                v.map { $0["name"] as? String } == ["CharacterList", "CharacterDetail", "CharacterList"], "\(session)")
            #expect(v.map { $0["previous"] as? String } == [nil, "CharacterList", "CharacterDetail"], "\(session)")
            #expect(v.allSatisfy { $0["app"] as? String == app && $0["_cause"] is Int }, "\(session)")
            let times = daemon.records().filter {
                $0["type"] as? String == "screen_time" && $0["session"] as? String == session
            }
            #expect(times.map { $0["name"] as? String } == ["CharacterList", "CharacterDetail"], "\(session)")
        }
        #expect(daemon.records().filter { $0["type"] as? String == "diagnostic" }.isEmpty)
    }

    @Test func lifecycleSequencesThatBreakTheRulesAreDiagnosticsNotViews() throws {
        let daemon = try daemonWithBuiltins("builtin-diag")
        try sendSession(
            daemon, app: "com.example.marvel", session: "broken",
            [lifecycle("CharacterList", "didAppear")]  // no willAppear
                + detailAppears + detailRemoved
                // removed indefinitely, then back without being presented again
                + [lifecycle("CharacterDetail", "willAppear"), lifecycle("CharacterDetail", "didAppear")])
        func records(_ type: String) -> [[String: Any]] { daemon.records().filter { $0["type"] as? String == type } }
        #expect(eventually { records("diagnostic").count >= 3 })
        #expect(try daemon.waitForPipelinesToCatchUp())
        daemon.stop()
        #expect(
            records("diagnostic").map { $0["problem"] as? String } == [
                "didAppear without willAppear",
                "reappears after being removed indefinitely, without being presented again",
                "appears after being removed indefinitely, without being presented again",
            ])
        // The one well-formed appearance is the only view.
        #expect(records("screen").map { $0["name"] as? String } == ["CharacterDetail"])
    }

    @Test func analyticsDeliversEveryEventOnceThrough500And429() throws {
        let server = try HTTPTestServer(answers: [
            .init(status: 500), .init(status: 429, headers: ["Retry-After": "1"]), .init(status: 200),
        ])
        let daemon = try daemonWithBuiltins(
            "builtin-analytics",
            settings: """
                plugin.analytics = {"endpoint": "http://127.0.0.1:\(server.port)/v1/batch", "file": null, "flush_interval": 0.3, "max_backoff": 0.2, "write_key": "k"}
                """)
        let events = [
            navigation("present", "ChangeEmail"),
            #"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"john.doe@example.com"}},"user":"u-7"}"#,
            #"{"type":"when","when":{"userTapsChangeEmailButton":{}},"user":"u-7"}"#,
        ]
        try sendSession(daemon, app: "com.example.mail", session: "e-1", events)
        #expect(eventually(30) { server.requests.count >= 3 })
        #expect(try daemon.waitForPipelinesToCatchUp())  // analytics' cursor passes what it delivered
        daemon.stop()
        server.stop()

        let requests = server.requests.map { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] }
        #expect(requests.count == 3, "one batch: refused (500), refused (429), accepted")
        let accepted = (requests.last??["batch"] as? [[String: Any]]) ?? []
        let ids = accepted.compactMap { $0["messageId"] as? String }
        #expect(ids.count == Set(ids).count, "no event twice")
        let tracks = accepted.filter { $0["type"] as? String == "track" }
        #expect(tracks.map { $0["event"] as? String } == ["userTypesNewEmail", "userTapsChangeEmailButton"])
        #expect((tracks.first?["properties"] as? [String: String]) == ["userEmail": "john.doe@example.com"])
        #expect(tracks.allSatisfy { $0["userId"] as? String == "u-7" && $0["timestamp"] is String })
        #expect(
            tracks.allSatisfy {
                (($0["context"] as? [String: Any])?["app"] as? [String: String])?["name"] == "com.example.mail"
            })
        let screens = accepted.filter { $0["type"] as? String == "screen" }
        #expect(screens.map { $0["name"] as? String } == ["ChangeEmail"])
        #expect(screens.first?["anonymousId"] as? String == "com.example.mail:e-1")
        // The retried batches are the same batch: the same messageIds each time.
        let first = (requests.first??["batch"] as? [[String: Any]])?.compactMap { $0["messageId"] as? String }
        #expect(first == ids)
    }

    /// analytics sends what Segment's own library sends: the same top-level keys (`batch`,
    /// `sentAt`, `writeKey`, and Basic auth), and for each call type the same keys per event,
    /// `context.library` and `integrations` included; PyPI's segment-analytics-python posts to
    /// the same server in the same test.
    @Test func analyticsBatchesHaveTheKeysOfSegmentsOwnLibrary() throws {
        let server = try HTTPTestServer(answers: [.init(status: 200)])
        defer { server.stop() }
        let endpoint = "http://127.0.0.1:\(server.port)"
        let library = try runCommand(
            testPython, [repositoryRoot + "/Tests/Fixtures/segment_capture.py", endpoint, "k"])
        try #require(library.status == 0, "segment-analytics-python: \(library.error)")
        try #require(server.requests.count == 2, "one POST per call")
        let theirs = server.requests.compactMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] }
        let theirHeads = server.requestHeads

        let daemon = try daemonWithBuiltins(
            "builtin-segment",
            settings: """
                plugin.analytics = {"endpoint": "\(endpoint)/v1/batch", "file": null, "flush_interval": 0.2, "write_key": "k"}
                """)
        defer { daemon.stop() }
        try sendSession(
            daemon, app: "com.example.mail", session: "e-1",
            [
                navigation("present", "ChangeEmail"),
                #"{"type":"when","when":{"userTypesNewEmail":{"userEmail":"john.doe@example.com"}},"user":"u-7"}"#,
            ])
        #expect(eventually(30) { server.requests.count >= 3 })
        let ours = server.requests.dropFirst(2).compactMap {
            try? JSONSerialization.jsonObject(with: $0) as? [String: Any]
        }
        let ourEvents = ours.flatMap { $0["batch"] as? [[String: Any]] ?? [] }
        let theirEvents = theirs.flatMap { $0["batch"] as? [[String: Any]] ?? [] }

        // The body's keys and the authorisation, as the library sends them.
        for body in ours {
            #expect(Set(body.keys) == Set(theirs[0].keys), "top level: \(body.keys.sorted())")
            #expect(body["writeKey"] as? String == "k")
            #expect((body["sentAt"] as? String).flatMap { RFC3339.parse(Array($0.utf8)) } != nil)
        }
        let basic = "Basic " + Data("k:".utf8).base64EncodedString()
        for head in theirHeads.prefix(1) + server.requestHeads.dropFirst(2) {
            #expect(head.contains("\r\nAuthorization: \(basic)") || head.contains("\r\nauthorization: \(basic)"))
        }
        // Call type by call type, the same keys; whend's context says more (app, session, screen).
        for type in ["track", "screen"] {
            let mine = try #require(ourEvents.first { $0["type"] as? String == type }, "no \(type) of whend's")
            let reference = try #require(theirEvents.first { $0["type"] as? String == type })
            #expect(
                Set(mine.keys) == Set(reference.keys), "\(type): \(mine.keys.sorted()) ≠ \(reference.keys.sorted())")
            let context = mine["context"] as? [String: Any] ?? [:]
            #expect(Set((context["library"] as? [String: Any] ?? [:]).keys) == ["name", "version"])
            #expect((mine["integrations"] as? [String: Any])?.isEmpty == true)
            #expect((mine["messageId"] as? String).map { !$0.isEmpty && $0.count < 100 } == true)
            #expect((mine["timestamp"] as? String).flatMap { RFC3339.parse(Array($0.utf8)) } != nil)
        }
    }

    /// With `"gzip": true` the body is one gzip member (`Content-Encoding: gzip`), as RudderStack's
    /// SDKs send it: gzip itself decompresses it to the batch.
    @Test func analyticsGzipsItsBodiesWhenAsked() throws {
        let server = try HTTPTestServer(answers: [.init(status: 200)])
        defer { server.stop() }
        let daemon = try daemonWithBuiltins(
            "builtin-gzip",
            settings: """
                plugin.analytics = {"endpoint": "http://127.0.0.1:\(server.port)/v1/batch", "file": null, "flush_interval": 0.2, "gzip": true}
                """)
        defer { daemon.stop() }
        try sendSession(daemon, app: "com.example.gzip", session: "g", [#"{"type":"when","name":"zipped"}"#])
        #expect(eventually(30) { server.requests.count >= 1 })
        let body = try #require(server.requests.first)
        #expect(server.requestHeads.first?.contains("\r\nContent-Encoding: gzip") == true)
        let file = daemon.directory + "/body.gz"
        try body.write(to: URL(fileURLWithPath: file))
        let plain = try runCommand("/bin/sh", ["-c", "exec gzip -dc < '\(file)'"])
        #expect(plain.status == 0, "gzip: \(plain.error)")
        let batch = (try? JSONSerialization.jsonObject(with: Data(plain.output.utf8)) as? [String: Any])?["batch"]
        #expect((batch as? [[String: Any]])?.first?["event"] as? String == "zipped")
    }

    /// A pipeline faster than a batch's flush interval: the sender sends a batch as soon as it
    /// is full (or half the spool is), and an append waits a moment for room, so no record fails
    /// for a full spool. (The sender slept the interval out after a first event while the spool
    /// filled: a replay lost events, a live pipeline failed and retried them.)
    @Test func analyticsKeepsUpWithAPipelineFasterThanItsFlushInterval() throws {
        let daemon = try daemonWithBuiltins(
            "builtin-spool",
            settings: #"plugin.analytics = {"spool_max_bytes": 40000, "flush_interval": 3, "batch_events": 50}"#)
        defer { daemon.stop() }
        let events = (1...1000).map { #"{"type":"when","name":"tap","id":"t-\#($0)"}"# }
        try sendSession(daemon, app: "com.example.fast", session: "f", events)
        let file = daemon.stateDirectory + "/plugins/analytics/events.ndjson"
        func sent() -> Int {
            let text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
            return text.components(separatedBy: #""messageId""#).count - 1
        }
        #expect(eventually(30) { sent() == 1000 })
        let pipelines = try daemon.status()["pipelines"] as? [[String: Any]]
        let analytics = pipelines?.first { $0["name"] as? String == "analytics" }
        #expect(analytics?["failures"] as? Int == 0, "no record refused for a full spool")
    }

    /// Each instance of a plugin keeps its state in a directory of its own. The built-in
    /// analytics pipeline and a second one naming analytics each send every event once, to a
    /// file of their own; the built-in one keeps the directory the docs name. (Sharing one
    /// directory, both wrote one file and compacted one spool: each event twice in one file.)
    @Test func twoPipelinesOfOnePluginKeepTheirStateApart() throws {
        let daemon = try daemonWithBuiltins(
            "builtin-two-analytics",
            settings: "pipeline.second = analytics\nplugin.analytics = {\"flush_interval\": 0.2}")
        defer { daemon.stop() }
        let names = (1...300).map { "step\($0)" }
        try sendSession(
            daemon, app: "com.example.twice", session: "t", names.map { #"{"type":"when","name":"\#($0)"}"# })
        #expect(try daemon.waitForPipelinesToCatchUp())
        func sent(_ directory: String) -> [String] {
            let text =
                (try? String(contentsOfFile: daemon.stateDirectory + directory + "/events.ndjson", encoding: .utf8))
            return (text ?? "").split(separator: "\n").flatMap { line -> [String] in
                let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                return (object?["batch"] as? [[String: Any]] ?? []).compactMap { $0["event"] as? String }
            }
        }
        for directory in ["/plugins/analytics", "/plugins/analytics@second"] {
            #expect(eventually(30) { sent(directory).count >= names.count })
            let counts = Dictionary(sent(directory).map { ($0, 1) }, uniquingKeysWith: +)
            #expect(
                counts.count == names.count && counts.values.allSatisfy { $0 == 1 },
                "\(directory): \(counts.count) events, \(counts.values.filter { $0 > 1 }.count) more than once")
        }
    }

    /// analytics writes its spool in batches; its worker flushes them before its cursor passes
    /// the records. Killed once the cursor is past every record, while the destination refuses
    /// everything, the worker must have every event in the spool: the next one delivers them.
    @Test func analyticsLosesNoEventWhenItsWorkerIsKilledPastItsRecords() throws {
        let server = try HTTPTestServer(answers: [.init(status: 503)])
        let daemon = try daemonWithBuiltins(
            "builtin-analytics-kill",
            settings: """
                plugin.analytics = {"endpoint": "http://127.0.0.1:\(server.port)/v1/batch", "file": null, "flush_interval": 0.2, "max_backoff": 0.2}
                """)
        defer { daemon.stop() }
        let names = (1...40).map { "step\($0)" }
        try sendSession(
            daemon, app: "com.example.kill", session: "k", names.map { #"{"type":"when","name":"\#($0)"}"# })
        #expect(try daemon.waitForPipeline("analytics", cursor: names.count))
        guard let pid = try daemon.pipeline("analytics")?["pid"] as? Int, pid > 0 else {
            Issue.record("no analytics worker")
            return
        }
        kill(pid_t(pid), SIGKILL)
        // Only what the next worker sends counts: the killed one sent every event already.
        #expect(eventually { (try? daemon.pipeline("analytics")?["pid"] as? Int).map { $0 != pid } ?? false })
        let sentBefore = server.requests.count
        server.answer([.init(status: 200)])
        func delivered() -> Set<String> {
            Set(
                server.requests.dropFirst(sentBefore).flatMap { body -> [String] in
                    let batch =
                        (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["batch"] as? [[String: Any]]
                    return (batch ?? []).compactMap { $0["event"] as? String }
                })
        }
        #expect(eventually(30) { delivered() == Set(names) }, "delivered: \(delivered().sorted())")
        server.stop()
    }

    @Test func analyticsFiltersByAppAndWhenReportsOversizedEventsAndDropsWhatA4xxRefuses() throws {
        let server = try HTTPTestServer(answers: [.init(status: 400), .init(status: 200)])
        let daemon = try daemonWithBuiltins(
            "builtin-filters",  // live: the analytics worker's log is on whend's standard error
            settings: """
                plugin.analytics = {"endpoint": "http://127.0.0.1:\(server.port)/v1/batch", "flush_interval": 0.2, "include_apps": ["com.example.mail"], "exclude_whens": ["noise"], "event_max_bytes": 600}
                """, .live)
        let huge = String(repeating: "x", count: 700)
        try sendSession(
            daemon, app: "com.example.mail", session: "m",
            [
                #"{"type":"when","name":"first"}"#, #"{"type":"when","name":"noise"}"#,
                #"{"type":"when","name":"huge","params":{"text":"\#(huge)"}}"#,
            ])
        try sendSession(daemon, app: "com.example.other", session: "o", [#"{"type":"when","name":"elsewhere"}"#])
        #expect(eventually { server.requests.count >= 1 })
        #expect(try daemon.waitForPipelinesToCatchUp())
        try sendSession(daemon, app: "com.example.mail", session: "m", [#"{"type":"when","name":"second"}"#])
        #expect(eventually { server.requests.count >= 2 })
        let file = daemon.stateDirectory + "/plugins/analytics/events.ndjson"
        #expect(eventually { ((try? String(contentsOfFile: file, encoding: .utf8)) ?? "").contains("second") })
        // A dropped batch is counted as dropped, not as sent too (it was, before).
        func counters() -> [String: Int] {
            let json = (try? daemon.whenctl(["plugins", "--json"]).output) ?? ""
            let reply = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] ?? [:]
            let pipeline = (reply["pipelines"] as? [[String: Any]] ?? []).first { $0["name"] as? String == "analytics" }
            let all = (pipeline?["counters"] as? [String: Any])?["analytics"] as? [String: Any] ?? [:]
            return all.compactMapValues { ($0 as? NSNumber)?.intValue }
        }
        #expect(eventually { counters()["events_dropped"] == 1 && counters()["events_sent", default: 0] >= 1 })
        #expect(try daemon.waitForPipelinesToCatchUp())
        #expect(counters()["events_sent"] == 1, "\(counters())")
        daemon.stop()
        server.stop()
        func events(_ body: Data) -> [String] {
            let batch = (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["batch"] as? [[String: Any]]
            return (batch ?? []).compactMap { $0["event"] as? String }
        }
        // The 400 dropped the first batch (not retried); the next batch went on its own.
        #expect(server.requests.map(events) == [["first"], ["second"]])
        #expect(daemon.log.contains("with HTTP 400; dropped"))
        #expect(daemon.log.contains("over event_max_bytes 600; not sent"))
        // The file destination saw the same events, whatever the endpoint said.
        let written = ((try? String(contentsOfFile: file, encoding: .utf8)) ?? "").split(separator: "\n").flatMap {
            events(Data($0.utf8))
        }
        #expect(written == ["first", "second"])
    }

    @Test func aFatalErrorAfterOnboardingIsACrashReportWithItsScreenAndBreadcrumbs() throws {
        let daemon = try daemonWithBuiltins("builtin-crash")
        let onboarding =
            [navigation("root", "Welcome"), #"{"type":"when","name":"userTapsGetStarted"}"#]
            + [
                navigation("push", "Consent"),
                #"{"type":"when","name":"userAcceptsTerms","params":{"version":"2026-03"}}"#,
            ]
            + [
                navigation("push", "ChoosePractice"),
                #"{"type":"when","name":"userSelectsPractice","params":{"practiceId":"P1"}}"#,
            ]
            + [#"{"type":"error","message":"practice list index out of range","fatal":true,"stack":["select(_:)"]}"#]
        try sendSession(daemon, app: "uk.nhs.gp-onboarding", session: "o-1", onboarding)
        // A non-fatal error is not a crash.
        try sendSession(
            daemon, app: "uk.nhs.gp-onboarding", session: "o-2", [#"{"type":"error","message":"slow network"}"#])
        let crashes = { try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "--json"]) }
        #expect(eventually { (try? crashes().output.contains("o-1")) == true })
        let sessionsReady = eventually {
            (try? whenctl(["sessions", "--state-dir", daemon.stateDirectory]).output.contains("o-2")) == true
        }
        #expect(sessionsReady)
        daemon.stop()

        let list = try crashes()
        #expect(list.status == 0)
        let summaries = list.output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(summaries.count == 1)
        #expect(summaries.first?["screen"] as? String == "ChoosePractice")
        #expect(summaries.first?["message"] as? String == "practice list index out of range")
        let seq = try #require(summaries.first?["seq"] as? Int)
        let shown = try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "--json", String(seq)])
        let report = try #require(try JSONSerialization.jsonObject(with: Data(shown.output.utf8)) as? [String: Any])
        #expect(report["app"] as? String == "uk.nhs.gp-onboarding" && report["session"] as? String == "o-1")
        let crumbs = report["breadcrumbs"] as? [[String: Any]] ?? []
        // Oldest first: the whole journey, with the screen views screen-tracking derived.
        #expect(
            crumbs.filter { $0["type"] as? String == "when" }.map { $0["name"] as? String } == [
                "userTapsGetStarted", "userAcceptsTerms", "userSelectsPractice",
            ])
        let seqs = crumbs.compactMap { $0["seq"] as? Int }
        #expect(seqs == seqs.sorted() && seqs.first == 1)
        #expect(crumbs.compactMap { $0["type"] as? String }.prefix(2) == ["navigation", "when"])
        let human = try whenctl(["crashes", "--state-dir", daemon.stateDirectory, String(seq)])
        #expect(human.output.contains("screen   ChoosePractice") && human.output.contains("at select(_:)"))

        let sessions = try whenctl(["sessions", "--state-dir", daemon.stateDirectory, "--json"])
        let entries = sessions.output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        let o1 = try #require(entries.first { $0["session"] as? String == "o-1" })
        #expect(o1["firstSeq"] as? Int == 1)
        #expect((o1["counts"] as? [String: Int])?["when"] == 3 && (o1["counts"] as? [String: Int])?["error"] == 1)
        #expect((o1["counts"] as? [String: Int])?["navigation"] == 3)
        // One session's records, read from its first _seq.
        let records = try whenctl(["sessions", "--state-dir", daemon.stateDirectory, "o-2"])
        #expect(records.output.contains("slow network") && !records.output.contains("userTapsGetStarted"))
    }

    /// whend keeps an unpaired surrogate's escape as the app sent it (`\udfff`), and a crash
    /// report's breadcrumbs quote it; Foundation refuses it, and `whenctl crashes` left such a
    /// report out without a word (found from outside). It lists and shows it, the escape read as
    /// U+FFFD.
    @Test func aCrashReportQuotingAnUnpairedSurrogateIsListedAndShown() throws {
        let daemon = try daemonWithBuiltins("crash-surrogate")
        try sendSession(
            daemon, app: "com.example.odd", session: "lone",
            [
                #"{"type":"when","name":"typed","params":{"k":"\udfff"}}"#,
                #"{"type":"error","message":"boom","fatal":true}"#,
            ])
        let list = { try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "--json"]) }
        #expect(eventually { (try? list().output.contains(#""session":"lone""#)) == true })
        daemon.stop()
        let shown = try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "2"])
        #expect(shown.status == 0, "\(shown.error)")
        #expect(shown.output.contains("boom"), "\(shown.output)")
    }

    @Test func crashReportsReportsTheFailureOfAPluginAfterIt() throws {
        let fixtures = scratchDirectory("crash-fixtures")
        chmod(fixtures, 0o755)
        _ = try buildTestPlugin("recorder", into: fixtures, name: "recorder")
        let built = (executable("whend") as NSString).deletingLastPathComponent
        let daemon = try daemonWithBuiltins(
            "builtin-failure",
            settings:
                "plugin_dirs = \(fixtures):\(built)\npipeline.main = crash-reports, recorder\npipeline_retry_limit = 2")
        try sendSession(
            daemon, app: "com.example.mail", session: "f-1",
            [
                navigation("present", "ChangeEmail"), #"{"type":"when","name":"poison"}"#,
                #"{"type":"when","name":"fine"}"#,
            ])
        // This pipeline's crash-reports keeps a directory of its own beside the built-in `crashes`
        // pipeline's; `whenctl crashes` shows the reports of both.
        let listed = { try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "--json"]).output }
        #expect(eventually { (try? listed().contains(#""kind":"plugin_failure""#)) == true })
        let own = daemon.stateDirectory + "/plugins/crash-reports@main/reports"
        #expect(
            ((try? FileManager.default.contentsOfDirectory(atPath: own)) ?? []).contains {
                $0.hasSuffix("plugin_failure.json")
            })
        // The failure went on to the pipeline: retried, then dead-lettered, and the pipeline moved on.
        let deadLetters = daemon.stateDirectory + "/pipelines/main/dead-letter.jsonl"
        #expect(eventually { (try? String(contentsOfFile: deadLetters, encoding: .utf8))?.contains("poison") == true })
        daemon.stop()
        let shown = try whenctl(["crashes", "--state-dir", daemon.stateDirectory, "--json", "2"])
        let report = try #require(try JSONSerialization.jsonObject(with: Data(shown.output.utf8)) as? [String: Any])
        #expect(report["kind"] as? String == "plugin_failure" && report["screen"] as? String == "ChangeEmail")
        #expect(((report["error"] as? [String: Any])?["message"] as? String)?.contains("_seq 2") == true)
    }
}
