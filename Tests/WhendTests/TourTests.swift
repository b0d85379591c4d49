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
    /// home, and checks each step.
    func runTour(runtimeDirectory: Bool) throws {
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
    }

    @Test func theTourRunsAsWrittenWithAnXDGRuntimeDirectory() throws {
        try runTour(runtimeDirectory: true)
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
