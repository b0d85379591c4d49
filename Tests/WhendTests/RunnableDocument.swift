import Foundation
import Testing

/// A section of a document that a reader follows by pasting its commands (the README's tour,
/// the plugin guide's quickstart), read so that a test can run it as written and check what
/// each command prints against what the document shows.
///
/// In the section's ```sh blocks, a line that does not start with `#` is a command (continued
/// over lines ending in `\`, or up to the end of a here-document); the `# ` lines after it are
/// what it prints, on standard output and error together, where `…` stands for any text and a
/// line `# …` for any number of lines. A ```swift block is a file, named by the last
/// backquoted path (starting `~/`) in the paragraph before it. An HTML comment
/// `<!-- NAME: … -->` on a line of its own is a marker step, for the test to act on.
struct RunnableDocument {
    struct Step {
        var command: String
        var expected: [String]
        /// The document's line, for messages.
        var line: Int
        /// The marker's text, for a marker step (`<!-- tour: the daemon stops here -->`).
        var marker: String?
    }

    struct File {
        var path: String
        var contents: String
    }

    let name: String
    private(set) var steps: [Step] = []
    private(set) var files: [File] = []

    /// Reads the section under `heading` of the file at `path` (relative to the repository).
    init(_ path: String, section heading: String, markerPrefix: String) throws {
        name = path
        let text = try String(contentsOfFile: repositoryRoot + "/" + path, encoding: .utf8)
        let lines = text.components(separatedBy: "\n")
        let start = try #require(lines.firstIndex(of: heading), "\(path) has no section \(heading)")
        let end = lines[(start + 1)...].firstIndex { $0.hasPrefix("## ") } ?? lines.count
        var block: String?
        var file: File?
        var continuing = false
        var hereDocument: String?
        var lastPath: String?
        for index in (start + 1)..<end {
            let line = lines[index]
            if block == nil, line.hasPrefix("<!-- \(markerPrefix): "), line.hasSuffix(" -->") {
                steps.append(
                    Step(
                        command: "", expected: [], line: index + 1,
                        marker: String(line.dropFirst(markerPrefix.count + 7).dropLast(4))))
            } else if line.hasPrefix("```") {
                if block == nil {
                    block = String(line.dropFirst(3))
                    if block == "swift", let lastPath { file = File(path: lastPath, contents: "") }
                } else {
                    if let done = file { files.append(done) }
                    block = nil
                    file = nil
                    lastPath = nil
                }
                continuing = false
            } else if block == nil {
                // A new paragraph forgets the path the one before named.
                if !line.isEmpty, index > 0, lines[index - 1].isEmpty { lastPath = nil }
                for piece in line.components(separatedBy: "`").enumerated() where piece.offset % 2 == 1 {
                    if piece.element.hasPrefix("~/") { lastPath = piece.element }
                }
            } else if file != nil {
                file?.contents += line + "\n"
            } else if block != "sh" {
                continue
            } else if let terminator = hereDocument {
                steps[steps.count - 1].command += "\n" + line
                if line == terminator { hereDocument = nil }
            } else if line.isEmpty {
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
                if let range = line.range(of: "<<"), !line.contains("<<<"), !line.hasSuffix("\\") {
                    hereDocument = String(line[range.upperBound...]).trimmingCharacters(in: .whitespaces)
                        .trimmingCharacters(in: CharacterSet(charactersIn: "'\"-"))
                }
            }
        }
    }

    /// A line of the document's output against a line printed: `…` stands for any text.
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

    /// The document's lines against the printed ones: a line `…` stands for any number of lines.
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

    /// Runs the steps in one shell, as a reader pastes them: each step's command, or what
    /// `act` says for a step (a marker's action, or another way to do a step the test has
    /// done already), then checks that each exited 0 and printed what the document shows.
    func run(
        in directory: String, environment: [String: String], timeout: TimeInterval,
        act: (Step) -> String? = { _ in nil }
    ) throws {
        var script = "exec 2>&1\nshopt -s expand_aliases\ncd '\(directory)'\n"
        for (index, step) in steps.enumerated() {
            script += "echo '@@step \(index)'\n" + (act(step) ?? step.command) + "\n" + "echo \"@@status $?\"\n"
        }
        // A daemon a failed step left running goes with the shell.
        script += "echo '@@end'\nkill $(jobs -p) 2> /dev/null\nwait\n"
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
        readLines(from: out.fileHandleForReading.fileDescriptor, until: Date().addingTimeInterval(timeout)) { line in
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
            } else if line == "@@end" {
                current = -1
            } else if current >= 0 {
                printed[current, default: []].append(line)
            }
        }
        for (index, step) in steps.enumerated() {
            let where_ = "\(name):\(step.line) `\(step.marker ?? step.command)`"
            guard let status = statuses[index] else {
                Issue.record("\(where_) never finished; the run printed:\n\(output.suffix(3000))")
                return
            }
            #expect(status == 0, "\(where_) exited \(status): \(printed[index] ?? [])")
            guard !step.expected.isEmpty else { continue }
            let actual = printed[index] ?? []
            #expect(
                Self.outputMatches(step.expected, actual),
                "\(where_) printed:\n\(actual.joined(separator: "\n"))\nwhere \(name) shows:\n\(step.expected.joined(separator: "\n"))"
            )
        }
    }

    /// The environment of a reader's fresh shell: none of whend's variables or the test
    /// machine's service manager's, and `home` as its home.
    static func freshEnvironment(home: String) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("WHEND_") && !$0.key.hasPrefix("XDG_")
                && !["RUNTIME_DIRECTORY", "STATE_DIRECTORY", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID"].contains(
                    $0.key)
        }
        environment["HOME"] = home
        return environment
    }
}
