import Foundation
import PropertyBased
import SeededRandom
import Testing
import WhendDaemon
import WhendJournal
import WhendPipelines

/// What the stateful built-in pipelines left behind, live or replayed: screen-tracking's derived
/// records (the plugin's part and cause, in journal order), crash-reports' reports (by file
/// name, byte for byte) and session-recorder's index (session by session).
struct PipelineOutput {
    var derived: [String] = []
    var reports: [String: [UInt8]] = [:]
    var sessions: Set<[String: AnyHashable]> = []

    static func reports(in directory: String) -> [String: [UInt8]] {
        var out: [String: [UInt8]] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        where name.hasSuffix(".json") {
            out[name] = FileManager.default.contents(atPath: directory + "/" + name).map { Array($0) } ?? []
        }
        return out
    }

    static func sessions(in path: String) -> Set<[String: AnyHashable]> {
        let data = FileManager.default.contents(atPath: path) ?? Data()
        let o = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        return Set(((o?["sessions"] as? [[String: Any]]) ?? []).map { $0.compactMapValues { $0 as? AnyHashable } })
    }

    /// What `daemon` (stopped) stored and wrote.
    static func live(_ daemon: TestDaemon) -> PipelineOutput {
        PipelineOutput(
            derived: liveDerived(daemon).map { "\($0.cause) \($0.text)" },
            reports: reports(in: daemon.stateDirectory + "/plugins/crash-reports/reports"),
            sessions: sessions(in: daemon.stateDirectory + "/plugins/session-recorder/sessions.json"))
    }

    /// What `whenctl replay` of each pipeline derives and writes from `daemon`'s journal in one go
    /// (the three at once).
    static func replayed(
        _ daemon: TestDaemon, config: String, pipelines: [String] = ["screens", "crashes", "sessions"]
    ) throws -> PipelineOutput {
        let directory = scratchDirectory("replays")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var running: [Process] = []
        for pipeline in pipelines {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: executable("whenctl"))
            p.arguments = [
                "replay", "--state-dir", daemon.stateDirectory, "--pipeline", pipeline, "--config", config,
                "--state-out", directory + "/" + pipeline,
            ]
            // Files, not pipes: a replay logs a line per crash report, more than a pipe holds.
            for name in ["out", "err"] {
                _ = FileManager.default.createFile(atPath: directory + "/\(pipeline).\(name)", contents: nil)
            }
            p.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/\(pipeline).out"))
            p.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/\(pipeline).err"))
            try p.run()
            running.append(p)
        }
        func text(_ name: String) -> String {
            (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? ""
        }
        for (pipeline, p) in zip(pipelines, running) {
            p.waitUntilExit()
            guard p.terminationStatus == 0 else {
                throw TestFailure(description: "replay \(pipeline): \(text(pipeline + ".err"))")
            }
        }
        return PipelineOutput(
            derived: text("screens.out").split(separator: "\n").compactMap { derivedPart(String($0)) }.map {
                "\($0.cause) \($0.text)"
            },
            reports: reports(in: directory + "/crashes/crash-reports/reports"),
            sessions: sessions(in: directory + "/sessions/session-recorder/sessions.json"))
    }

    /// Each way `self` (live) differs from `replay`, said briefly; empty if none.
    func differences(from replay: PipelineOutput) -> [String] {
        var found: [String] = []
        if derived != replay.derived {
            let onlyLive = Set(derived).subtracting(replay.derived).count
            let onlyReplay = Set(replay.derived).subtracting(derived).count
            let first = zip(derived, replay.derived).enumerated().first { $0.element.0 != $0.element.1 }
            found.append(
                "screens: live derived \(derived.count), replay \(replay.derived.count); \(onlyLive) only live, \(onlyReplay) only in the replay"
                    + (first.map { "; first difference at \($0.offset): live \($0.element.0) / replay \($0.element.1)" }
                        ?? ""))
        }
        if reports != replay.reports {
            let differing = Set(reports.keys).union(replay.reports.keys).filter { reports[$0] != replay.reports[$0] }
            found.append(
                "crashes: \(reports.count) reports live, \(replay.reports.count) in the replay, \(differing.count) differ (e.g. \(differing.sorted().prefix(3)))"
            )
        }
        if sessions != replay.sessions {
            found.append(
                "sessions: \(sessions.count) live, \(replay.sessions.count) in the replay, \(sessions.symmetricDifference(replay.sessions).count) differ"
            )
        }
        return found
    }
}

/// The pid of `pipeline`'s worker once one other than `previous` runs; 0 if none within `seconds`.
func workerPid(_ daemon: TestDaemon, _ pipeline: String, other previous: Int = 0, seconds: Double = 10)
    -> Int
{
    var pid = 0
    _ = eventually(seconds) {
        let entry = try? daemon.pipeline(pipeline)
        pid = entry?["state"] as? String == "running" ? entry?["pid"] as? Int ?? 0 : 0
        return pid > 0 && pid != previous
    }
    return pid != previous ? pid : 0
}

/// Waits until every pipeline of `daemon` has handled every record, three polls in a row.
func settle(_ daemon: TestDaemon, seconds: Double = 60) -> Bool {
    var settled = 0
    return eventually(seconds) {
        guard let pipelines = (try? daemon.status())?["pipelines"] as? [[String: Any]], !pipelines.isEmpty else {
            return false
        }
        let idle = pipelines.allSatisfy { $0["lag"] as? Int == 0 && $0["state"] as? String == "running" }
        settled = idle ? settled + 1 : 0
        return settled >= 3
    }
}

func writeConfiguration(_ directory: String, _ settings: String) throws -> String {
    let file = directory + "/whend.conf"
    try settings.write(toFile: file, atomically: true, encoding: .utf8)
    return file
}

/// App sessions that go on across a schedule's kills, sent a chunk at a time (each event
/// acknowledged): navigation and lifecycle that keep screen-tracking's state busy (rule breaks
/// included, which it reports), app-sent screens, other events, errors, fatal or not.
struct Journeys {
    var random: SplitMix64
    var stacks: [[String]] = Array(repeating: [], count: 8)
    var sent = 0
    static let screens = ["Home", "CharacterList", "CharacterDetail", "Comics", "Settings", "Email", "Practice"]

    /// Half the journeys' session ids end in an unpaired surrogate's escape, as JavaScript's
    /// and Python's encoders write one: screen-tracking copies them into what it derives, and
    /// Foundation's parser refuses such records (whend once read the journal with it at start,
    /// skipped them, and appended what was derived after the cursor again: 1,096 records
    /// more live than in a replay, found from outside).
    let unpaired: String

    init(seed: UInt64) {
        random = SplitMix64(state: seed)
        unpaired = seed % 2 == 0 ? "" : #"\udc00"#
    }

    mutating func pick<T>(_ from: [T]) -> T { from[Int(random.next() % UInt64(from.count))] }

    /// About 20 events for each session.
    mutating func sendChunk(to daemon: TestDaemon) throws {
        for session in stacks.indices {
            var events: [String] = []
            func lifecycle(_ screen: String, _ status: String) {
                events.append(#"{"type":"lifecycle","screen":"\#(screen)","status":"\#(status)"}"#)
            }
            if stacks[session].isEmpty {
                stacks[session] = ["Home"]
                events.append(#"{"type":"navigation","action":"root","screen":"Home"}"#)
                lifecycle("Home", "willAppear")
                lifecycle("Home", "didAppear")
            }
            for _ in 0..<(15 + Int(random.next() % 10)) {
                let top = stacks[session].last ?? "Home"
                switch random.next() % 12 {
                case 0...3:
                    let screen = pick(Self.screens)
                    events.append(#"{"type":"navigation","action":"push","screen":"\#(screen)"}"#)
                    lifecycle(top, "willDisappear")
                    lifecycle(screen, "willAppear")
                    if random.next() % 8 != 0 { lifecycle(screen, "didAppear") }
                    lifecycle(top, "didDisappear")
                    stacks[session].append(screen)
                case 4, 5:
                    guard stacks[session].count > 1 else { continue }
                    stacks[session].removeLast()
                    let under = stacks[session].last ?? "Home"
                    events.append(#"{"type":"navigation","action":"pop"}"#)
                    lifecycle(top, "willDisappear")
                    lifecycle(under, "willAppear")
                    lifecycle(under, "didAppear")
                    lifecycle(top, "didDisappear")
                case 6:
                    lifecycle(pick(Self.screens), pick(["willAppear", "didAppear", "willDisappear", "didDisappear"]))
                case 7: events.append(#"{"type":"screen","name":"\#(pick(Self.screens))"}"#)
                case 8, 9: events.append(#"{"type":"when","name":"tap","params":{"n":\#(random.next() % 100)}}"#)
                default:
                    let fatal = random.next() % 3 == 0
                    events.append(
                        #"{"type":"error","fatal":\#(fatal),"message":"failure \#(random.next() % 1000)","screen":"\#(top)"}"#
                    )
                }
            }
            let app = ["com.example.marvel", "com.example.mail", "uk.nhs.gp-onboarding"][session % 3]
            try sendSession(daemon, app: app, session: "s\(session)" + unpaired, events)
            sent += events.count
        }
    }
}

/// One generated schedule of kills: the seed gives the snapshot interval, the journeys and
/// each step, so that a failing seed names the same schedule again (its moments are real
/// time, so it reproduces the phases, not the exact instants).
struct KillSchedule: CustomStringConvertible {
    enum Step: CustomStringConvertible {
        /// The pipeline's worker kills itself at this point of its life (`WHEND_TEST_KILL_POINTS`);
        /// for a point passed only at start, its current worker is killed first.
        case point(pipeline: String, point: String)
        /// The pipeline's next worker is killed this long after it starts.
        case young(pipeline: String, after: Double)
        /// The pipeline's worker, whatever its age, after this long.
        case worker(pipeline: String, after: Double)
        /// whend itself, after this long, then started again.
        case daemon(after: Double)

        var description: String {
            switch self {
            case .point(let pipeline, let point): "\(pipeline) at \(point)"
            case .young(let pipeline, let after): "\(pipeline) \(String(format: "%.2f", after)) s after its start"
            case .worker(let pipeline, let after): "\(pipeline) after \(String(format: "%.2f", after)) s"
            case .daemon(let after): "whend after \(String(format: "%.2f", after)) s"
            }
        }
    }

    var seed: UInt64
    var snapshotInterval: Double
    var journeySeed: UInt64
    var steps: [Step]

    static let pipelines = ["screens", "crashes", "sessions"]
    static let points = ["started", "restoring", "writing-snapshot", "snapshot-saved", "cursor-saved"]

    init(seed: UInt64) {
        self.seed = seed
        var random = SplitMix64(state: seed)
        snapshotInterval = [0.05, 0.2, 1, 5][Int(random.next() % 4)]
        journeySeed = random.next()
        steps = (0..<(3 + Int(random.next() % 4))).map { _ in
            let pipeline = Self.pipelines[Int(random.next() % 3)]
            let delay = Double(random.next() % 1000) / 1000
            switch random.next() % 10 {
            case 0...4: return .point(pipeline: pipeline, point: Self.points[Int(random.next() % 5)])
            case 5, 6: return .young(pipeline: pipeline, after: delay)
            case 7, 8: return .worker(pipeline: pipeline, after: delay / 4)
            default: return .daemon(after: delay / 4)
            }
        }
    }

    var description: String {
        "seed \(seed): pipeline_snapshot_interval \(snapshotInterval), kills: "
            + steps.map(\.description).joined(separator: "; ")
    }

    /// Runs the schedule against a fresh whend while journeys stream in; the differences between
    /// what the pipelines left and what `whenctl replay` makes of the same journal (none is the
    /// property), and what the schedule did.
    func run() throws -> (differences: [String], kills: Int) {
        let config = try writeConfiguration(
            scratchDirectory("kill-conf"),
            """
            pipeline_snapshot_interval = \(snapshotInterval)
            pipeline.analytics =
            """)
        let daemon = TestDaemon.live(
            "kill-\(seed % 10000)", arguments: ["--builtin-pipelines", "true", "--config", config])
        let points = daemon.directory + "/kill-points"
        try FileManager.default.createDirectory(atPath: points, withIntermediateDirectories: true)
        daemon.environment = ["WHEND_TEST_KILL_POINTS": points]
        try daemon.start()
        defer { daemon.crash() }
        var journeys = Journeys(seed: journeySeed)
        var kills = 0
        for step in steps {
            // Sessions go on across the kills: what a worker restores is never empty.
            try journeys.sendChunk(to: daemon)
            switch step {
            case .point(let pipeline, let point):
                let file = points + "/" + pipeline + "." + point
                guard FileManager.default.createFile(atPath: file, contents: nil) else { continue }
                if point == "started" || point == "restoring" {
                    let pid = workerPid(daemon, pipeline)
                    if pid > 0 { kill(pid_t(pid), SIGKILL) }
                }
                // Points passed only now and then (a snapshot) may not come: then it is left.
                if eventually(2, { !FileManager.default.fileExists(atPath: file) }) { kills += 1 }
                unlink(file)
            case .young(let pipeline, let after):
                let old = workerPid(daemon, pipeline)
                if old > 0 { kill(pid_t(old), SIGKILL) }
                let pid = workerPid(daemon, pipeline, other: old)
                usleep(UInt32(after * 1e6))
                if pid > 0, kill(pid_t(pid), SIGKILL) == 0 { kills += 1 }
            case .worker(let pipeline, let after):
                usleep(UInt32(after * 1e6))
                let pid = workerPid(daemon, pipeline)
                if pid > 0, kill(pid_t(pid), SIGKILL) == 0 { kills += 1 }
            case .daemon(let after):
                usleep(UInt32(after * 1e6))
                daemon.crash()
                kills += 1
                try daemon.start()
            }
        }
        try journeys.sendChunk(to: daemon)
        guard settle(daemon) else {
            throw TestFailure(description: "\(self): the pipelines did not catch up: \(daemon.log.suffix(3000))")
        }
        guard daemon.stop() == 0 else { throw TestFailure(description: "\(self): whend did not stop cleanly") }
        let live = PipelineOutput.live(daemon)
        guard live.derived.count > 50 else {
            throw TestFailure(description: "\(self): only \(live.derived.count) derived records")
        }
        let differences = live.differences(from: try PipelineOutput.replayed(daemon, config: config))
        if differences.isEmpty {
            try? FileManager.default.removeItem(atPath: daemon.directory)
            try? FileManager.default.removeItem(atPath: (config as NSString).deletingLastPathComponent)
        }
        return (differences, kills)
    }
}
