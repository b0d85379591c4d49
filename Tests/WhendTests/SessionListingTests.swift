import Foundation
import PropertyBased
import SeededRandom
import Testing

/// `whenctl sessions` against what session-recorder itself indexes, under a small
/// `max_sessions`.
@Suite(.serialized) struct SessionListingTests {
    /// The property, with `whenctl replay` as its oracle: for generated, seeded runs of sessions
    /// (more of them than `max_sessions`, coming back after others), with whend stopped and
    /// started again between some of them, `whenctl sessions` lists right away — from the
    /// export and the journal after it, before the plugin exports again — what the plugin
    /// exports after a replay of the same journal in one go. (Before, the listing kept every
    /// session the journal named after the export, whatever `max_sessions`.)
    // Not shrunk: each input is a real whend's run of seconds to minutes, and the shrinker
    // reruns a failing one for as long as it fails, reporting nothing until it stops (a CI run
    // spent its 90 minutes so). The failure names its seed (`.fixedSeed`) to run it again.
    @Test(.shrinking(false)) func theListingIsWhatAReplayIndexesUnderMaxSessions() async throws {
        await propertyCheck(count: 3, input: Gen.uint64()) { seed in
            do {
                try Self.check(seed: seed)
            } catch {
                Issue.record("seed \(seed): \(error)")
            }
        }
    }

    static func check(seed: UInt64) throws {
        var random = SplitMix64(state: seed)
        let limit = 1 + random.int(3)
        let (daemon, config) = try builtinPipelineDaemon(
            "listing-\(seed % 10000)", keeping: "sessions",
            settings: ["pipeline_snapshot_interval = 0.2", #"plugin.session-recorder = {"max_sessions": \#(limit)}"#])
        try daemon.start()
        defer { _ = daemon.stop() }
        let export = daemon.stateDirectory + "/plugins/session-recorder/sessions.json"
        #expect(eventually { FileManager.default.fileExists(atPath: export) })
        for round in 0..<4 {
            for _ in 0..<(2 + random.int(5)) {
                let events = (0...random.int(3)).map { _ in
                    [#"{"type":"when","name":"tap"}"#, #"{"type":"screen","name":"Home"}"#][random.int(2)]
                }
                try sendSession(daemon, app: "com.example.app", session: "s\(random.int(limit + 3))", events)
            }
            let listed = try Self.listing(stateDirectory: daemon.stateDirectory)
            let replayed = try Self.replayedListing(daemon, config: config)
            #expect(!listed.isEmpty && listed.count <= limit, "seed \(seed), round \(round): \(listed)")
            let same = listed == replayed
            #expect(
                same,
                "seed \(seed), max_sessions \(limit), round \(round): whenctl sessions \(listed), replayed \(replayed)")
            if random.int(2) == 0 {
                _ = daemon.stop()
                try daemon.start()
            }
        }
    }

    /// `whenctl sessions --json`: one line per session, most recent first.
    static func listing(stateDirectory: String) throws -> [String] {
        let r = try whenctl(["sessions", "--state-dir", stateDirectory, "--json", "--limit", "1000"])
        guard r.status == 0 else { throw TestFailure(description: "whenctl sessions: \(r.error)") }
        return r.output.split(separator: "\n").map(String.init)
    }

    /// The listing of what session-recorder exports after `whenctl replay` of `daemon`'s journal.
    static func replayedListing(_ daemon: TestDaemon, config: String) throws -> [String] {
        let state = scratchDirectory("listing-replay")
        defer { try? FileManager.default.removeItem(atPath: state) }
        let r = try whenctl([
            "replay", "--state-dir", daemon.stateDirectory, "--pipeline", "sessions", "--config", config,
            "--state-out", state + "/plugins",
        ])
        guard r.status == 0 else { throw TestFailure(description: "whenctl replay: \(r.error)") }
        // No journal there: the export alone.
        return try listing(stateDirectory: state)
    }
}
