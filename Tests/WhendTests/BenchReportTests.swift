import Foundation
import Testing

/// `make bench` writes its figures into BENCHMARKS.md and the README through
/// `Benchmarks/record-report.sh`: the run between BENCHMARKS.md's markers, the headline between
/// the README's, and nothing else of either file changed.
@Suite struct BenchReportTests {
    let report = """
        whend as shipped beside rsyslog — 1000010 events, medians of 2 rounds
        whend as it ships (embedded defaults: the four built-in pipelines on), 4 connections, acks and fsync:
          ingest: 438111 events/s (0.65 × rsyslog 678855 events/s), CPU of whend and its workers 7.74 µs/event, daemon peak RSS 100.3 MiB
          end to end (first byte → every pipeline's lag 0): 250440 events/s (0.37 × rsyslog); 355583 derived records
          the whole service's PSS (whend and its workers): idle 26.3 MiB, after the run 175.9 MiB (whend 49.9, analytics+crashes+screens+sessions 126.1), 11 s later 169.0 MiB (whend 49.9)

        """

    @Test func theRunGoesBetweenTheMarkersAndNothingElseChanges() throws {
        let directory = scratchDirectory("bench-report")
        for name in ["README.md", "BENCHMARKS.md"] {
            try FileManager.default.copyItem(atPath: repositoryRoot + "/" + name, toPath: directory + "/" + name)
        }
        let reportPath = directory + "/report.txt"
        try report.write(toFile: reportPath, atomically: true, encoding: .utf8)
        let readmeBefore = try String(contentsOfFile: directory + "/README.md", encoding: .utf8)
        let benchmarksBefore = try String(contentsOfFile: directory + "/BENCHMARKS.md", encoding: .utf8)

        // Twice: a second run replaces the first, it does not add to it.
        for _ in 0..<2 {
            let run = try runCommand(
                repositoryRoot + "/Benchmarks/record-report.sh", [reportPath, "make bench BENCH_ONLY=shipped"],
                environment: ["DOCS_DIR": directory])
            #expect(run.status == 0, "\(run.error)")
        }
        let readme = try String(contentsOfFile: directory + "/README.md", encoding: .utf8)
        let benchmarks = try String(contentsOfFile: directory + "/BENCHMARKS.md", encoding: .utf8)

        #expect(readme.contains("| ingest | 438111 events/s, 0.65 × rsyslog |"))
        #expect(readme.contains("| end to end, every pipeline caught up | 250440 events/s, 0.37 × rsyslog |"))
        #expect(readme.contains("| the whole service's memory (PSS) | idle 26.3 MiB, after the run 175.9 MiB |"))
        #expect(benchmarks.contains("Last run: `make bench BENCH_ONLY=shipped`, "))
        #expect(benchmarks.contains("  end to end (first byte → every pipeline's lag 0): 250440 events/s"))
        #expect(benchmarks.components(separatedBy: "Last run: `make bench").count == 2)
        #expect(outside(readme, "headline") == outside(readmeBefore, "headline"))
        #expect(outside(benchmarks, "last run") == outside(benchmarksBefore, "last run"))
    }

    /// The file without what lies between `<!-- make bench: NAME -->` and its end marker.
    private func outside(_ text: String, _ name: String) -> String {
        guard let begin = text.range(of: "<!-- make bench: \(name) -->\n"),
            let end = text.range(of: "<!-- make bench: end of \(name) -->", range: begin.upperBound..<text.endIndex)
        else { return "markers missing" }
        return String(text[..<begin.upperBound]) + String(text[end.lowerBound...])
    }
}
