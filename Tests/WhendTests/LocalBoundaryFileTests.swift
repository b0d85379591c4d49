import Foundation
import Testing
import WhendWire

extension LocalBoundaryTests {
    /// Directories of whend's own under the state directory that others may write (a chmod, an
    /// old umask) are made private again at start; a symbolic link where whend creates a file
    /// (here the analytics destination) is not followed: whend, perhaps root, never writes
    /// through it, and the file it points at is left as it was.
    @Test func whendsOwnDirectoriesAreMadePrivateAndItsFilesAreNotOpenedThroughALink() throws {
        let state = scratchDirectory("fs-link")
        let precious = scratchDirectory("fs-precious") + "/precious"
        try "untouched\n".write(toFile: precious, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(
            atPath: state + "/plugins/analytics", withIntermediateDirectories: true)
        chmod(state, 0o750)
        chmod(state + "/plugins", 0o777)
        symlink(precious, state + "/plugins/analytics/events.ndjson")
        let daemon = TestDaemon.live("fs-link", arguments: ["--builtin-pipelines", "true"], stateDirectory: state)
        try daemon.start()
        defer { daemon.stop() }
        var st = stat()
        #expect(stat(state + "/plugins", &st) == 0 && st.st_mode & 0o7777 == 0o755, "\(String(st.st_mode, radix: 8))")
        try sendSession(daemon, app: "com.example.link", session: "l-1", [#"{"type":"when","name":"userLinks"}"#])
        #expect(
            eventually(20) {
                ((try? String(contentsOfFile: daemon.logPath, encoding: .utf8)) ?? "").contains(
                    "Too many levels of symbolic links")
            }, "\((try? String(contentsOfFile: daemon.logPath, encoding: .utf8)) ?? "")")
        #expect((try? String(contentsOfFile: precious, encoding: .utf8)) == "untouched\n")
    }

    /// A state directory whose filesystem fills up under whend and its built-in pipelines: whend
    /// keeps running, answers what it cannot store `unavailable`, keeps every event it acked,
    /// and once space returns its pipelines catch up and derive what they missed.
    @Test(.enabled(if: canMountTmpfs(), "needs to mount a small tmpfs (root in a sandbox that allows it)"))
    func aFullStateDirectoryLosesNothingAckedAndPipelinesCatchUp() throws {
        let stateDirectory = scratchDirectory("fs-full")
        #expect(mount(stateDirectory, size: "512k"))
        defer { unmount(stateDirectory) }
        let daemon = TestDaemon(
            "fs-full", arguments: ["--builtin-pipelines", "true", "--pipeline-snapshot-interval", "0.2"],
            stateDirectory: stateDirectory)
        try daemon.start()
        defer { daemon.stop() }
        func noisy(_ i: Int) -> String {
            let noise = incompressible(300)
            return #"{"type":"when","name":"n","id":"n\#(i)","params":{"noise":"\#(noise)"}}"#
        }
        let hello = #"{"hello":{"protocol":1,"app":"com.example.full","session":"f-1","acks":true}}"#
        #expect(
            try exchange(daemon.socketPath, [hello, #"{"type":"navigation","action":"root","screen":"A"}"#]).acks.last
                == 1)
        let filler = fillFileSystem(under: stateDirectory)
        let answers = try exchange(daemon.socketPath, [hello] + (1...40).map(noisy))
        let refused = Set(answers.errors.filter { $0.code == "unavailable" }.compactMap(\.event))
        #expect(!refused.isEmpty, "the filesystem never filled")
        #expect(answers.acks.last == 40)
        usleep(500_000)  // the pipelines meet the full filesystem (cursors, snapshots, spool)
        unlink(filler)
        #expect(
            try exchange(daemon.socketPath, [hello, #"{"type":"error","message":"boom","fatal":true}"#]).errors.isEmpty)
        // Under the pipelines, the full disk tore a segment (whend rewrote it) and refused what
        // they derived: every one catches up even so, a worker started again included.
        let caughtUp = try daemon.whenctl(["plugins", "--wait", "--timeout", "20"])
        #expect(
            caughtUp.status == 0,
            "\(caughtUp.error) \((try? daemon.whenctl(["plugins"]).output) ?? "") \(daemon.log.suffix(3000))")
        #expect(daemon.records().contains { $0["type"] as? String == "screen" && $0["name"] as? String == "A" })
        let reports = stateDirectory + "/plugins/crash-reports/reports"
        #expect(eventually { ((try? FileManager.default.contentsOfDirectory(atPath: reports)) ?? []).count == 1 })
        #expect(daemon.stop() == 0)
        let stored = Set(daemon.records().compactMap { $0["id"] as? String })
        for line in 1...40 where !refused.contains(line) {
            #expect(stored.contains("n\(line)"), "n\(line) was acked but is not stored")
        }
        let verify = try whenctl(["verify", "--state-dir", stateDirectory])
        #expect(verify.status == 0, "\(verify.output)")
    }
}
