import ArgumentParser
import Foundation
import WhendJournal
import WhendRecord
import WhendWire

/// Which records to show: the filters `cat` and `tail` share.
struct RecordFilterOptions: ParsableArguments {
    @Option(name: .long, help: "Only records of this app.")
    var app: String?

    @Option(name: .long, help: "Only records of this session.")
    var session: String?

    @Option(
        name: .long,
        help:
            "Only records of this type: lifecycle, when, navigation, screen, error, or a type plugins derive (screen_time, diagnostic, …); repeatable."
    )
    var type: [String] = []

    @Option(name: .long, help: "From this _seq on.")
    var from: UInt64?

    @Option(name: .long, help: "Up to this _seq.")
    var to: UInt64?

    // Unconditional: `--since -1h` is a value, as with journalctl, not an option.
    @Option(
        name: .long, parsing: .unconditional,
        help:
            "Received at or after this time: RFC 3339, today, yesterday, now, or from now: -1h, -15m, +30s (unsigned: ago)."
    )
    var since: String?

    @Option(name: .long, parsing: .unconditional, help: "Received before this time (same forms as --since).")
    var until: String?

    @Option(name: [.short, .long], help: "Output: json (the stored lines) or short (one readable line each).")
    var output: OutputFormat = .json

    enum OutputFormat: String, ExpressibleByArgument { case json, short }

    func validate() throws {
        // A derived type is any name a plugin chose (screen_time, diagnostic, its own): a plugin
        // author lists their own output by it.
        for t in type where t.isEmpty || t.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
        {
            throw ValidationError(
                "--type takes a record type (lifecycle, when, navigation, screen, error, or a derived one such as screen_time); got '\(t.debugDescription)'"
            )
        }
        _ = try sinceMicros
        _ = try untilMicros
    }

    var sinceMicros: Int64? { get throws { try since.map { try parseTime($0, option: "--since") } } }
    var untilMicros: Int64? { get throws { try until.map { try parseTime($0, option: "--until") } } }

    func filter() throws -> RecordFilter {
        RecordFilter(
            app: app.map { Array($0.utf8) }, session: session.map { Array($0.utf8) }, types: Set(type),
            fromSeq: from, toSeq: to, sinceMicros: try sinceMicros, untilMicros: try untilMicros)
    }
}

/// A point in time as journalctl takes it: RFC 3339; `now`, `today`, `yesterday`, `tomorrow`
/// (local midnight); or a duration from now — `-1h`, `+30m`, or unsigned for "ago" (`90s`,
/// `15min`, `2h`, `7d`, `1w`).
func parseTime(_ text: String, option: String) throws -> Int64 {
    if let instant = RFC3339.parse(Array(text.utf8)) { return instant.microseconds }
    let now = currentMicros()
    let midnight = Int64(Calendar.current.startOfDay(for: Date()).timeIntervalSince1970) * 1_000_000
    switch text {
    case "now": return now
    case "today": return midnight
    case "yesterday": return midnight - 86_400_000_000
    case "tomorrow": return midnight + 86_400_000_000
    default: break
    }
    let units: [String: Double] = [
        "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400,
        "days": 86400, "w": 604_800, "week": 604_800, "weeks": 604_800,
    ]
    var rest = Substring(text)
    let sign: Double = rest.hasPrefix("+") ? 1 : -1
    if rest.hasPrefix("+") || rest.hasPrefix("-") { rest = rest.dropFirst() }
    let digits = rest.prefix { $0.isNumber || $0 == "." }
    if let amount = Double(digits), amount >= 0, let scale = units[String(rest.dropFirst(digits.count))] {
        return now + Int64(sign * amount * scale * 1e6)
    }
    throw ValidationError(
        "\(option) takes an RFC 3339 time (2026-11-21T13:35:00Z), today, yesterday, now, or a time from now (-1h, +30m, 90s ago as 90s); got '\(text)'"
    )
}

func currentMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

/// The short human form: time, _seq, app, session, type and what happened.
func shortForm(_ line: UnsafeBufferPointer<UInt8>) -> String {
    guard let object = try? JSONSerialization.jsonObject(with: Data(buffer: line)) as? [String: Any] else {
        return printable(String(decoding: line, as: UTF8.self), limit: .max)
    }
    func s(_ key: String) -> String { (object[key] as? String) ?? (object[key] as? NSNumber)?.stringValue ?? "" }
    let what: String
    switch s("type") {
    case "when":
        let params = (object["params"] as? [String: Any]).flatMap {
            try? JSONSerialization.data(withJSONObject: $0, options: [.sortedKeys])
        }
        what =
            s("name")
            + (params.map { " " + String(decoding: $0, as: UTF8.self) }.flatMap { $0 == " {}" ? "" : $0 } ?? "")
    case "lifecycle": what = "\(s("screen")) \(s("status"))"
    case "navigation": what = "\(s("action")) \(s("screen"))".trimmingCharacters(in: .whitespaces)
    case "screen":
        let previous = s("previous")
        what = s("name") + (previous.isEmpty ? "" : " (from \(previous))")
    case "screen_time":
        let seconds = (object["seconds"] as? NSNumber).map { " \($0) s" } ?? " (time unknown)"
        what = s("name") + seconds
    case "diagnostic": what = "\(s("screen")): \(s("problem")) (_seq \(s("cause_seq")))"
    case "error": what = ((object["fatal"] as? Bool) == true ? "FATAL " : "") + s("message")
    default:
        // A type a plugin of one's own derives: its name if it has one, else its own fields.
        let own = object.filter { !$0.key.hasPrefix("_") && !["type", "app", "session", "ts"].contains($0.key) }
        what =
            object["name"] != nil
            ? s("name")
            : (try? JSONSerialization.data(withJSONObject: own, options: [.sortedKeys])).map {
                String(decoding: $0, as: UTF8.self)
            } ?? ""
    }
    // Clients' text, shown on a terminal: its control characters must not act on it.
    return printable(
        "\(s("_rt")) #\(s("_seq")) \(s("app"))\(object["session"] != nil ? "/" + s("session") : "") \(s("type")): \(what)",
        limit: .max)
}

func emit(_ record: JournalRecord, format: RecordFilterOptions.OutputFormat, to out: Output) {
    switch format {
    case .json: out.write(record.line)
    case .short: out.write(shortForm(record.line))
    }
}

struct Cat: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print journal records, in _seq order, as JSON lines or a short human form.",
        discussion: "Reading while whend writes is safe: the active segment is read up to its last commit."
    )

    @OptionGroup var location: JournalLocationOptions
    @OptionGroup var filters: RecordFilterOptions

    func run() throws {
        let directory = try location.existingDirectory()
        let filter = try filters.filter()
        // Read once: through the property wrapper, each record copied the options and looked up
        // their generic metadata (a fifth of `cat`'s time).
        let format = filters.output
        let out = Output()
        var problems = 0
        JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
            record, _ in
            if filter.isPastEnd(record) { return false }
            if filter.matches(record) { emit(record, format: format, to: out) }
            return true
        } onProblem: { problem in
            problems += 1
            out.flush()
            printError("whenctl cat: warning: \(problem)")
        }
        out.flush()
        if problems > 0 { throw ExitCode(1) }
    }
}

struct Tail: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the last records, and with -f follow new ones as they are committed."
    )

    @OptionGroup var location: JournalLocationOptions
    @OptionGroup var filters: RecordFilterOptions

    @Option(name: [.customShort("n"), .long], help: "How many of the latest matching records to print first.")
    var lines: Int = 10

    @Flag(name: .shortAndLong, help: "Keep printing records as they are committed, until interrupted.")
    var follow = false

    @Option(
        name: .long,
        help:
            "With -f, whend's event socket to subscribe to (default: whend's own, when no --state-dir or --journal is named)."
    )
    var socket: String?

    func run() throws {
        let filter = try filters.filter()
        let format = filters.output  // once, not per record (see `Cat`)
        let out = Output()
        let journalNamed = location.stateDir != nil || location.journal != nil
        if follow, !journalNamed, socket != nil || !location.isReadable {
            // A socket names a daemon, not its journal; and a member of subscribe_group may not
            // read the files. So everything comes from whend: the last matches of its catch-up,
            // then the live records.
            let path = socket ?? SocketLocation.eventSocket()
            try refuseUnsafeSocketDirectory(path)
            let after = filter.fromSeq.flatMap { $0 > 0 ? $0 - 1 : nil }
            switch followSubscription(path, after: after, keepLast: lines, filter, format, out) {
            case .ended: return
            case .unreachable:
                throw Failure(
                    "whend does not answer at \(path), and no journal is named to read instead: start whend, or name its journal with --state-dir or --journal"
                )
            case .refused(let why):
                throw Failure("whend at \(path) refused the subscription: \(why)")
            }
        }
        let directory = try location.existingDirectory()
        let reader = JournalReader(directory: directory)
        let warn: (JournalProblem) -> Void = { problem in
            out.flush()
            printError("whenctl tail: warning: \(problem)")
        }
        // The last N matches, as journalctl shows them: from the newest segment (or --from) to
        // the end, then from earlier segments while fewer than N were found.
        let segments = directory.segments()
        var index = filter.fromSeq == nil ? segments.count - 1 : 0
        let start = filter.fromSeq ?? (index >= 0 ? segments[index].firstSeq : nil)
        /// The last `keep` matches from `_seq` `from` on, before `below` (or the end, or --to).
        func lastMatches(from: UInt64?, below: UInt64? = nil, keep: Int) -> (
            found: [[UInt8]], lastSeq: UInt64?, ended: Bool
        ) {
            var found: [[UInt8]] = []
            var lastSeq: UInt64?
            var ended = false
            reader.read(fromSeq: from, sinceMicros: filter.sinceMicros) { record, _ in
                if let below, (record.seq ?? 0) >= below { return false }
                if filter.isPastEnd(record) {
                    ended = true
                    return false
                }
                lastSeq = record.seq ?? lastSeq
                guard filter.matches(record) else { return true }
                found.append(Array(record.line))
                if found.count > keep { found.removeFirst(found.count - keep) }
                return true
            } onProblem: {
                warn($0)
            }
            return (found, lastSeq, ended)
        }
        let newest = lastMatches(from: start, keep: lines)
        var recent = newest.found
        var before = start ?? 0
        while recent.count < lines, filter.fromSeq == nil, index > 0 {
            index -= 1
            recent =
                lastMatches(from: segments[index].firstSeq, below: before, keep: lines - recent.count).found + recent
            before = segments[index].firstSeq
        }
        printRecent(recent, out)
        out.flush()
        guard follow, !newest.ended else { return }
        // From whend itself when it is the one whose journal this is: only acknowledged
        // records, never one a power cut takes back; else (a journal named, no socket) from the
        // files.
        if socket != nil || (location.stateDir == nil && location.journal == nil) {
            let path = socket ?? SocketLocation.eventSocket()
            // Not a socket in a directory another user owns: what it sent would be taken for
            // whend's records (as emit and the control commands refuse it).
            try refuseUnsafeSocketDirectory(path)
            switch followSubscription(
                path, after: newest.lastSeq ?? start.flatMap { $0 > 0 ? $0 - 1 : nil }, keepLast: nil, filter, format,
                out)
            {
            case .ended: return
            case .unreachable:
                printError("whenctl tail: whend does not answer at \(path); following the journal's files")
            case .refused(let why):
                printError(
                    "whenctl tail: whend refused the subscription at \(path) (\(why)); following the journal's files")
            }
        }
        reader.read(fromSeq: newest.lastSeq.map { $0 + 1 } ?? start, sinceMicros: filter.sinceMicros, follow: true) {
            record, _ in
            if filter.isPastEnd(record) { return false }
            guard filter.matches(record) else { return true }
            emit(record, format: format, to: out)
            return true
        } onCaughtUp: {
            out.flush()
            return true
        } onProblem: {
            warn($0)
        }
        out.flush()
    }

    /// Follows whend's records through a subscription (PROTOCOL.md §9) until interrupted,
    /// resuming after the last `_seq` seen whenever the connection ends (a restart of whend).
    /// False when whend cannot be reached at all: the caller follows the files.
    /// - Parameter keepLast: print only this many of the catch-up's last matches (the history
    ///   was not read from the files), then every live one.
    /// How following through a subscription ended.
    private enum SubscriptionOutcome {
        /// `--to` was reached (else it follows until interrupted).
        case ended
        /// whend could not be reached at all.
        case unreachable
        /// whend answered with a refusal before any record.
        case refused(String)
    }

    private func followSubscription(
        _ path: String, after: UInt64?, keepLast: Int?, _ filter: RecordFilter,
        _ format: RecordFilterOptions.OutputFormat, _ out: Output
    ) -> SubscriptionOutcome {
        var held: [[UInt8]]? = keepLast.map { _ in [] }
        func release() {
            guard let lines = held else { return }
            held = nil
            printRecent(lines, out)
        }
        var request = SubscribeRequest()
        request.app = filter.app
        request.session = filter.session
        request.types = filter.types.sorted()
        var seen = after
        var connected = false
        while true {
            request.start = seen.map { .after($0) } ?? .oldest
            guard let subscription = try? SubscriptionReader(path: path, request: request) else {
                guard connected else {
                    return .unreachable
                }
                sleep(1)
                continue
            }
            var why = "whend closed the connection"
            do {
                while let event = try subscription.next() {
                    switch event {
                    case .subscribed: connected = true
                    case .record(let seq, let line):
                        seen = seq
                        if let toSeq = filter.toSeq, seq > toSeq {
                            release()
                            out.flush()
                            return .ended
                        }
                        let wanted = line.withUnsafeBufferPointer { (try? StoredRecord.scan($0)).map(filter.matches) }
                        if wanted == true, held != nil, let keep = keepLast {
                            held!.append(line)
                            if held!.count > keep { held!.removeFirst() }
                        } else if wanted == true {
                            line.withUnsafeBufferPointer {
                                switch format {
                                case .json: out.write($0)
                                case .short: out.write(shortForm($0))
                                }
                            }
                        }
                    case .caughtUp(let seq):
                        seen = max(seen ?? 0, seq)
                        release()
                        out.flush()
                        if let toSeq = filter.toSeq, seq >= toSeq { return .ended }
                    case .checkpoint(let seq):
                        seen = max(seen ?? 0, seq)
                        out.flush()
                        // Everything through --to examined, whether or not the filters passed any.
                        if let toSeq = filter.toSeq, seq >= toSeq {
                            release()
                            out.flush()
                            return .ended
                        }
                    case .gap(let from, let through):
                        out.flush()
                        printError(
                            "whenctl tail: warning: _seq \(from)…\(through) are gone from the journal (deleted by retention, or damaged: whenctl verify says which)"
                        )
                    case .error(let code, let message):
                        why = "\(code): \(message)"
                    }
                }
            } catch {
                why = "\(error)"
            }
            out.flush()
            guard connected else {
                return .refused(why)
            }
            printError("whenctl tail: \(why); resuming after _seq \(seen ?? 0)")
            sleep(1)
        }
    }

    private func printRecent(_ recent: [[UInt8]], _ out: Output) {
        for line in recent {
            line.withUnsafeBufferPointer {
                switch filters.output {
                case .json: out.write($0)
                case .short: out.write(shortForm($0))
                }
            }
        }
    }
}

struct Verify: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check every segment: zstd integrity, one JSON object per line, _seq without gaps, the index.",
        discussion: "Prints each problem with its file and offset; exits 1 if there is any."
    )

    @OptionGroup var location: JournalLocationOptions

    @Flag(name: .long, help: "Print the report as one JSON object.")
    var json = false

    func run() throws {
        let directory = try location.existingDirectory()
        let showProgress = isatty(2) != 0 && !json
        let report = JournalVerifier(directory: directory).verify { done, total in
            if showProgress { FileHandle.standardError.write(Data("\rverifying segment \(done)/\(total)".utf8)) }
        }
        if showProgress { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
        if json {
            let object: [String: Any] = [
                "ok": report.isClean, "segments": report.segments, "records": report.records,
                "first_seq": report.firstSeq.map { NSNumber(value: $0) } ?? NSNull(),
                "last_seq": report.lastSeq.map { NSNumber(value: $0) } ?? NSNull(),
                "problems": report.problems.map {
                    ["file": $0.path, "offset": $0.offset, "message": $0.message] as [String: Any]
                },
                "notes": report.notes,
            ]
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            for problem in report.problems { print("PROBLEM \(problem)") }
            for note in report.notes { print("note: \(note)") }
            let range = report.firstSeq.map { "_seq \($0)…\(report.lastSeq ?? $0)" } ?? "no records"
            print(
                "\(report.isClean ? "OK" : "FAILED"): \(report.segments) segment(s), \(report.records) record(s), \(range), \(report.problems.count) problem(s)"
            )
        }
        if !report.isClean { throw ExitCode(1) }
    }
}
