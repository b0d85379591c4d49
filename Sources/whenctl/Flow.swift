import ArgumentParser
import Foundation
import WhendJournal
import WhendWire

/// `whenctl flow`: the screen-transition graph of the selected sessions.
struct Flow: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The screen-transition graph of the selected sessions, with counts per edge.",
        discussion: """
            Built from screen-tracking's screen views (each names its previous screen); where a \
            session has none, from the app's own screen events in order. (start) marks a session's \
            first screen. --format svg runs Graphviz's dot.
            """
    )

    @OptionGroup var location: JournalLocationOptions
    @OptionGroup var filters: RecordFilterOptions

    @Option(name: .long, help: "text, dot or svg.")
    var format: Format = .text

    enum Format: String, ExpressibleByArgument { case text, dot, svg }

    func run() throws {
        let directory = try location.existingDirectory()
        let filter = try filters.filter()
        struct Edge: Hashable {
            var from: String
            var to: String
        }
        var derived: [Edge: Int] = [:]
        var derivedSessions: Set<[UInt8]> = []
        var appViews: [[UInt8]: [String]] = [:]
        JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
            record, _ in
            if filter.isPastEnd(record) { return false }
            guard filter.matches(record), let fields = try? record.fields(), fields.type == "screen",
                let object = try? JSONSerialization.jsonObject(with: Data(buffer: record.line)) as? [String: Any],
                let name = object["name"] as? String
            else { return true }
            let session = (fields.app ?? []) + [0] + (fields.session ?? [])
            if object["_origin"] as? String == "screen-tracking" {
                derived[Edge(from: object["previous"] as? String ?? "(start)", to: name), default: 0] += 1
                derivedSessions.insert(session)
            } else if object["_origin"] == nil {
                appViews[session, default: []].append(name)
            }
            return true
        } onProblem: {
            printError("whenctl flow: warning: \($0)")
        }
        var edges = derived
        for (session, views) in appViews where !derivedSessions.contains(session) {
            for (i, name) in views.enumerated() {
                edges[Edge(from: i == 0 ? "(start)" : views[i - 1], to: name), default: 0] += 1
            }
        }
        let sorted = edges.sorted {
            $0.value != $1.value ? $0.value > $1.value : ($0.key.from, $0.key.to) < ($1.key.from, $1.key.to)
        }
        switch format {
        case .text:
            if sorted.isEmpty { print("no screen views in the selection (is the screens pipeline running?)") }
            let width = sorted.map { $0.key.from.count + $0.key.to.count + 3 }.max() ?? 0
            for (edge, count) in sorted {
                let label = "\(edge.from) → \(edge.to)"
                print(label + String(repeating: " ", count: max(1, width - label.count + 2)) + String(count))
            }
        case .dot:
            print(Self.dot(sorted.map { ($0.key.from, $0.key.to, $0.value) }), terminator: "")
        case .svg:
            print(try Self.svg(Self.dot(sorted.map { ($0.key.from, $0.key.to, $0.value) })), terminator: "")
        }
    }

    static func dot(_ edges: [(String, String, Int)]) -> String {
        func quoted(_ s: String) -> String {
            "\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
        }
        var text = "digraph flow {\n  rankdir=LR;\n  node [shape=box];\n"
        for (from, to, count) in edges {
            text += "  \(quoted(from)) -> \(quoted(to)) [label=\"\(count)\", penwidth=\(1 + min(4, count / 10))];\n"
        }
        return text + "}\n"
    }

    static func svg(_ dot: String) throws -> String {
        let paths = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":")
        guard let tool = paths.map({ $0 + "/dot" }).first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else {
            throw Failure(
                "--format svg needs Graphviz's dot, which is not on PATH: `apt-get install graphviz`, or use --format dot"
            )
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = ["-Tsvg"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(Data(dot.utf8))
        try input.fileHandleForWriting.close()
        let svg = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw Failure(
                "Graphviz's dot failed (exit status \(process.terminationStatus)); try --format dot to see its input")
        }
        return String(decoding: svg, as: UTF8.self)
    }
}
