import Foundation
import Testing
import WhendConfiguration
import WhendDaemon
import WhendJournal
import WhendPipelines
import WhendPluginHost

/// A whend (not started) with the built-in pipelines, all but `kept` turned off, on `settings`
/// (one a line);
/// and its configuration file (for a replay of what it stored).
func builtinPipelineDaemon(_ name: String, keeping kept: String, settings: [String], arguments: [String] = []) throws
    -> (TestDaemon, configuration: String)
{
    let off = ["analytics", "crashes", "screens", "sessions"].filter { $0 != kept }.map { "pipeline.\($0) =" }
    let config = try writeConfiguration(scratchDirectory(name + "-conf"), (settings + off).joined(separator: "\n"))
    return (TestDaemon.live(name, arguments: ["--builtin-pipelines", "true", "--config", config] + arguments), config)
}

/// SIGKILLs `pipeline`'s worker as it runs now (it may be starting again after the last kill);
/// nil when it did, else why not: no worker ran within 30 s (with the pipeline's last status).
/// A worker seen running that is gone by the kill (it ended on its own: a restart whend asked
/// for) is not one to kill: the next one is.
private func killWorker(_ daemon: TestDaemon, _ pipeline: String) -> String? {
    var last: [String: Any]?
    let killed = eventually(30) {  // a restart waits out its backoff, longer on a busy machine
        last = try? daemon.pipeline(pipeline)
        guard last?["state"] as? String == "running", let pid = last?["pid"] as? Int, pid > 0 else { return false }
        return Glibc.kill(pid_t(pid), SIGKILL) == 0
    }
    return killed ? nil : "no \(pipeline) worker to kill within 30 s; its status: \(last.map { "\($0)" } ?? "none")"
}

@Suite(.serialized) struct SnapshotTests {
    /// The seeds' journeys stream while the screens worker is SIGKILLed at 20 random moments and
    /// whend itself twice: what screen-tracking derived is, byte for byte and in the order of
    /// their causes, what `whenctl replay` derives from the same journal in one go. (Without
    /// saved state, a restarted worker handles the records after its cursor against empty
    /// sessions, and derives other records.)
    @Test func derivedRecordsSurviveWorkerAndDaemonKillsUnchanged() throws {
        let interval = ProcessInfo.processInfo.environment["WHEND_TEST_SNAPSHOT_INTERVAL"] ?? "0.2"
        let (daemon, file) = try builtinPipelineDaemon(
            "snapshots", keeping: "screens", settings: ["pipeline_snapshot_interval = \(interval)"])
        try daemon.start()
        let demo = try startDemo(daemon, ["--rate", "600", "--duration", "12", "--seed", "11", "--fatal-one-in", "0"])
        var generator = SystemRandomNumberGenerator()
        var workerKills = 0
        var daemonKills = 0
        while workerKills < 20 {
            usleep(UInt32.random(in: 150_000...450_000, using: &generator))
            if (workerKills == 7 && daemonKills == 0) || (workerKills == 14 && daemonKills == 1) {
                daemon.crash()
                daemonKills += 1
                try daemon.start()
                continue
            }
            if let why = killWorker(daemon, "screens") {
                Issue.record("after \(workerKills) kills: \(why)\n\(daemon.log.suffix(3000))")
                break
            }
            workerKills += 1
        }
        demo.waitUntilExit()
        #expect(workerKills == 20 && daemonKills == 2)
        var settled = 0
        #expect(
            eventually(60) {
                guard let entry = try? daemon.pipeline("screens"), let lag = entry["lag"] as? Int else { return false }
                settled = lag == 0 ? settled + 1 : 0
                return settled >= 3
            })
        #expect(daemon.stop() == 0)

        try expectReplayDerivesWhatWasLive(daemon, config: file, atLeast: 500)
        #expect(daemon.log.contains("restored its plugins' state saved at _seq"), "\(daemon.log.suffix(2000))")
    }

    /// session-recorder keeps its index as state saved with its cursor: with its worker
    /// SIGKILLed at random moments while sessions stream, the index it exports when whend stops
    /// is the one `whenctl replay` builds from the same journal in one go, session by session.
    /// (Without the state restored, a restarted worker counts the records after its cursor into
    /// an index that lacks those before it.)
    @Test func theSessionIndexSurvivesWorkerKillsUnchanged() throws {
        let (daemon, _) = try builtinPipelineDaemon(
            "sessions-kill", keeping: "sessions", settings: ["pipeline_snapshot_interval = 0.2"])
        try daemon.start()
        let demo = try startDemo(daemon, ["--rate", "600", "--duration", "8", "--seed", "5"])
        var kills = 0
        while kills < 10 {
            usleep(UInt32.random(in: 200_000...500_000))
            if let why = killWorker(daemon, "sessions") {
                Issue.record("after \(kills) kills: \(why)\n\(daemon.log.suffix(3000))")
                break
            }
            kills += 1
        }
        demo.waitUntilExit()
        #expect(kills == 10)
        #expect(eventually(60) { (try? daemon.pipeline("sessions")?["lag"] as? Int) == 0 })
        #expect(daemon.stop() == 0)

        func sessions(_ path: String) -> [[String: AnyHashable]] {
            let data = FileManager.default.contents(atPath: path) ?? Data()
            let o = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
            return ((o?["sessions"] as? [[String: Any]]) ?? []).map { entry in
                entry.compactMapValues { $0 as? AnyHashable }
            }
        }
        let out = daemon.directory + "/replay"
        let replay = try runCommand(
            executable("whenctl"),
            [
                "replay", "--journal", daemon.stateDirectory + "/journal", "--plugin",
                executable("libsession-recorder.so"), "--state-out", out,
            ])
        #expect(replay.status == 0, "\(replay.error)")
        let live = sessions(daemon.stateDirectory + "/plugins/session-recorder/sessions.json")
        let replayed = sessions(out + "/session-recorder/sessions.json")
        #expect(live.count > 50, "\(live.count) sessions")
        #expect(Set(live) == Set(replayed), "\(Set(live).symmetricDifference(Set(replayed)).prefix(3))")
        #expect(daemon.log.contains("restored its plugins' state saved at _seq"))
    }

    /// A snapshot cut at any byte, or with any byte changed, is never taken for a state; the
    /// worker then falls back to the snapshot before it (and its cursor), and with neither
    /// usable, to `pipeline_snapshot_rebuild` records before its cursor, never to 0.
    @Test func aDamagedSnapshotIsDetectedAndTheOneBeforeItUsed() throws {
        let (daemon, file) = try builtinPipelineDaemon(
            "snapshot-dmg", keeping: "screens",
            settings: ["pipeline_snapshot_interval = 0.05", "pipeline_snapshot_rebuild = 7"])
        let snapshot = daemon.stateDirectory + "/pipelines/screens/snapshot"
        func snapshotCursor(_ path: String) -> UInt64? {
            (FileManager.default.contents(atPath: path)).flatMap { try? PipelineSnapshot.decode(Array($0)).cursor }
        }
        let journey = [
            #"{"type":"navigation","action":"root","screen":"CharacterList"}"#,
            #"{"type":"navigation","action":"push","screen":"CharacterDetail"}"#,
            #"{"type":"navigation","action":"pop"}"#,
        ]
        try daemon.start()
        try sendSession(daemon, app: "com.example.marvel", session: "a", journey)
        #expect(eventually { (snapshotCursor(snapshot) ?? 0) >= 3 })
        try sendSession(daemon, app: "com.example.marvel", session: "b", journey)
        #expect(eventually { (snapshotCursor(snapshot) ?? 0) > snapshotCursor(snapshot + ".previous") ?? .max })
        #expect(daemon.stop() == 0)
        let newest = try #require(FileManager.default.contents(atPath: snapshot).map { Array($0) })
        let previousCursor = try #require(snapshotCursor(snapshot + ".previous"))

        // Every cut, every flipped byte: refused.
        for end in 0..<newest.count {
            #expect(throws: PipelineSnapshot.Unusable.self) { try PipelineSnapshot.decode(Array(newest[0..<end])) }
        }
        for i in 0..<newest.count {
            var changed = newest
            changed[i] ^= 0x20
            #expect(throws: PipelineSnapshot.Unusable.self, "byte \(i)") { try PipelineSnapshot.decode(changed) }
        }

        // Through the worker: the newest cut short, the previous one used, and what is derived
        // after it is what one uninterrupted run derives.
        try Data(newest[0..<(newest.count / 2)]).write(to: URL(fileURLWithPath: snapshot))
        try daemon.start()
        #expect(daemon.waitForLog("the newest snapshot \(snapshot) cannot be used"), "\(daemon.log)")
        #expect(daemon.waitForLog("restored its plugins' state saved at _seq \(previousCursor) (previous snapshot)"))
        try sendSession(daemon, app: "com.example.marvel", session: "a", journey)
        #expect(eventually { (try? daemon.pipeline("screens")?["lag"] as? Int) == 0 })
        #expect(daemon.stop() == 0)
        try expectReplayDerivesWhatWasLive(daemon, config: file, atLeast: 0)
        let derivedBeforeTheRebuild = liveDerived(daemon).count

        // Both damaged: back pipeline_snapshot_rebuild records from the cursor, with empty state.
        let cursor = UInt64(
            try String(contentsOfFile: daemon.stateDirectory + "/pipelines/screens/cursor", encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines))!
        for path in [snapshot, snapshot + ".previous"] {
            var bytes = try #require(FileManager.default.contents(atPath: path).map { Array($0) })
            bytes[bytes.count / 3] ^= 0x01
            try Data(bytes).write(to: URL(fileURLWithPath: path))
        }
        try daemon.start()
        #expect(
            daemon.waitForLog(
                "no saved state can be used; its plugins rebuild theirs from the journal, from _seq \(cursor - 7 + 1) (pipeline_snapshot_rebuild = 7) to its cursor \(cursor)"
            ), "\(daemon.log)")
        #expect(daemon.stop() == 0)
        // Nothing derived twice by the rebuild.
        #expect(liveDerived(daemon).count == derivedBeforeTheRebuild)
    }
}
