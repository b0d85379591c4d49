import ArgumentParser
import Foundation
import WhendControl
import WhendJournal
import WhendTrackingPlan
import WhendWire

struct Plan: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The tracking plan: propose one from the journal, check one over it, or show whend's violations.",
        discussion: "The plan file's format is in docs/tracking-plan.md.",
        subcommands: [Infer.self, Check.self, Violations.self]
    )

    struct Infer: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Propose a plan from the journal (or part of it), with statistics per event and param.",
            discussion: """
                The plan (JSON, a schema per When name with the types each param had, required \
                where it was always present, and the screen names seen) goes to standard output, \
                or to --write FILE; the statistics (how often each param was present, with which \
                types how often) go to standard error. The plan passes `whenctl plan check` on the \
                records it was inferred from; tighten it by hand (patterns, bounds, enums). Records \
                pipelines derived are left out: apps never send them.
                """)

        @OptionGroup var location: JournalLocationOptions
        @OptionGroup var filters: RecordFilterOptions

        @Option(name: .long, help: "Write the plan to this file instead of standard output.")
        var write: String?

        func run() throws {
            let directory = try location.existingDirectory()
            let filter = try filters.filter()
            var inference = PlanInference()
            var problems = 0
            JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
                record, _ in
                if filter.isPastEnd(record) { return false }
                // What pipelines derived was never an app's to send, nor is it checked at ingest.
                if filter.matches(record), (try? record.fields())?.isDerived != true {
                    inference.add(record: record.line)
                }
                return true
            } onProblem: { problem in
                problems += 1
                printError("whenctl plan infer: warning: \(problem)")
            }
            // Names clients chose, on the operator's terminal: escaped, line by line.
            let statistics = inference.statistics().split(separator: "\n", omittingEmptySubsequences: false)
                .map { printable(String($0), limit: .max) }.joined(separator: "\n")
            FileHandle.standardError.write(Data(statistics.utf8))
            let (plan, notes) = inference.proposal()
            for note in notes { printError("whenctl plan infer: note: \(printable(note, limit: .max))") }
            if let write {
                guard FileManager.default.createFile(atPath: write, contents: Data(plan.utf8)) else {
                    throw Failure("cannot write the plan to \(write): \(String(cString: strerror(errno)))")
                }
            } else {
                print(plan, terminator: "")
            }
            if problems > 0 { throw ExitCode(1) }
        }
    }

    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run a plan over the journal (or part of it) and print what it would flag.",
            discussion: """
                One line per record that breaks the plan (its _seq, app, event, the JSON path, why \
                and the rule), then the counts by event and rule. Exit status 1 when any record \
                broke it, or when the plan does not parse (its line and why). Records pipelines \
                derived are not checked, as whend does not check them at ingest.
                """)

        @Argument(help: "The plan file.")
        var plan: String

        @OptionGroup var location: JournalLocationOptions
        @OptionGroup var filters: RecordFilterOptions

        @Flag(name: .long, help: "Print only the counts, not each record.")
        var summary = false

        func run() throws {
            let compiled: TrackingPlan
            do {
                compiled = try TrackingPlan.load(path: plan)
            } catch {
                throw Failure("the plan \(plan)\(error.line > 0 ? ", line \(error.line)" : ""): \(error.reason)")
            }
            let directory = try location.existingDirectory()
            let filter = try filters.filter()
            let out = Output()
            var checked = 0
            var counts: [String: Int] = [:]
            var problems = 0
            let printEach = !summary
            JournalReader(directory: directory).read(fromSeq: filter.fromSeq, sinceMicros: filter.sinceMicros) {
                record, _ in
                if filter.isPastEnd(record) { return false }
                guard filter.matches(record), (try? record.fields())?.isDerived != true,
                    let subject = PlanSubject(record: record.line)
                else { return true }
                checked += 1
                guard let violation = compiled.check(subject, in: record.line) else { return true }
                counts["\(violation.event) \(violation.rule.rawValue)", default: 0] += 1
                if printEach {
                    let app = subject.app.map { TrackingPlan.text($0, record.line) } ?? "-"
                    out.write(printable("#\(record.seq ?? 0) \(app) \(violation)"))
                }
                return true
            } onProblem: { problem in
                problems += 1
                out.flush()
                printError("whenctl plan check: warning: \(problem)")
            }
            let flagged = counts.values.reduce(0, +)
            out.write("\(checked) record\(checked == 1 ? "" : "s") checked, \(flagged) would be flagged")
            for (key, count) in counts.sorted(by: { $0.key < $1.key }) { out.write("  \(key): \(count)") }
            out.flush()
            if flagged > 0 || problems > 0 { throw ExitCode(1) }
        }
    }

    struct Violations: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the running whend's plan violations: counts by event and rule, and the latest 100.",
            discussion: """
                Counted since whend started, in both modes (report stores the event, enforce refuses \
                it with plan_violation). A When name the plan does not list is counted under the \
                empty name (rule event); the examples name it. --json prints the control socket's \
                answer as it is.
                """)

        @OptionGroup var options: ControlOptions

        @Flag(name: .long, help: "Print the report as JSON.")
        var json = false

        func run() throws {
            guard let report = try options.request(.planViolations, as: "plan-violations").planViolations else {
                throw Failure("whend sent no plan violations: is it older than this whenctl?")
            }
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                print(String(decoding: try encoder.encode(report), as: UTF8.self))
                return
            }
            print(
                report.plan.isEmpty
                    ? "no tracking plan (tracking_plan is not set)" : "plan \(report.plan), mode \(report.mode)")
            if report.counts.isEmpty { print("no violation since whend started") }
            for c in report.counts {
                print("\(c.count) \(c.event.isEmpty ? "(unplanned)" : printable(c.event)) \(c.rule)")
            }
            if !report.latest.isEmpty { print("latest:") }
            for e in report.latest {
                let app = e.app.map { printable($0) } ?? "-"
                print("\(e.time) \(e.stored ? "stored" : "refused") app=\(app): \(printable(e.message))")
                print("  " + printable(e.line))
            }
        }
    }
}
