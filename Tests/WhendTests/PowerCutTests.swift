import Foundation
import Testing
import WhendJournal
import WhendWire

/// A file system that keeps only what was synced (Tests/Fixtures/powercut_fs.py, over FUSE):
/// written data lives in the harness's memory until `fsync`/`fdatasync`, and creates, renames
/// and unlinks until their directory is synced. `cut()` is a power cut: the harness dies, the
/// mount goes, and `mount()` again shows exactly what was durable.
final class PowerCutFileSystem {
    let directory: String
    let backing: String
    let mountPoint: String
    private var harness: Process?

    init(_ name: String) {
        directory = scratchDirectory(name)
        backing = directory + "/durable"
        mountPoint = directory + "/mnt"
        try? FileManager.default.createDirectory(atPath: backing, withIntermediateDirectories: true)
        try? FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
    }

    func mount() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        p.arguments = [DocumentationTests.root + "/Tests/Fixtures/powercut_fs.py", backing, mountPoint]
        let log = FileHandle(forWritingAtPath: directory + "/harness.log") ?? FileHandle.nullDevice
        if FileManager.default.fileExists(atPath: directory + "/harness.log") { log.seekToEndOfFile() }
        p.standardOutput = log
        p.standardError = log
        try p.run()
        harness = p
        guard eventually(10, { isMounted }) else {
            let output = (try? String(contentsOfFile: directory + "/harness.log", encoding: .utf8)) ?? ""
            throw TestFailure(
                description: "the power-cut file system did not mount (needs python3-fusepy and /dev/fuse): \(output)")
        }
    }

    var isMounted: Bool {
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        return mounts.split(separator: "\n").contains {
            $0.split(separator: " ").dropFirst().first == Substring(mountPoint)
        }
    }

    /// From now on, until called with false, every file sync fails with EIO as a failed
    /// writeback does on Linux (see the harness).
    func failSyncs(_ failing: Bool) {
        let flag = backing + "/fail-syncs"
        if failing { _ = FileManager.default.createFile(atPath: flag, contents: nil) } else { unlink(flag) }
    }

    /// The power goes: what was not synced is lost. Every process using the mount must be dead.
    func cut() {
        if let p = harness {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        harness = nil
        _ = try? runCommand("/usr/bin/umount", ["-l", mountPoint])
    }

    deinit { cut() }
}

extension TestDaemon {
    /// whend and its pipeline workers SIGKILLed at once, as a power cut stops them.
    func crashWithWorkers() {
        guard let pid = process?.processIdentifier else { return }
        var children: [pid_t] = []
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        for task in tasks {
            let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/children", encoding: .utf8)) ?? ""
            children += text.split(separator: " ").compactMap {
                pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines))
            }
        }
        for child in children { kill(child, SIGKILL) }
        crash()
        // The workers are gone before the file system is: none writes after the cut.
        _ = eventually(5) { children.allSatisfy { kill($0, 0) != 0 } }
    }
}

@Suite(.serialized) struct PowerCutTests {
    struct Outcome {
        var ackedLost = 0
        /// Acked by the last cut.
        var acked = 0
    }

    /// Rounds of: clients stream with acks (resending what is unacked after a reconnect), whend
    /// and its workers are SIGKILLed at a random moment, the unsynced writes are dropped, and
    /// whend starts again over what survived. After each cut, checks what the journal holds.
    func powerCutRounds(
        _ name: String, rounds: Int, durability: String, pipelines: Bool,
        afterCut: (TestDaemon, _ round: Int, _ lastSeq: UInt64) throws -> Void = { _, _, _ in }
    ) throws -> (Outcome, TestDaemon, [ResendingClient], PowerCutFileSystem) {
        let fs = PowerCutFileSystem(name)
        try fs.mount()
        let daemon = try fs.daemon(
            name,
            settings: """
                durability = \(durability)
                segment_max_bytes = 65536
                pipeline_snapshot_interval = 0.2
                """, arguments: ["--builtin-pipelines", pipelines ? "true" : "false"])
        let clients = (0..<3).map { ResendingClient(name: "c\($0)", socketPath: daemon.socketPath) }
        try daemon.start()
        for client in clients { client.start() }
        var outcome = Outcome()
        // What earlier cuts left is durable and never rewritten: each round reads only the
        // records after it (a whole read per round made long soaks quadratic).
        var seen: [String: Int] = [:]
        var checkedThrough: UInt64 = 0
        var ackedChecked = clients.map { _ in 0 }
        for round in 1...rounds {
            usleep(UInt32.random(in: 200_000...700_000))
            daemon.crashWithWorkers()
            // No ack can come after the kill: these are all the clients were promised.
            let acked = clients.map(\.ackedCount)
            fs.cut()
            try fs.mount()
            JournalReader(directory: daemon.journal).read(fromSeq: checkedThrough + 1) { record, _ in
                checkedThrough = record.seq ?? checkedThrough
                if let o = try? JSONSerialization.jsonObject(with: Data(buffer: record.line)) as? [String: Any],
                    let id = o["id"] as? String
                {
                    seen[id, default: 0] += 1
                    if seen[id] == 2, clients.contains(where: { id.hasPrefix($0.name + "-") }) {
                        Issue.record("round \(round): \(id) stored twice")
                    }
                }
                return true
            } onProblem: {
                Issue.record("round \(round): journal problem: \($0)")
            }
            // Acked since the last cut and not stored is lost (what earlier cuts found stays).
            for (i, (client, count)) in zip(clients, acked).enumerated() where count > ackedChecked[i] {
                for n in ackedChecked[i]..<count where seen["\(client.name)-\(n)"] == nil { outcome.ackedLost += 1 }
                ackedChecked[i] = count
            }
            outcome.acked = acked.reduce(0, +)
            try afterCut(daemon, round, checkedThrough)
            try daemon.start()
            reportRound("power cut", round, of: rounds, "\(outcome.acked) events acked, \(outcome.ackedLost) lost")
        }
        for client in clients { client.finish() }
        for client in clients {
            #expect(client.finished.wait(timeout: .now() + 120) == .success, "client \(client.name) did not finish")
        }
        return (outcome, daemon, clients, fs)
    }

    /// With `durability = fsync`, a power cut loses no acked event: after every cut the journal
    /// holds each acked event once, `_seq` runs 1…N, `whenctl verify` passes; the pipelines'
    /// cursors are never torn and never back to 0; no snapshot is found damaged; and what
    /// screen-tracking derived over all the cuts is what one uninterrupted replay derives.
    @Test func aPowerCutLosesNoAckedEventUnderFsync() throws {
        let rounds = Int(ProcessInfo.processInfo.environment["WHEND_POWERCUT_ROUNDS"] ?? "") ?? 10
        var lastCursors: [String: UInt64] = [:]
        var demo: Process?
        let (outcome, daemon, clients, fs) = try powerCutRounds(
            "pc-fsync", rounds: rounds, durability: "fsync", pipelines: true
        ) {
            daemon, round, lastSeq in
            // verify checks every segment: zstd, JSON per line, _seq from 1 without a gap.
            let verify = try runCommand(
                executable("whenctl"), ["verify", "--json", "--state-dir", daemon.stateDirectory])
            #expect(verify.status == 0, "round \(round): \(verify.output) \(verify.error)")
            #expect(
                verify.output.contains("\"first_seq\":1,\"last_seq\":\(lastSeq),")
                    && verify.output.contains("\"records\":\(lastSeq),"), "round \(round): \(verify.output)")
            let pipelines = daemon.stateDirectory + "/pipelines"
            for name in (try? FileManager.default.contentsOfDirectory(atPath: pipelines)) ?? [] {
                let path = pipelines + "/\(name)/cursor"
                guard let bytes = FileManager.default.contents(atPath: path) else { continue }
                // A number and a newline: anything else is a torn cursor.
                let text = String(decoding: bytes, as: UTF8.self)
                let parsed = text.hasSuffix("\n") ? UInt64(text.dropLast()) : nil
                #expect(parsed != nil, "round \(round): \(path) holds \(bytes.count) bytes: \(text.debugDescription)")
                guard let cursor = parsed else { continue }
                #expect(
                    cursor <= lastSeq, "round \(round): \(name)'s cursor \(cursor) is past the journal")
                // It may go back to the newest snapshot's (the records after it are handled
                // again, from the state saved with it), never to the start.
                #expect(cursor > 0 || lastCursors[name, default: 0] == 0, "round \(round): \(name)'s cursor went to 0")
                lastCursors[name] = max(cursor, lastCursors[name, default: 0])
            }
            if round == 1 {
                // Sessions with screens, for screen-tracking to derive from (not acked: what it
                // derives from what was stored is checked, not what was sent).
                demo = try startDemo(daemon, ["--rate", "300", "--duration", "600", "--seed", "5"])
            }
        }
        if let demo {
            kill(demo.processIdentifier, SIGKILL)
            demo.waitUntilExit()
        }
        print(
            "power cuts, durability fsync: \(rounds) cuts, \(outcome.acked) acked, \(outcome.ackedLost) lost"
        )
        #expect(outcome.ackedLost == 0, "\(outcome.ackedLost) acked events lost")
        #expect(outcome.acked > 500 * rounds / 10, "the clients got few acks: \(outcome.acked)")
        #expect(!daemon.log.contains("cannot be used"), "\(daemon.log.suffix(3000))")
        // Caught up, then stopped: every event once, derived records as one run derives them.
        #expect(eventually(60) { (try? daemon.pipeline("screens"))?["lag"] as? Int == 0 })
        #expect(daemon.stop() == 0)
        var seen: [String: Int] = [:]
        for r in daemon.records() { if let id = r["id"] as? String, id.hasPrefix("c") { seen[id, default: 0] += 1 } }
        let expected = clients.flatMap { c in (0..<c.generatedCount).map { "\(c.name)-\($0)" } }
        let wrong = expected.filter { seen[$0] != 1 }
        #expect(wrong.count == 0, "\(wrong.count) events not stored exactly once, e.g. \(wrong.prefix(5))")
        try expectReplayDerivesWhatWasLive(daemon, atLeast: 50)
        fs.cut()
    }

    /// A sync that fails (EIO, as Linux reports a failed writeback: the pages it could not write
    /// stay readable, and a later sync reports success without writing them) acknowledges
    /// nothing it covered, and whend says so; once syncs work again, what the clients send
    /// again is stored, and a power cut after that loses no acked event, stores none twice,
    /// and leaves `_seq` without a gap. Small segments, so that seals are among the syncs.
    @Test func aFailedSyncAcksNothingItCoveredAndLosesNothingAcked() throws {
        let fs = PowerCutFileSystem("pc-syncfail")
        try fs.mount()
        let daemon = try fs.daemon("pc-syncfail", settings: "durability = fsync\nsegment_max_bytes = 4096\n")
        try daemon.start()
        func event(_ n: Int) -> String {
            #"{"type":"when","name":"step","id":"e-\#(n)","params":{"n":\#(n),"pad":"\#(String(repeating: "p", count: n % 90))"}}"#
        }
        /// Sends events `range` in chunks of 20 on one connection, each answered before the
        /// next (so that the groups are many and small); returns how many were stored by the
        /// final ack (an ack covers refused lines too: those are the errors) and the errors' codes.
        func send(_ range: Range<Int>) throws -> (acked: Int, errors: [String]) {
            let client = try AckedConnection(daemon.socketPath)
            var sent = 0
            for start in stride(from: range.lowerBound, to: range.upperBound, by: 20) {
                let chunk = (start..<min(start + 20, range.upperBound)).map { event($0) + "\n" }.joined()
                try client.connection.send(chunk)
                sent += min(20, range.upperBound - start)
                try client.read(until: sent)
                // Closed (or silent past the deadline): what it acknowledged is all there is.
                if client.lastAck < sent { break }
            }
            return (client.stored, client.errors)
        }

        #expect(try send(0..<200).acked == 200)
        fs.failSyncs(true)
        let during = try send(200..<260)
        #expect(during.acked == 0, "\(during.acked) events acked while every sync failed")
        #expect(during.errors.count == 60 && during.errors.allSatisfy { $0 == "unavailable" }, "\(during.errors)")
        fs.failSyncs(false)
        // The events that were refused, sent again, then new ones: all acked.
        #expect(try send(200..<400).acked == 200)
        #expect(daemon.log.contains("fdatasync") && daemon.log.contains("not acknowledged"), "\(daemon.log)")

        try fs.cutPower(under: daemon)
        let stored = storedRecords(daemon.journal)
        let seen = Dictionary(stored.compactMap(\.id).map { ($0, 1) }, uniquingKeysWith: +)
        let seqs = stored.map { $0.seq ?? 0 }
        let wrong = (0..<400).map { "e-\($0)" }.filter { seen[$0] != 1 }
        #expect(wrong.isEmpty, "\(wrong.count) acked events not stored exactly once, e.g. \(wrong.prefix(5))")
        #expect(seqs == Array(1...UInt64(seqs.count)), "_seq has a gap or repeats")
        let verify = try runCommand(executable("whenctl"), ["verify", "--json", "--state-dir", daemon.stateDirectory])
        #expect(verify.status == 0, "\(verify.output) \(verify.error)")
        fs.cut()
    }

    /// The same cuts with `durability = write` lose acked events, as `write` says they may: the
    /// harness does drop what was not synced (else the test above could not fail).
    @Test func aPowerCutLosesAckedEventsUnderWrite() throws {
        let (outcome, daemon, _, fs) = try powerCutRounds("pc-write", rounds: 4, durability: "write", pipelines: false)
        #expect(daemon.stop() == 0)
        fs.cut()
        print(
            "power cuts, durability write: 4 cuts, \(outcome.acked) acked, \(outcome.ackedLost) lost")
        #expect(outcome.ackedLost > 0, "no acked event was lost of \(outcome.acked)")
    }
}
