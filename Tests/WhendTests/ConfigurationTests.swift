import Foundation
import Testing
import WhendConfiguration
import WhendDaemon
import WhendPluginHost
import WhendWire

@Suite(.serialized) struct ConfigurationTests {
    func welcomedMaxEventBytes(_ daemon: TestDaemon) throws -> Int? {
        let answers = try exchange(daemon.socketPath, [helloWithAcks])
        return (answers.first?["welcome"] as? [String: Any])?["max_event_bytes"] as? Int
    }

    /// The embedded default, then the file, then the environment, then the flags.
    @Test func fileThenEnvironmentThenFlags() throws {
        let directory = scratchDirectory("config")
        let file = directory + "/whend.conf"
        try """
        # whend configuration
        max_event_bytes = 2048   # a comment after a value
        durability = "write"
        """.write(toFile: file, atomically: true, encoding: .utf8)

        let fromFile = TestDaemon("cfg-file", arguments: ["--config", file])
        try fromFile.start()
        #expect(try welcomedMaxEventBytes(fromFile) == 2048)
        fromFile.stop()

        let fromEnvironment = TestDaemon("cfg-env", arguments: ["--config", file])
        fromEnvironment.environment = ["WHEND_MAX_EVENT_BYTES": "4096"]
        try fromEnvironment.start()
        #expect(try welcomedMaxEventBytes(fromEnvironment) == 4096)
        fromEnvironment.stop()

        let fromFlag = TestDaemon("cfg-flag", arguments: ["--config", file, "--max-event-bytes", "8192"])
        fromFlag.environment = ["WHEND_MAX_EVENT_BYTES": "4096"]
        try fromFlag.start()
        #expect(try welcomedMaxEventBytes(fromFlag) == 8192)
        fromFlag.stop()
    }

    @Test func badConfigurationIsRefusedNamingTheKeyAndWhatIsAllowed() throws {
        let directory = scratchDirectory("badconfig")
        let whend = executable("whend")
        let unknown = directory + "/unknown.conf"
        try "durability = fsync\nmax_events = 5\n".write(toFile: unknown, atomically: true, encoding: .utf8)
        let r1 = try runCommand(whend, ["--config", unknown, "--check-config"])
        #expect(r1.status == 2)
        #expect(
            r1.error.contains("unknown.conf:2") && r1.error.contains("\"max_events\"")
                && r1.error.contains("max_event_bytes"))

        let invalid = directory + "/invalid.conf"
        try "durability = sometimes\n".write(toFile: invalid, atomically: true, encoding: .utf8)
        let r2 = try runCommand(whend, ["--config", invalid, "--check-config"])
        #expect(r2.status == 2)
        #expect(r2.error.contains("durability") && r2.error.contains("fsync, write or none"))

        let r3 = try runCommand(whend, ["--check-config"], environment: ["WHEND_DEDUP_WINDOW": "-3"])
        #expect(r3.status == 2)
        #expect(r3.error.contains("environment WHEND_DEDUP_WINDOW"))

        let r4 = try runCommand(whend, ["--check-config", "--socket-mode", "999"])
        #expect(r4.status == 2 && r4.error.contains("--socket-mode"))

        let good = directory + "/good.conf"
        try "socket = \"\(directory)/s.sock\"\nstate_dir = \(directory)/state\n".write(
            toFile: good, atomically: true, encoding: .utf8)
        let r5 = try runCommand(whend, ["--config", good, "--check-config"])
        #expect(r5.status == 0)
        #expect(r5.output.contains("configuration OK") && r5.output.contains("\(directory)/s.sock"))
        // --check-config starts nothing.
        #expect(!FileManager.default.fileExists(atPath: directory + "/s.sock"))
    }
}

/// Every setting is documented where users look: docs/configuration.md's table and the packaged file.
@Suite struct DocumentationTests {
    static let root: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.path
    }()

    /// whend's flags are the settings table: every key is a flag that takes its values, and
    /// `whend --help` (and so `man whend`) lists it.
    @Test func everySettingIsAFlagListedInTheHelp() throws {
        let whend = executable("whend")
        let help = try runCommand(whend, ["--help"]).output
        let scratch = scratchDirectory("flags")
        let empty = scratch + "/empty.conf"
        #expect(FileManager.default.createFile(atPath: empty, contents: Data()))
        let defaults = DaemonConfiguration(environment: ["HOME": scratch])
        var arguments = ["--check-config"]
        for setting in Settings.all {
            let flag = "--" + setting.key.replacingOccurrences(of: "_", with: "-")
            #expect(help.contains("\n" + flag + " <"), "whend --help does not list \(flag)")
            arguments += [flag, setting.value(defaults)]
        }
        let checked = try runCommand(whend, arguments, environment: ["WHEND_CONFIG": empty])
        #expect(checked.status == 0, "\(checked.error)")
        #expect(checked.output.contains("rate_limit_by = pid"))
        let typo = try runCommand(whend, ["--rate-limt", "5"])
        #expect(typo.status == 64 && typo.error.contains("unknown option '--rate-limt'"))
        // The usage says the settings are flags (it showed --config and --check-config alone).
        #expect(typo.error.contains("[--<setting> <value> ...]"), "\(typo.error)")
    }

    /// A newcomer follows links: every relative link in the documents reaches a file in the
    /// repository (the README once sent readers to documents outside it), and every document
    /// under docs/ is linked from the README.
    @Test func everyDocumentLinkReachesAFile() throws {
        let docs = try FileManager.default.contentsOfDirectory(atPath: Self.root + "/docs")
            .filter { $0.hasSuffix(".md") }.map { "docs/" + $0 }
        let documents = ["README.md", "ARCHITECTURE.md", "SECURITY.md", "BENCHMARKS.md"] + docs
        let link = try Regex(#"\]\(([^)#]*)(#[^)]*)?\)"#)
        for document in documents {
            let text = try String(contentsOfFile: Self.root + "/" + document, encoding: .utf8)
            let base = (Self.root + "/" + document as NSString).deletingLastPathComponent
            for match in text.matches(of: link) {
                guard let target = match.output[1].substring.map(String.init), !target.isEmpty,
                    !target.contains("://")
                else { continue }
                let path = (base + "/" + target as NSString).standardizingPath
                #expect(
                    FileManager.default.fileExists(atPath: path), "\(document) links to \(target), which is not there")
                #expect(path.hasPrefix(Self.root + "/"), "\(document) links outside the repository: \(target)")
            }
        }
        let readme = try String(contentsOfFile: Self.root + "/README.md", encoding: .utf8)
        for document in docs { #expect(readme.contains("](\(document))"), "the README does not link \(document)") }
    }

    @Test func everyKeyIsInTheConfigurationGuideAndTheDefaultConfiguration() throws {
        let readme = try String(contentsOfFile: Self.root + "/docs/configuration.md", encoding: .utf8)
        let packaged = try String(contentsOfFile: Self.root + "/packaging/whend.conf", encoding: .utf8)
        let defaults = DaemonConfiguration(environment: [:])
        for setting in Settings.all {
            #expect(readme.contains("| `\(setting.key)` |"), "docs/configuration.md has no row for \(setting.key)")
            #expect(packaged.contains("\n#\(setting.key) = "), "packaging/whend.conf does not show \(setting.key)")
            // The packaged file shows the embedded default (paths differ under systemd, and the
            // plugin directories are found beside whend's own binary).
            if (setting.reload == .live || setting.key == "dedup_window") && !setting.value(defaults).isEmpty
                && setting.key != "plugin_dirs"
            {
                #expect(
                    packaged.contains("\n#\(setting.key) = \(setting.value(defaults))\n"),
                    "packaging/whend.conf shows another default for \(setting.key) than \(setting.value(defaults))")
            }
        }
    }

    /// The packaged file, uncommented, is a valid configuration.
    @Test func theDefaultConfigurationParsesWhenUncommented() throws {
        let packaged = try String(contentsOfFile: Self.root + "/packaging/whend.conf", encoding: .utf8)
        let uncommented = packaged.split(separator: "\n")
            .filter { $0.hasPrefix("#") && $0.dropFirst().first?.isLowercase == true && $0.contains(" = ") }
            .map { $0.dropFirst() }.joined(separator: "\n")
        var configuration = DaemonConfiguration(environment: [:])
        try Settings.apply(try Settings.parse(uncommented, path: "whend.conf"), to: &configuration)
        #expect(configuration.journal.durability == .fsync)
    }
}

@Suite struct ConfigurationFileTests {
    func parse(_ text: String) throws -> DaemonConfiguration {
        var configuration = DaemonConfiguration(environment: [:])
        try Settings.apply(try Settings.parse(text, path: "t.conf"), to: &configuration)
        return configuration
    }

    /// Found by FuzzConfiguration: a socket path of one control character made the control
    /// socket's path trap inside Foundation. Paths must now be absolute, and the control
    /// socket's path is worked out by bytes.
    @Test func fuzzRegressionARelativeSocketPathWithAControlCharacter() throws {
        let input = String(
            decoding: [0x73, 0x6F, 0x63, 0x6B, 0x65, 0x74, 0x20, 0x3D, 0x1F, 0x23, 0xFF, 0x2E], as: UTF8.self)
        #expect(throws: SettingError.self) { try parse(input) }
        #expect(SocketLocation.controlSocket(besideEventSocket: "\u{1f}") == "control.sock")
        #expect(SocketLocation.controlSocket(besideEventSocket: "/run/whend/events.sock") == "/run/whend/control.sock")
    }

    /// Found by FuzzConfiguration: a value ending in a quote that begins with a combining mark
    /// (U+0820) was written out quoted, `"\u{820}…\""`, and read back as no quoted value at all:
    /// the opening quote and the mark are one Character. Quotes are now found by scalars.
    @Test func fuzzRegressionAQuotedValueBeginningWithACombiningMark() throws {
        for value in ["\u{820}x\"", "a\"\u{301}b", "\"\u{301}", "#\u{301}"] {
            var c = DaemonConfiguration(environment: [:])
            try Settings.apply([SettingValue(key: "pipeline.p", value: value, source: "t")], to: &c)
            let rendered = Settings.render(c)
            #expect(try Settings.render(parse(rendered)) == rendered, "\(rendered)")
            #expect(try parse(rendered).pipelines["p"] == c.pipelines["p"], "\(rendered)")
        }
    }

    /// Only LF (or CRLF) ends a line, as for grep, an editor or a reviewer: a comment that holds
    /// another line break (U+2028, U+2029, NEL, a lone CR, VT, FF) followed by a setting is
    /// still all comment, and such a character inside a plugin's JSON string is part of it.
    @Test func onlyALineFeedEndsALine() throws {
        for breaker in ["\u{2028}", "\u{2029}", "\u{85}", "\r", "\u{0B}", "\u{0C}"] {
            let c = try parse("# durability stays fsync\(breaker)durability = none\ndurability = write\n")
            #expect(c.journal.durability == .write, "\(breaker.unicodeScalars.first!.value)")
            // In a JSON string, what JSON allows there unescaped (not the control characters).
            guard breaker.unicodeScalars.first!.value > 0x1F else { continue }
            let text = #"plugin.x = {"note": "a"# + breaker + #"b"}"# + "\n"
            #expect(try parse(text).pluginConfigurations["x"] == #"{"note": "a"# + breaker + #"b"}"#)
        }
        #expect(throws: SettingError.setTwice(source: "t.conf:3", key: "durability", firstLine: 1)) {
            try parse("durability = write\r\n# \u{2028}\ndurability = none\r\n")
        }
    }

    @Test func quotedValuesMayCarryHashesQuotesAndAComment() throws {
        let c = try parse(#"socket = "/tmp/a b/#c\"d\\.sock"   # the socket"# + "\r\ndurability = write\r\n")
        #expect(c.socketPath == #"/tmp/a b/#c"d\.sock"#)
        #expect(c.journal.durability == .write)
        // Written back out, it reads back the same.
        #expect(try Settings.render(parse(Settings.render(c))) == Settings.render(c))
        // Each mistake is its own case, which callers tell apart without reading the message.
        #expect(
            throws: SettingError.textAfterValue(
                source: "t.conf:1", key: "socket", text: "trailing", valueKind: "quoted")
        ) {
            try parse(#"socket = "/a" trailing"#)
        }
        #expect(throws: SettingError.unclosedQuote(source: "t.conf:1", key: "socket")) { try parse(#"socket = "/a\"#) }
        #expect(throws: SettingError.setTwice(source: "t.conf:2", key: "durability", firstLine: 1)) {
            try parse("durability = write\ndurability = none")
        }
        #expect(
            throws: SettingError.notAllowed(
                source: "t.conf:1", key: "durability", value: "often", allowed: "fsync, write or none")
        ) {
            try parse("durability = often")
        }
    }

    /// A plugin's JSON may hold `#` (a colour, a URL fragment, a secret) without quoting the
    /// whole value; a comment may follow it.
    @Test func aJSONValueRunsToItsClosingBracketHashesIncluded() throws {
        let c = try parse(
            #"plugin.analytics = {"write_key": "k#1", "endpoint": "http://127.0.0.1/#frag", "x": "a\"}#"}  # the key"#
                + "\npipeline.a = screen-tracking # one stage\n")
        #expect(
            c.pluginConfigurations["analytics"]
                == #"{"write_key": "k#1", "endpoint": "http://127.0.0.1/#frag", "x": "a\"}#"}"#)
        #expect(c.pipelines["a"] == ["screen-tracking"])
        #expect(
            throws: SettingError.textAfterValue(
                source: "t.conf:1", key: "plugin.x", text: "trailing", valueKind: "JSON")
        ) {
            try parse(#"plugin.x = {"a": "b"} trailing"#)
        }
        #expect(
            throws: SettingError.notJSON(
                source: "t.conf:1", key: "plugin.x", reason: "the value ends inside a container at its byte 10")
        ) {
            try parse(#"plugin.x = {"a": "b""#)
        }
        // Read as the wire's lines are: a trailing comma is refused where the file is read.
        #expect(
            throws: SettingError.notJSON(
                source: "t.conf:1", key: "plugin.x", reason: "expected a string at its byte 11")
        ) {
            try parse(#"plugin.x = {"a": "b",} # a comment"#)
        }
        // Only a plugin's value is read as JSON: another that merely starts like it stays as it was.
        let odd = try parse("socket = /tmp/[odd.sock\nplugin_dirs = /opt/{x}")
        #expect(try Settings.render(parse(Settings.render(odd))) == Settings.render(odd))
        #expect(odd.socketPath == "/tmp/[odd.sock" && odd.pluginDirectories == ["/opt/{x}"])
    }

    /// A chain holds one instance of a plugin: named twice, its `next` would re-enter it.
    @Test func aPluginNamedTwiceInOneChainIsRefused() throws {
        for text in ["ingest = redact, redact", "pipeline.p = screen-tracking, analytics, screen-tracking"] {
            #expect {
                try parse(text)
            } throws: { error in
                "\(error)".contains("each once")
            }
        }
        #expect(try parse("ingest = redact").ingestPlugins == ["redact"])
    }
}
