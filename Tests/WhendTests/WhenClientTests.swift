import Foundation
import Testing
import WhenClient

/// The seed's email-change screen, in its Codable form.
private enum EmailWhen: Codable, Equatable {
    case userTypesNewEmail(userEmail: String)
    case userTapsChangeEmailButton
    case userPicksSuggestion(String, Int)
}

private struct SaveFailed: Error {}

private struct CharacterList: ScreenNaming {
    func screenName() -> String? { "CharacterList" }
}
private struct CharacterDetail: AccessibilityIdentifying {
    var accessibilityIdentifier: String? { "CharacterDetail" }
}
private final class RecordingNavigator: Navigator, @unchecked Sendable {
    var moves: [String] = []
    func handle(navigation: Navigation<Any>, animated: Bool) { moves.append("\(navigation)") }
}

/// Records of one app, in `_seq` order.
private func records(of app: String, in daemon: TestDaemon) -> [[String: Any]] {
    daemon.records().filter { $0["app"] as? String == app }
}

@Suite(.serialized) struct WhenClientTests {
    @Test func eventsArriveInOrderWithTheRightFields() throws {
        let daemon = TestDaemon("client-order")
        try daemon.start()
        var configuration = WhenClient.Configuration(
            app: "com.example.marvel", session: "s-1", socketPath: daemon.socketPath)
        configuration.user = "u-42"
        let client = WhenClient(configuration)

        client.emit(ScreenLifecycleEvent(screen: "CharacterList", status: .willAppear, isBeingPresentedInitially: true))
        client.emit(ScreenLifecycleEvent(screen: "CharacterList", status: .didAppear, isBeingPresentedInitially: true))
        let base = RecordingNavigator()
        let navigator = TrackingNavigator(base, client: client)
        navigator.handle(navigation: .root(CharacterList()))
        navigator.handle(navigation: .present(CharacterDetail()))
        navigator.handle(navigation: .dismiss)
        client.reporting(EmailWhen.userTypesNewEmail(userEmail: "a\"b@example.com"), screen: "ChangeEmail") { _ in }
        client.reporting(EmailWhen.userTapsChangeEmailButton) { _ in }
        client.reporting(EmailWhen.userPicksSuggestion("x", 2)) { _ in }
        #expect(throws: SaveFailed.self) {
            try client.reporting(EmailWhen.userTapsChangeEmailButton, screen: "ChangeEmail") { _ in throw SaveFailed() }
        }
        client.emit(
            ScreenLifecycleEvent(screen: "CharacterList", status: .didDisappear, isBeingRemovedIndefinitely: true))
        #expect(client.flush(timeout: 10))
        #expect(client.refused == 0)
        #expect(base.moves.count == 3)
        daemon.stop()

        let stored = records(of: "com.example.marvel", in: daemon)
        let summary = stored.map { r -> String in
            switch r["type"] as? String {
            case "lifecycle": "lifecycle \(r["screen"]!) \(r["status"]!)"
            case "navigation": "navigation \(r["action"]!) \((r["screen"] as? String) ?? "-")"
            case "when": "when \(r["name"]!)"
            case "error": "error \(r["name"]!) \(r["screen"]!)"
            default: "other"
            }
        }
        #expect(
            summary == [
                "lifecycle CharacterList willAppear", "lifecycle CharacterList didAppear",
                "navigation root CharacterList", "navigation present CharacterDetail", "navigation dismiss -",
                "when userTypesNewEmail", "when userTapsChangeEmailButton", "when userPicksSuggestion",
                "when userTapsChangeEmailButton", "error userTapsChangeEmailButton ChangeEmail",
                "lifecycle CharacterList didDisappear",
            ])
        // Every record: the configured session and user, a distinct id, the client's clock.
        #expect(stored.allSatisfy { $0["session"] as? String == "s-1" && $0["user"] as? String == "u-42" })
        #expect(Set(stored.compactMap { $0["id"] as? String }).count == stored.count)
        #expect(
            stored.allSatisfy { ($0["ts"] as? String)?.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/) != nil }
        )
        #expect(stored[0]["isBeingPresentedInitially"] as? Bool == true)
        #expect(stored[10]["isBeingRemovedIndefinitely"] as? Bool == true)
        // The Codable form as is: labelled values by label, unlabelled ones as _0, _1.
        #expect(stored[5]["params"] as? [String: String] == ["userEmail": "a\"b@example.com"])
        #expect(stored[5]["screen"] as? String == "ChangeEmail")
        #expect((stored[6]["params"] as? [String: Any])?.isEmpty == true)
        let positional = stored[7]["params"] as? [String: Any]
        #expect(positional?["_0"] as? String == "x" && positional?["_1"] as? Int == 2 && positional?.count == 2)
        #expect((stored[9]["message"] as? String)?.contains("SaveFailed") == true)
    }

    @Test func aDaemonKilledAndRestartedMidStreamLosesNothingAndStoresNothingTwice() throws {
        let daemon = TestDaemon.live("client-kill")
        try daemon.start()
        var configuration = WhenClient.Configuration(app: "kill-test", session: "k", socketPath: daemon.socketPath)
        configuration.queueCapacity = 100_000
        let client = WhenClient(configuration)
        let total = 30_000
        // About 3 s of events, so that both kills land while the app is still emitting.
        let emitted = DispatchSemaphore(value: 0)
        let finished = Flag()
        let emitter = Thread {
            defer { finished.set() }
            for i in 0..<total {
                client.emit(["type": "when", "name": "tick", "params": ["n": i]])
                if i % 10 == 0 { usleep(1000) }
            }
            emitted.signal()
        }
        emitter.start()
        // Kill it while events are flowing, twice, with the client left to find it again.
        for _ in 0..<2 {
            let deadline = Date().addingTimeInterval(20)
            let before = records(of: "kill-test", in: daemon).count
            while records(of: "kill-test", in: daemon).count < before + 3000 && Date() < deadline { usleep(50_000) }
            // Mid-stream: the app is still emitting when it dies.
            #expect(!finished.isSet)
            daemon.crash()
            usleep(300_000)
            try daemon.start()
        }
        emitted.wait()
        #expect(client.flush(timeout: 60))
        #expect(client.pending.dropped == 0)
        daemon.stop()
        let stored = records(of: "kill-test", in: daemon)
        let numbers = stored.compactMap { ($0["params"] as? [String: Any])?["n"] as? Int }
        #expect(numbers.count == total)
        #expect(Set(numbers).count == total)
        #expect(Set(stored.compactMap { $0["id"] as? String }).count == total)
    }

    @Test func withTheDaemonDownAFullQueueDropsCountsAndReportsOnceBack() throws {
        let daemon = TestDaemon("client-down")
        var configuration = WhenClient.Configuration(app: "down-test", session: "d", socketPath: daemon.socketPath)
        configuration.queueCapacity = 100
        configuration.maxBackoff = 0.5
        let client = WhenClient(configuration)
        var accepted = 0
        for i in 0..<1000 where client.emit(["type": "when", "name": "tick", "params": ["n": i]]) { accepted += 1 }
        #expect(accepted == 100)
        #expect(client.pending.queued == 100 && client.pending.dropped == 900)
        #expect(!client.flush(timeout: 0.2))

        try daemon.start()
        #expect(client.flush(timeout: 20))
        #expect(client.pending.queued == 0 && client.pending.dropped == 0)
        daemon.stop()
        let stored = records(of: "down-test", in: daemon)
        let ticks = stored.filter { $0["name"] as? String == "tick" }
        #expect(ticks.compactMap { ($0["params"] as? [String: Any])?["n"] as? Int } == Array(0..<100))
        let reports = stored.filter { $0["name"] as? String == "whenClientDroppedEvents" }
        #expect(reports.count == 1)
        let params = reports.first?["params"] as? [String: Any]
        #expect(params?["count"] as? Int == 900)
        #expect(params?["queueCapacity"] as? Int == 100)
        #expect((params?["since"] as? String)?.hasPrefix("20") == true)
    }

    @Test func eventsTheDaemonCannotStoreForNowAreSentAgain() throws {
        // 100 events/s with a burst of 10: most of the 200 are first refused as rate_limited.
        let daemon = TestDaemon("client-rate", arguments: ["--rate-limit", "100", "--rate-burst", "10"])
        try daemon.start()
        let client = WhenClient(.init(app: "rate-test", session: "r", socketPath: daemon.socketPath))
        for i in 0..<200 { client.emit(["type": "when", "name": "tick", "params": ["n": i]]) }
        #expect(client.flush(timeout: 30))
        #expect(client.refused == 0)
        daemon.stop()
        let numbers = records(of: "rate-test", in: daemon).compactMap {
            ($0["params"] as? [String: Any])?["n"] as? Int
        }
        #expect(numbers.count == 200 && Set(numbers).count == 200)
    }

    @Test func eventsTheDaemonRefusesForGoodAreCountedAndNotSentAgain() throws {
        let daemon = TestDaemon("client-refused")
        try daemon.start()
        let client = WhenClient(.init(app: "refused-test", session: "r", socketPath: daemon.socketPath))
        client.emit(["type": "lifecycle", "screen": "A", "status": "sleeping"])
        client.emit(["type": "when", "name": "fine"])
        #expect(client.flush(timeout: 10))
        #expect(client.refused == 1)
        daemon.stop()
        #expect(records(of: "refused-test", in: daemon).map { $0["name"] as? String } == ["fine"])
    }

    @Test func valuesOfEveryKindArriveAsSent() throws {
        let daemon = TestDaemon("client-values")
        try daemon.start()
        let client = WhenClient(.init(app: "values-test", session: "v", socketPath: daemon.socketPath))
        // As an app might have them: native values, and values that came out of JSONSerialization.
        let parsed = try JSONSerialization.jsonObject(with: Data(#"{"flag":true,"n":7,"x":0.25,"none":null}"#.utf8))
        let context: [String: Any] = [
            "text": "quote \" backslash \\ newline \n tab \t bell \u{7} é 😀", "int": -42, "big": Int64(1) << 60,
            "double": 1.5, "whole": 3.0, "bool": false, "list": [1, "two", [true], ["k": "v"]] as [Any],
            "empty": [String: Any](), "parsed": parsed,
        ]
        #expect(client.emit(["type": "when", "name": "values", "context": context]))
        #expect(!client.emit(["type": "when", "name": "bad", "context": ["nan": Double.nan]]))
        #expect(!client.emit(["type": "when", "name": "bad", "context": ["date": Date()]]))
        #expect(client.flush(timeout: 10))
        #expect(client.refused == 0)
        daemon.stop()
        let stored = try #require(records(of: "values-test", in: daemon).first?["context"] as? [String: Any])
        #expect(stored["text"] as? String == "quote \" backslash \\ newline \n tab \t bell \u{7} é 😀")
        #expect(stored["int"] as? Int == -42 && stored["big"] as? Int == 1 << 60)
        #expect(stored["double"] as? Double == 1.5 && stored["whole"] as? Int == 3 && stored["bool"] as? Bool == false)
        let list = try #require(stored["list"] as? [Any])
        #expect(list.count == 4 && list[0] as? Int == 1 && list[1] as? String == "two")
        #expect((list[2] as? [Any])?.first as? Bool == true && (list[3] as? [String: String]) == ["k": "v"])
        #expect((stored["empty"] as? [String: Any])?.isEmpty == true)
        let parsedBack = try #require(stored["parsed"] as? [String: Any])
        #expect(
            parsedBack["flag"] as? Bool == true && parsedBack["n"] as? Int == 7 && parsedBack["x"] as? Double == 0.25)
        #expect(parsedBack["none"] is NSNull)
    }

    @Test func theDemoRunsTheSeedsThreeJourneys() throws {
        let daemon = TestDaemon("client-demo")
        try daemon.start()
        let run = try runCommand(
            executable("whend-demo"),
            ["--socket", daemon.socketPath, "--rate", "0", "--sessions", "30", "--fatal-one-in", "2", "--quiet"])
        #expect(run.status == 0, "\(run.error)")
        #expect(run.output.contains("30 sessions") && run.output.contains("dropped 0, refused 0"))
        daemon.stop()
        let stored = daemon.records()
        #expect(
            Set(stored.compactMap { $0["app"] as? String }) == [
                "com.example.marvel", "com.example.mail", "uk.nhs.gp-onboarding",
            ])
        #expect(Set(stored.compactMap { $0["session"] as? String }).count == 30)
        let whens = Set(stored.filter { $0["type"] as? String == "when" }.compactMap { $0["name"] as? String })
        #expect(
            whens.isSuperset(of: [
                "userTapsCharacter", "userTypesNewEmail", "userTapsChangeEmailButton", "userSelectsPractice",
            ]))
        // About one onboarding in two ends in a fatal error (the seed fixes which).
        #expect((1...9).contains(stored.filter { $0["fatal"] as? Bool == true }.count))
        #expect(
            Set(stored.compactMap { $0["action"] as? String }) == [
                "root", "push", "present", "replace", "dismiss", "pop",
            ])
    }

    @Test func screenNamesFollowTheProposalsFallbacks() {
        struct Named: ScreenNaming, AccessibilityIdentifying {
            var name: String?
            func screenName() -> String? { name }
            var accessibilityIdentifier: String? { "identifier" }
        }
        struct ProfileViewModel {}
        struct Driven: ViewModelProviding {
            var viewModelForScreenName: Any? { ProfileViewModel() }
        }
        struct Anonymous {}
        #expect(resolvedScreenName(of: Named(name: "Profile")) == "Profile")
        #expect(resolvedScreenName(of: Named(name: "")) == "identifier")
        #expect(resolvedScreenName(of: Named(name: nil)) == "identifier")
        #expect(resolvedScreenName(of: Driven()) == "ProfileViewModel")
        #expect(resolvedScreenName(of: Anonymous()) == nil)
    }
}
