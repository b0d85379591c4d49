import Foundation
import Testing
import WhendWire

/// The README's five-minute tour, run as written: its commands are taken from README.md, so the
/// two cannot drift, and what each prints is checked against the output the README shows (how
/// the README is read: `RunnableDocument`). `make run` is the daemon: the test starts the whend
/// it built, as `make run` does after building, and `<!-- tour: the daemon stops here -->` is
/// where the reader presses Ctrl-C.
@Suite(.serialized) struct TourTests {
    /// Runs the tour with `runtimeDirectory` as $XDG_RUNTIME_DIR (nil: without one) in a fresh
    /// home, and checks each step; returns the home.
    @discardableResult
    func runTour(runtimeDirectory: Bool) throws -> String {
        let tour = try RunnableDocument("README.md", section: "## A five-minute tour", markerPrefix: "tour")
        #expect(tour.steps.contains { $0.command == "make run" })
        #expect(tour.steps.contains { $0.marker == "the daemon stops here" })
        #expect(tour.steps.count > 15, "the tour has only \(tour.steps.count) steps")

        let dir = scratchDirectory("tour")
        let home = dir + "/home"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        // No /etc/whend/whend.conf either, as on a machine that never installed the package.
        let config = dir + "/empty.conf"
        #expect(FileManager.default.createFile(atPath: config, contents: Data()))
        var environment = RunnableDocument.freshEnvironment(home: home)
        environment["WHEND_CONFIG"] = config
        if runtimeDirectory {
            let run = dir + "/run"
            try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: true)
            chmod(run, 0o700)
            environment["XDG_RUNTIME_DIR"] = run
        }
        let whend = executable("whend")
        try tour.run(in: repositoryRoot, environment: environment, timeout: 180) { step in
            if step.command == "make run" {
                return """
                    '\(whend)' > '\(dir)/whend.log' 2>&1 &
                    daemon=$!
                    for _ in $(seq 300); do grep -q 'listening on' '\(dir)/whend.log' && break; sleep 0.1; done
                    cat '\(dir)/whend.log'
                    """
            }
            return step.marker == "the daemon stops here" ? "kill -INT \"$daemon\"; wait \"$daemon\"" : nil
        }
        return home
    }

    /// The tour, then a tracking plan inferred from the journal it left: the plan passes a check
    /// over that same journal, and names what the tour sent.
    @Test func theTourRunsAsWrittenWithAnXDGRuntimeDirectory() throws {
        let home = try runTour(runtimeDirectory: true)
        let state = ["--state-dir", home + "/.local/state/whend"]
        let plan = home + "/plan.json"
        let infer = try whenctl(["plan", "infer", "--write", plan] + state)
        #expect(infer.status == 0, "\(infer.error)")
        // The statistics: each event with its count, each param with how often and which types.
        #expect(infer.error.contains("userTapsCharacter: "), "\(infer.error)")
        #expect(infer.error.contains("  on: present 100 %; boolean 100 %"), "\(infer.error)")
        let text = try String(contentsOfFile: plan, encoding: .utf8)
        #expect(text.contains("\"userTapsCharacter\"") && text.contains("\"Characters\""), "\(text)")
        let check = try whenctl(["plan", "check", plan] + state)
        #expect(check.status == 0, "\(check.output)\(check.error)")
        #expect(check.output.contains("would be flagged") && check.output.contains(", 0 would be flagged"))
        // What the pipelines derived is neither planned nor checked: apps never send it.
        let records = try whenctl(["cat"] + state).output.split(separator: "\n")
        let derived = records.filter { $0.contains(#""_origin":"#) }.count
        #expect(derived > 0)
        #expect(check.output.contains("\(records.count - derived) records checked, 0"), "\(check.output)")
        // The check is not vacuous: a plan without the tour's events flags them.
        try #"{"events":{}}"#.write(toFile: plan, atomically: true, encoding: .utf8)
        let strict = try whenctl(["plan", "check", "--summary", plan] + state)
        #expect(strict.status == 1 && strict.output.contains("event: "), "\(strict.output)")
    }

    /// As root in a container or over ssh: no $XDG_RUNTIME_DIR, so the sockets are in
    /// /tmp/whend-$UID, shared by every whend of that user on the machine.
    @Test func theTourRunsAsWrittenWithoutAnXDGRuntimeDirectory() throws {
        let socket = "/tmp/whend-\(getuid())/events.sock"
        if (try? BlockingSocket(path: socket)) != nil {
            print("skipped: a whend of this user already listens on \(socket)")
            return
        }
        try runTour(runtimeDirectory: false)
    }

    @Test func theMatchingCanFail() {
        #expect(RunnableDocument.lineMatches("a … c", "a b c") && !RunnableDocument.lineMatches("a … c", "a b d"))
        #expect(RunnableDocument.outputMatches(["x", "…", "z"], ["x", "y", "y", "z"]))
        #expect(!RunnableDocument.outputMatches(["x", "z"], ["x", "y", "z"]))
        #expect(!RunnableDocument.outputMatches(["x"], ["x", "y"]))
    }
}
