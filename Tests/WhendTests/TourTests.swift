import Foundation
import Testing
import WhendWire

/// The README's five-minute tour, run as written: its commands are taken from README.md, so the
/// two cannot drift, and what each prints is checked against the output the README shows.
///
/// How the README is read: in the tour's ```sh blocks, a line that does not start with `#` is a
/// command (continued over lines ending in `\`); the `# ` lines after it are what it prints, on
/// standard output and error together, where `…` stands for any text and a line `# …` for any
/// number of lines. Every command must exit 0 (one that should not says so in its output).
/// `make run` is the daemon: the test starts the whend it built, as `make run` does after
/// building, and `<!-- tour: the daemon stops here -->` is where the reader presses Ctrl-C.
@Suite(.serialized) struct TourTests {
    struct Step {
        var command: String
        var expected: [String]
        var line: Int
        var startsDaemon: Bool { command == "make run" }
        var stopsDaemon = false
    }

    static func steps(of readme: String) throws -> [Step] {
        let lines = readme.components(separatedBy: "\n")
        let start = try #require(lines.firstIndex(of: "## A five-minute tour"), "the README has no tour")
        let end = lines[(start + 1)...].firstIndex { $0.hasPrefix("## ") } ?? lines.count
        var steps: [Step] = []
        var inBlock = false
        var continuing = false
        for index in (start + 1)..<end {
            let line = lines[index]
            if line == "<!-- tour: the daemon stops here -->" {
                steps.append(Step(command: "", expected: [], line: index + 1, stopsDaemon: true))
            } else if line.hasPrefix("```") {
                inBlock = line == "```sh"
                continuing = false
            } else if !inBlock || line.isEmpty {
                continue
            } else if continuing {
                steps[steps.count - 1].command += "\n" + line
                continuing = line.hasSuffix("\\")
            } else if line == "#" || line.hasPrefix("# ") {
                guard !steps.isEmpty else { continue }
                steps[steps.count - 1].expected.append(String(line.dropFirst(2)))
            } else {
                steps.append(Step(command: line, expected: [], line: index + 1))
                continuing = line.hasSuffix("\\")
            }
        }
        return steps
    }

    /// The script that runs the steps in one shell, as a reader pastes them, each output framed.
    static func script(_ steps: [Step], root: String, whend: String) -> String {
        var script = """
            exec 2>&1
            shopt -s expand_aliases
            cd '\(root)'

            """
        for (index, step) in steps.enumerated() {
            script += "echo '@@step \(index)'\n"
            if step.startsDaemon {
                script += """
                    '\(whend)' > "$TOUR_DIR/whend.log" 2>&1 &
                    daemon=$!
                    for _ in $(seq 300); do grep -q 'listening on' "$TOUR_DIR/whend.log" && break; sleep 0.1; done
                    cat "$TOUR_DIR/whend.log"

                    """
            } else if step.stopsDaemon {
                script += "kill -INT \"$daemon\"; wait \"$daemon\"\n"
            } else {
                script += step.command + "\n"
            }
            script += "echo \"@@status $?\"\n"
        }
        return script
    }

    /// A line of the README's output against a line printed: `…` stands for any text.
    static func lineMatches(_ pattern: String, _ line: String) -> Bool {
        let parts = pattern.components(separatedBy: "…")
        guard parts.count > 1 else { return pattern == line }
        guard line.hasPrefix(parts[0]), line.dropFirst(parts[0].count).hasSuffix(parts[parts.count - 1]) else {
            return false
        }
        var rest = Substring(line.dropFirst(parts[0].count).dropLast(parts[parts.count - 1].count))
        for part in parts.dropFirst().dropLast() where !part.isEmpty {
            guard let found = rest.range(of: part) else { return false }
            rest = rest[found.upperBound...]
        }
        return true
    }

    /// The README's lines against the printed ones: a line `…` stands for any number of lines.
    static func outputMatches(_ expected: [String], _ actual: [String]) -> Bool {
        var memo: [Int: Bool] = [:]
        func match(_ e: Int, _ a: Int) -> Bool {
            let key = e * (actual.count + 1) + a
            if let known = memo[key] { return known }
            let result: Bool
            if e == expected.count {
                result = a == actual.count
            } else if expected[e] == "…" {
                result = match(e + 1, a) || (a < actual.count && match(e, a + 1))
            } else {
                result = a < actual.count && lineMatches(expected[e], actual[a]) && match(e + 1, a + 1)
            }
            memo[key] = result
            return result
        }
        return match(0, 0)
    }

    /// Runs the tour with `runtimeDirectory` as $XDG_RUNTIME_DIR (nil: without one) in a fresh
    /// home, and checks each step.
    func runTour(runtimeDirectory: Bool) throws {
        let root = DocumentationTests.root
        let readme = try String(contentsOfFile: root + "/README.md", encoding: .utf8)
        let steps = try Self.steps(of: readme)
        #expect(steps.contains { $0.startsDaemon } && steps.contains { $0.stopsDaemon })
        #expect(steps.count > 15, "the tour has only \(steps.count) steps")

        let dir = scratchDirectory("tour")
        let home = dir + "/home"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        // No /etc/whend/whend.conf either, as on a machine that never installed the package.
        let config = dir + "/empty.conf"
        #expect(FileManager.default.createFile(atPath: config, contents: Data()))
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("WHEND_") && !$0.key.hasPrefix("XDG_")
                && !["RUNTIME_DIRECTORY", "STATE_DIRECTORY", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID"].contains(
                    $0.key)
        }
        environment["HOME"] = home
        environment["WHEND_CONFIG"] = config
        environment["TOUR_DIR"] = dir
        if runtimeDirectory {
            let run = dir + "/run"
            try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: true)
            chmod(run, 0o700)
            environment["XDG_RUNTIME_DIR"] = run
        }
        let script = Self.script(steps, root: root, whend: executable("whend"))
        let p = Process()
        // As in a reader's terminal: a pipeline's writer ends when its reader does. This process
        // ignores SIGPIPE (NIO does, for the sockets of the daemons tests run in it), children
        // would inherit that, and `jq | head` would then print "Broken pipe".
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["--default-signal=PIPE", "/bin/bash", "-c", script]
        p.environment = environment
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        var output = ""
        readLines(from: out.fileHandleForReading.fileDescriptor, until: Date().addingTimeInterval(180)) { line in
            output += line + "\n"
            return true
        }
        if p.isRunning { kill(p.processIdentifier, SIGKILL) }
        p.waitUntilExit()

        // Each step's lines and exit status, by the frames the script printed.
        var printed: [Int: [String]] = [:]
        var statuses: [Int: Int32] = [:]
        var current = -1
        for line in output.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init) {
            if line.hasPrefix("@@step ") {
                current = Int(line.dropFirst(7)) ?? -1
                printed[current] = []
            } else if line.hasPrefix("@@status ") {
                statuses[current] = Int32(line.dropFirst(9))
            } else if current >= 0 {
                printed[current, default: []].append(line)
            }
        }
        for (index, step) in steps.enumerated() {
            let where_ = "README.md:\(step.line) `\(step.command)`"
            guard let status = statuses[index] else {
                Issue.record("\(where_) never finished; the tour printed:\n\(output.suffix(3000))")
                return
            }
            #expect(status == 0, "\(where_) exited \(status): \(printed[index] ?? [])")
            guard !step.expected.isEmpty else { continue }
            let actual = printed[index] ?? []
            #expect(
                Self.outputMatches(step.expected, actual),
                "\(where_) printed:\n\(actual.joined(separator: "\n"))\nwhere the README shows:\n\(step.expected.joined(separator: "\n"))"
            )
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
        #expect(Self.lineMatches("a … c", "a b c") && !Self.lineMatches("a … c", "a b d"))
        #expect(Self.outputMatches(["x", "…", "z"], ["x", "y", "y", "z"]))
        #expect(!Self.outputMatches(["x", "z"], ["x", "y", "z"]))
        #expect(!Self.outputMatches(["x"], ["x", "y"]))
    }
}
