import ArgumentParser
import BuiltinPluginSupport
import Foundation
import WhendJournal
import WhendWire

/// `whenctl sessions`: the session-recorder plugin's index.
struct Sessions: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the sessions the session-recorder plugin has indexed, or print one session's records.",
        discussion:
            "The plugin exports its index every so often; what the journal holds past the export is indexed here, so the list is as new as the journal. A session's records are read from its first _seq to its last, not by scanning the whole journal."
    )

    @OptionGroup var location: JournalLocationOptions

    @Argument(help: "A session id: print that session's records.")
    var session: String?

    @Option(name: .long, help: "Only this app's sessions.")
    var app: String?

    @Option(name: .long, help: "At most this many sessions, most recent first.")
    var limit: Int = 50

    @Flag(name: .long, help: "JSON: one object per session (or the records as stored).")
    var json = false

    func run() throws {
        let stateDirectory = location.stateDir ?? SocketLocation.readerStateDirectory()
        let indexDirectory = SessionIndex.directory(stateDirectory: stateDirectory)
        let index = try currentSessionIndex(stateDirectory: stateDirectory, journal: try? location.existingDirectory())
        {
            printError("whenctl sessions: warning: \($0)")
        }
        // Listed as session-recorder lists them: under its max_sessions, by its rule.
        let listed = index.sessions
        let sessions = listed.filter { app == nil || $0.app == app }
        if let session {
            let matches = sessions.filter { $0.session == session }
            guard !matches.isEmpty else {
                throw Failure("no session \(session) in the index in \(indexDirectory); `whenctl sessions` lists them")
            }
            try printRecords(of: matches)
            return
        }
        let out = Output()
        if json {
            // As the export writes them: Foundation's encoder keeps an object's keys in a
            // dictionary of strings, where two types whose bytes differ only as Unicode's
            // equivalence allows ("é", "e\u{301}") are one.
            for s in sessions.prefix(limit) {
                var line: [UInt8] = []
                SessionIndex.appendJSON(s, key: SessionDigest(app: s.app, session: s.session), to: &line)
                out.write(String(decoding: line, as: UTF8.self))
            }
        } else {
            out.write("\(listed.count) session(s), indexed through _seq \(index.indexedThrough)")
            for s in sessions.prefix(limit) {
                let counts = s.counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                out.write(
                    "\(s.app)/\(s.session)  \(s.records) records, _seq \(s.firstSeq)…\(s.lastSeq), \(s.firstTime) → \(s.lastTime)\(span(s))  (\(counts))"
                )
            }
        }
        out.flush()
    }

    private func span(_ s: SessionIndex.Entry) -> String {
        guard let a = RFC3339.parse(Array(s.firstTime.utf8))?.secondsSince1970,
            let b = RFC3339.parse(Array(s.lastTime.utf8))?.secondsSince1970
        else { return "" }
        return String(format: " (%.1f s)", b - a)
    }

    private func printRecords(of entries: [SessionIndex.Entry]) throws {
        let directory = try location.existingDirectory()
        let first = entries.map(\.firstSeq).min()!
        let last = entries.map(\.lastSeq).max()!
        let wanted = Set(entries.map { SessionKey(app: $0.app, session: $0.session) })
        let out = Output()
        JournalReader(directory: directory).read(fromSeq: first) { record, _ in
            if let seq = record.seq, seq > last { return false }
            guard let fields = try? record.fields(),
                wanted.contains(
                    SessionKey(
                        app: String(decoding: fields.app ?? [], as: UTF8.self),
                        session: String(decoding: fields.session ?? [], as: UTF8.self)))
            else { return true }
            emit(record, format: json ? .json : .short, to: out)
            return true
        } onProblem: { problem in
            out.flush()
            printError("whenctl sessions: warning: \(problem)")
        }
        out.flush()
    }
}

/// session-recorder's index as it exported it, with what `journal` holds past the export indexed
/// here: as new as the journal, whatever the pipeline's lag.
func currentSessionIndex(
    stateDirectory: String, journal: JournalDirectory?, onProblem: (String) -> Void
) throws -> SessionIndex {
    let indexDirectory = SessionIndex.directory(stateDirectory: stateDirectory)
    guard FileManager.default.fileExists(atPath: indexDirectory + "/sessions.json") else {
        throw Failure(
            "no session index in \(indexDirectory): the session-recorder plugin writes it (pipeline `sessions`, on with builtin_pipelines = true); see `whenctl plugins`"
        )
    }
    var index = SessionIndex(directory: indexDirectory)
    // The journal is the truth: what it holds past the export is indexed here.
    if let journal {
        JournalReader(directory: journal).read(fromSeq: index.indexedThrough + 1) { record, _ in
            if let seq = record.seq { index.apply(stored: record.line, seq: seq) }
            return true
        } onProblem: { problem in
            onProblem("\(problem)")
        }
    }
    return index
}

/// `whenctl crashes`: the crash-reports plugin's reports.
struct Crashes: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the crash reports the crash-reports plugin wrote, or show one."
    )

    @OptionGroup var location: JournalLocationOptions

    @Argument(help: "A report to show: its _seq, or its file name.")
    var report: String?

    @Flag(name: .long, help: "JSON: the report as written (or one summary object per report).")
    var json = false

    func run() throws {
        let state = location.stateDir ?? SocketLocation.readerStateDirectory()
        let directory = CrashReportStore.directory(stateDirectory: state)
        let reports = CrashReportStore.reports(stateDirectory: state)
        let files = reports.map(\.file)
        let paths = Dictionary(uniqueKeysWithValues: reports.map { ($0.file, $0.path) })
        let out = Output()
        if let report {
            // As the list shows it (#172), as a number (172), or the file's name.
            let seq = UInt64(report.hasPrefix("#") ? String(report.dropFirst()) : report)
            let file =
                files.first { $0 == report }
                ?? seq.flatMap { seq in
                    files.first { $0.hasPrefix(CrashReportStore.fileName(seq: seq, kind: "").dropLast(5)) }
                }
            guard let file, let data = paths[file].flatMap({ FileManager.default.contents(atPath: $0) }),
                let object = foundationObject(data)
            else {
                throw Failure(
                    files.isEmpty
                        ? "no crash report \(report): there are none in \(directory)"
                        : "no crash report \(report) in \(directory); `whenctl crashes` lists them")
            }
            if json {
                out.write(String(decoding: data, as: UTF8.self))
            } else {
                describe(object, file: file, to: out)
            }
            out.flush()
            return
        }
        if files.isEmpty && !json { out.write("no crash reports in \(directory)") }
        for file in files {
            guard let data = paths[file].flatMap({ FileManager.default.contents(atPath: $0) }),
                let r = foundationObject(data)
            else {
                FileHandle.standardError.write(
                    Data("whenctl crashes: \(paths[file] ?? file) is not a crash report; skipped\n".utf8))
                continue
            }
            let error = r["error"] as? [String: Any] ?? [:]
            if json {
                let summary: [String: Any] = [
                    "file": file, "seq": r["seq"] ?? 0, "kind": r["kind"] ?? "", "app": r["app"] ?? "",
                    "session": r["session"] ?? "", "time": r["time"] ?? "", "screen": r["screen"] ?? NSNull(),
                    "message": error["message"] ?? "",
                ]
                out.write(
                    String(
                        decoding: try JSONSerialization.data(withJSONObject: summary, options: [.sortedKeys]),
                        as: UTF8.self))
            } else {
                out.write(
                    "#\(r["seq"] ?? "?")  \(r["time"] ?? "")  \(r["app"] ?? "")/\(r["session"] ?? "")  on \(r["screen"] ?? "no screen"): \(error["message"] ?? "")"
                )
            }
        }
        out.flush()
    }

    private func describe(_ r: [String: Any], file: String, to out: Output) {
        let error = r["error"] as? [String: Any] ?? [:]
        out.write("\(file): \(r["kind"] ?? "") at _seq \(r["seq"] ?? "?"), \(r["time"] ?? "")")
        out.write("  app      \(r["app"] ?? "")")
        out.write("  session  \(r["session"] ?? "")")
        out.write("  screen   \(r["screen"] ?? "unknown")")
        out.write("  error    \(error["message"] ?? "")\(error["fatal"] as? Bool == true ? " (fatal)" : "")")
        for frame in error["stack"] as? [String] ?? [] { out.write("           at \(frame)") }
        let crumbs = r["breadcrumbs"] as? [[String: Any]] ?? []
        out.write("  breadcrumbs, oldest first (\(crumbs.count)):")
        for c in crumbs {
            let what = ["name", "action", "screen", "status", "message"].compactMap { c[$0] as? String }.joined(
                separator: " ")
            out.write("    #\(c["seq"] ?? "?")  \(c["time"] ?? "")  \(c["type"] ?? ""): \(what)")
        }
    }
}

/// A JSON object whend wrote, as Foundation reads it. whend keeps the escape of a surrogate that
/// has no partner (`\udfff`, as JavaScript's and Python's encoders write one), which Foundation
/// refuses: a crash report whose breadcrumbs held one was left out of `whenctl crashes` without
/// a word. Such an escape reads as U+FFFD here.
func foundationObject(_ data: Data) -> [String: Any]? {
    if let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] { return object }
    return try? JSONSerialization.jsonObject(with: Data(replacingLoneSurrogateEscapes(Array(data))))
        as? [String: Any]
}

/// `json` with every `\uD800`–`\uDFFF` escape that is not half of a pair spelled `\uFFFD`.
func replacingLoneSurrogateEscapes(_ json: [UInt8]) -> [UInt8] {
    func unit(at i: Int) -> UInt16? {
        guard i + 6 <= json.count, json[i] == UInt8(ascii: "\\"), json[i + 1] == UInt8(ascii: "u") else { return nil }
        return UInt16(String(decoding: json[(i + 2)..<(i + 6)], as: UTF8.self), radix: 16)
    }
    var out: [UInt8] = []
    out.reserveCapacity(json.count)
    var i = 0
    var inString = false
    while i < json.count {
        let byte = json[i]
        if !inString {
            if byte == UInt8(ascii: "\"") { inString = true }
            out.append(byte)
            i += 1
            continue
        }
        if byte == UInt8(ascii: "\"") {
            inString = false
        } else if byte == UInt8(ascii: "\\") {
            if let u = unit(at: i), (0xD800...0xDFFF).contains(u) {
                if u <= 0xDBFF, let low = unit(at: i + 6), (0xDC00...0xDFFF).contains(low) {
                    out += json[i..<(i + 12)]
                    i += 12
                } else {
                    out += Array("\\uFFFD".utf8)
                    i += 6
                }
                continue
            }
            // Any other escape: its two bytes as they are (an escaped quote ends no string).
            out += json[i..<min(i + 2, json.count)]
            i += 2
            continue
        }
        out.append(byte)
        i += 1
    }
    return out
}
