import Foundation
import Testing
import WhendJournal
import WhendWire

/// What a plugin returns, however it is written, is stored as one canonical line: a C plugin
/// that pretty-prints (line breaks, tabs, spaces, escapes spelled out) as ingest middleware or
/// as a pipeline stage, 100 acknowledged events, `whenctl verify`, a SIGKILL and a restart.
@Suite(.serialized) struct PluginOutputTests {
    /// whenctl with its output and errors in files: a journal with many problems writes more to
    /// stderr than a pipe holds, which `runCommand` (stdout read first) would wait on forever.
    func whenctlToFiles(_ arguments: [String], in directory: String) throws -> (
        status: Int32, output: String, error: String
    ) {
        let out = directory + "/whenctl.out"
        let err = directory + "/whenctl.err"
        let r = try runCommand(
            "/bin/sh", ["-c", "exec \"$0\" \"$@\" >'\(out)' 2>'\(err)'", executable("whenctl")] + arguments)
        return (
            r.status, (try? String(contentsOfFile: out, encoding: .utf8)) ?? "",
            (try? String(contentsOfFile: err, encoding: .utf8)) ?? ""
        )
    }

    /// `"pretty"` as the fixture writes it, as a stored record holds it.
    static let prettyStored = #""pretty":{"a":[1,2],"s":"café / 😀"}"#

    /// A daemon whose configuration loads the `pretty` fixture, built with `defines`.
    func prettyDaemon(_ name: String, defines: [String], settings: String) throws -> TestDaemon {
        let daemon = TestDaemon.live(name)  // killed mid-stream (`expectSurvivesACrash`)
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildTestPlugin("pretty", into: plugins, name: "pretty", defines: defines)
        let config = daemon.directory + "/whend.conf"
        try "plugin_dirs = \(plugins)\n\(settings)\n".write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        return daemon
    }

    /// Every line `whenctl cat` prints, which must each be one JSON object.
    func catLines(_ daemon: TestDaemon) throws -> [String] {
        let cat = try whenctlToFiles(["cat", "--state-dir", daemon.stateDirectory], in: daemon.directory)
        #expect(cat.status == 0, "\(cat.error)")
        let lines = cat.output.split(separator: "\n").map(String.init)
        let broken = lines.filter { (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]) == nil }
        #expect(broken.isEmpty, "\(broken.count) of \(lines.count) lines are no record, e.g. \(broken.prefix(2))")
        return lines
    }

    func expectVerifies(_ daemon: TestDaemon) throws {
        let verify = try whenctlToFiles(["verify", "--state-dir", daemon.stateDirectory], in: daemon.directory)
        #expect(verify.status == 0, "\(verify.output.prefix(300))\(verify.error.prefix(300))")
    }

    /// The journal after a SIGKILL and a restart holds what it held before, the same records
    /// with the same `_seq`s, and the next event gets the next `_seq`.
    func expectSurvivesACrash(_ daemon: TestDaemon, before: [String]) throws {
        daemon.crash()
        try daemon.start()
        let next = try exchange(daemon.socketPath, [helloWithAcks, #"{"type":"screen","name":"After"}"#])
        #expect(next.acks == [1])
        #expect(daemon.stop() == 0)
        try expectVerifies(daemon)
        let lines = try catLines(daemon)
        #expect(Array(lines.prefix(before.count)) == before)
        let seqs = daemon.records().compactMap { $0["_seq"] as? Int }
        #expect(seqs == Array(1...seqs.count), "\(seqs.prefix(10))")
        let after = daemon.records().filter { $0["name"] as? String == "After" }
        #expect(after.count == 1 && (after.first?["_seq"] as? Int ?? 0) > before.count)
    }

    @Test func anIngestPluginThatPrettyPrintsIsStoredOneLineAndNothingAckedIsLost() throws {
        let daemon = try prettyDaemon("pretty-in", defines: [], settings: "ingest = pretty")
        try daemon.start()
        // Spaces and an escape of the client's own, too: stored canonical.
        let events = (1...100).map { #"{"type":"when", "name":"tick","params":{"i": \#($0),"e":"\u0041"}}"# }
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + events)
        #expect(answers.errors.isEmpty, "\(answers.errors)")
        #expect(answers.acks.last == 100)

        try expectVerifies(daemon)
        let lines = try catLines(daemon)
        #expect(lines.count == 100)
        let unexpected = lines.enumerated().filter { i, line in
            !line.hasPrefix(#"{"_seq":\#(i + 1),"# + Self.prettyStored + #","type":"when","name":"tick""#)
                || !line.contains(#""params":{"i":\#(i + 1),"e":"A"}"#)
        }
        #expect(unexpected.isEmpty, "\(unexpected.count) records not as expected, e.g. \(unexpected.prefix(1))")
        try expectSurvivesACrash(daemon, before: lines)
    }

    @Test func aPipelinePluginThatDerivesPrettyRecordsHasThemStoredOneLineAndNothingIsLost() throws {
        let daemon = try prettyDaemon(
            "pretty-pipe", defines: ["-DPRETTY_PIPELINE"], settings: "pipeline.pp = pretty")
        try daemon.start()
        let events = (1...100).map { #"{"type":"when","name":"derive","params":{"i":\#($0)}}"# }
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + events)
        #expect(answers.errors.isEmpty, "\(answers.errors)")
        #expect(answers.acks.last == 100)
        // Derived records follow their causes: the pipeline has passed all 200.
        #expect(try daemon.waitForPipeline("pp", cursor: 200))

        try expectVerifies(daemon)
        let lines = try catLines(daemon)
        let derived = lines.filter { $0.contains(#""_origin":"pretty""#) }
        #expect(derived.count == 100, "\(lines.suffix(3))")
        let unexpected = derived.filter {
            !$0.contains(#""type":"when","name":"derived","params":{"# + Self.prettyStored + #","from":"#)
        }
        #expect(unexpected.isEmpty, "\(unexpected.count) records not as expected, e.g. \(unexpected.prefix(1))")
        try expectSurvivesACrash(daemon, before: lines)
    }
}

/// The plugin guide's C ingest filter (docs/writing-plugins.md), compiled as printed (its code
/// block and its `cc` line) and loaded as the guide's configuration loads it: a space, an escape or the same key nested
/// before the top-level one does not get an event past it.
@Suite(.serialized) struct ReadmeDenyAppsTests {
    /// The first code block of `language` after `heading` in the plugin guide.
    static func readmeBlock(after heading: String, language: String) throws -> String {
        let readme = try String(contentsOfFile: DocumentationTests.root + "/docs/writing-plugins.md", encoding: .utf8)
        guard let section = readme.range(of: "\n" + heading + "\n"),
            let open = readme.range(of: "\n```" + language + "\n", range: section.upperBound..<readme.endIndex),
            let close = readme.range(of: "\n```\n", range: open.upperBound..<readme.endIndex)
        else { throw TestFailure(description: "no ```\(language) block after \(heading) in docs/writing-plugins.md") }
        return String(readme[open.upperBound..<close.lowerBound]) + "\n"
    }

    @Test func theReadmesDenyAppsCannotBeEscapedBySpacesEscapesOrNesting() throws {
        let daemon = TestDaemon("deny-apps")
        let plugins = try pluginDirectory(in: daemon.directory)
        let source = try Self.readmeBlock(after: "## In C", language: "c")
        #expect(source.hasPrefix("/* deny-apps.c"))
        try source.write(toFile: daemon.directory + "/deny-apps.c", atomically: true, encoding: .utf8)
        // The guide's command, run in the repository, writing into the test's directory.
        let command = try Self.readmeBlock(after: "## In C", language: "sh")
            .replacingOccurrences(of: "deny-apps.c", with: daemon.directory + "/deny-apps.c")
            .replacingOccurrences(of: "/usr/lib/whend/plugins/", with: plugins + "/")
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(command.hasPrefix("cc -shared"))
        let built = try runCommand(
            "/bin/sh", ["-c", "cd '\(DocumentationTests.root)' && " + command + " -Wall -Werror"])
        #expect(built.status == 0, "\(built.error)")
        let config = daemon.directory + "/whend.conf"
        let loading = try Self.readmeBlock(after: "## Loading them", language: "")
            .split(separator: "\n").filter { $0.contains("deny-apps") }.joined(separator: "\n")
        #expect(loading.contains("ingest = deny-apps") && loading.contains("com.example.spam"), "\(loading)")
        try "plugin_dirs = \(plugins)\n\(loading)\n".write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()

        let refused = [
            #"{"type":"screen","name":"A","app":"com.example.spam"}"#,
            #"{"type":"screen","name":"B","app": "com.example.spam"}"#,
            #"{"type":"screen","name":"C","app":"com.example.sp\u0061m"}"#,
            #"{"type":"screen","name":"D","app" :"\u0063om.example.spam" }"#,
            #"{"type":"screen","name":"E","context":{"app":"com.example.ok"},"app":"com.example.spam"}"#,
        ]
        let allowed = [
            #"{"type":"screen","name":"F","app":"com.example.ok","context":{"app":"com.example.spam"}}"#,
            #"{"type":"screen","name":"G","app":"com.example.spammer"}"#,
        ]
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + refused + allowed)
        #expect(answers.errors.map(\.code) == Array(repeating: "rejected", count: refused.count), "\(answers.errors)")
        #expect(answers.errors.map(\.event) == Array(1...refused.count))
        #expect(answers.errors.first?.message.contains("app \"com.example.spam\" may not emit here") == true)
        #expect(answers.acks.last == refused.count + allowed.count)
        // An app that says nothing of itself gets its hello's: the filter sees that one too.
        let viaHello = try exchange(
            daemon.socketPath,
            [#"{"hello":{"protocol":1,"app":"com.example.sp\u0061m","acks":true}}"#, #"{"type":"screen","name":"H"}"#])
        #expect(viaHello.errors.map(\.code) == ["rejected"])
        #expect(daemon.stop() == 0)
        #expect(daemon.records().compactMap { $0["name"] as? String } == ["F", "G"])
    }

    /// A plugin after another that changed the record sees it as it would be stored, canonical:
    /// the README's filter behind the pretty-printing fixture is not bypassed either.
    @Test func aPluginAfterOneThatPrettyPrintsSeesTheRecordCanonical() throws {
        let daemon = TestDaemon("deny-chain")
        let plugins = try pluginDirectory(in: daemon.directory)
        try Self.readmeBlock(after: "## In C", language: "c")
            .write(toFile: daemon.directory + "/deny-apps.c", atomically: true, encoding: .utf8)
        let root = DocumentationTests.root
        let built = try runCommand(
            "/usr/bin/cc",
            [
                "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I", root + "/Sources/CWhendPlugin/include",
                daemon.directory + "/deny-apps.c", "-o", plugins + "/libdeny-apps.so",
            ])
        #expect(built.status == 0, "\(built.error)")
        _ = try buildTestPlugin("pretty", into: plugins, name: "pretty")
        let config = daemon.directory + "/whend.conf"
        try """
        plugin_dirs = \(plugins)
        ingest = pretty, deny-apps
        plugin.deny-apps = {"apps": ["com.example.spam"]}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        let answers = try exchange(
            daemon.socketPath,
            [
                helloWithAcks, #"{"type":"screen","name":"A","app": "com.example.spam"}"#,
                #"{"type":"screen","name":"B","app":"com.example.ok"}"#,
            ])
        #expect(answers.errors.map(\.code) == ["rejected"], "\(answers.errors)")
        #expect(answers.errors.first?.message.contains("plugin deny-apps rejected the event") == true)
        #expect(answers.acks.last == 2)
        #expect(daemon.stop() == 0)
        let records = daemon.records()
        #expect(records.compactMap { $0["name"] as? String } == ["B"])
        #expect((records.first?["pretty"] as? [String: Any])?["s"] as? String == "café / 😀")
    }

    /// A plugin's counters (`host.count`) are its word: a name per record, names of 1000 bytes,
    /// sums past what an Int64 holds, a name quoting its configuration's token. As ingest
    /// middleware in whend itself, and as a pipeline stage in a worker, every event is still
    /// stored (adding past Int64.max trapped: whend died at the second event), the counters
    /// saturate, at most 256 names are kept, of at most 128 bytes each (a longer one is not
    /// counted), and the token is hidden wherever the counters show (it showed in `whenctl
    /// plugins` and the metrics). Both stages' counters show in both.
    @Test func aPluginsCountersAreBoundedAndSaturate() throws {
        let daemon = TestDaemon.live("counting")
        let plugins = try pluginDirectory(in: daemon.directory)
        _ = try buildTestPlugin("counting", into: plugins, name: "counting")
        // The pipeline's copy under another file name than the name its library gives itself.
        _ = try buildTestPlugin("counting", into: plugins, name: "counted")
        let config = daemon.directory + "/whend.conf"
        let token = "tok-\(UInt32.random(in: 0...UInt32.max))"
        try """
        plugin_dirs = \(plugins)
        ingest = counting
        pipeline.cp = counted
        plugin.counting = {"token": "\(token)"}
        plugin.counted = {"token": "\(token)"}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()
        defer { daemon.stop() }
        let events = (1...600).map { #"{"type":"when","name":"tick","id":"t\#($0)"}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 600)
        #expect(daemon.process?.isRunning == true, "\(daemon.log)")
        var listing = ""
        #expect(
            eventually {
                listing = (try? daemon.whenctl(["plugins"]).output) ?? ""
                return listing.contains("  counted: ") && listing.contains("records 600,")
                    && listing.components(separatedBy: "records 600,").count == 3
            }, "\(listing)")
        let json = try daemon.whenctl(["plugins", "--json"]).output
        let reply = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] ?? [:]
        let ingest = (reply["plugins"] as? [[String: Any]] ?? []).first { $0["name"] as? String == "counting" }
        let pipeline = (reply["pipelines"] as? [[String: Any]] ?? []).first { $0["name"] as? String == "cp" }
        let stages = [
            ingest?["counters"] as? [String: Any] ?? [:],
            (pipeline?["counters"] as? [String: Any])?["counted"] as? [String: Any] ?? [:],
        ]
        for counters in stages {
            #expect(counters.count == 256, "\(counters.count) counters")
            #expect((counters["records"] as? NSNumber)?.int64Value == 600)
            #expect((counters["huge"] as? NSNumber)?.int64Value == Int64.max)
            // Counted under a name that quotes its configuration: the token is hidden.
            #expect((counters[#"config {"token": "***"}"#] as? NSNumber)?.int64Value == 600, "\(counters.keys)")
            #expect((counters["tiny"] as? NSNumber)?.int64Value == Int64.min)
            #expect(counters.keys.allSatisfy { $0.utf8.count <= 128 })
            #expect(counters[String(repeating: "x", count: 128)] == nil, "a long name is not counted, not cut")
            // A longer name that begins with a counted one is not that one.
            #expect((counters[String(repeating: "A", count: 128)] as? NSNumber)?.int64Value == 600)
            // Bytes that are not UTF-8 show as U+FFFD, the name cut to 128 bytes: counted (60
            // such bytes made a name of 180, and whend killed the worker that sent it, forever).
            #expect((counters[String(repeating: "\u{FFFD}", count: 42)] as? NSNumber)?.int64Value == 600)
            // No control character shows, and no empty name.
            #expect((counters["new\u{FFFD}line\u{FFFD}[2J"] as? NSNumber)?.int64Value == 600)
            #expect(counters[""] == nil)
        }
        let metrics = try daemon.whenctl(["metrics"]).output
        // Nor any part of it where a name too long to count is cut in the warning about it.
        for output in [listing, json, metrics, daemon.log] { #expect(!output.contains(token.prefix(7))) }
        #expect(metrics.contains(#"whend_plugin_counts{plugin="counting",pipeline="",counter="records"} 600"#))
        #expect(metrics.contains(#"whend_plugin_counts{plugin="counted",pipeline="cp",counter="records"} 600"#))
        #expect(pipeline?["restarts"] as? Int == 0, "\(daemon.log)")
        let file = daemon.directory + "/metrics.txt"
        try metrics.write(toFile: file, atomically: true, encoding: .utf8)
        let check = try runCommand("/bin/sh", ["-c", "exec promtool check metrics < '\(file)'"])
        #expect(check.status == 0, "promtool: \(check.output)\(check.error)")
        #expect(daemon.log.components(separatedBy: "is not counted").count == 3, "said once per instance")
    }
}
