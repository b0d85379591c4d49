import Foundation
import Testing
import WhendConfiguration

/// Plugin configurations and secret references that whend refuses before they can hurt it or
/// leak: nested too deep, files that are not regular or too large, values that are not objects.
@Suite(.serialized) struct SecretBoundaryTests {
    /// A configuration nested deeper than the limit is refused by `--check-config` and by
    /// `whenctl reload` with a clear error, and the running whend keeps its configuration (every
    /// walker of a configuration recursed once a level: 10,000 levels overflowed the stack).
    @Test func aConfigurationNestedTooDeepIsRefusedAndTheDaemonLives() throws {
        let directory = scratchDirectory("secret-deep")
        let config = directory + "/whend.conf"
        try #"plugin.x = {"n": 1}"#.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon("secret-deep-d", arguments: ["--config", config])
        try daemon.start()
        defer { daemon.stop() }
        let depth = 10_000
        let deep =
            #"plugin.x = {"x": "# + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "}"
        try deep.write(toFile: config, atomically: true, encoding: .utf8)
        let check = try runCommand(executable("whend"), ["--config", config, "--check-config"])
        #expect(check.status == 2, "\(check.output) \(check.error)")
        #expect(check.error.contains("plugin.x") && check.error.contains("512"), "\(check.error)")
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status != 0, "\(reload.output)")
        #expect((reload.output + reload.error).contains("512"), "\(reload.output) \(reload.error)")
        // Alive, with the configuration it had.
        #expect(daemon.isRunning, "\(daemon.log)")
        let status = try daemon.whenctl(["status"])
        #expect(status.status == 0, "\(status.error)")
        // At the limit, it is taken.
        let limit = Secrets.maximumDepth - 1
        try (#"plugin.x = {"x": "# + String(repeating: "[", count: limit) + String(repeating: "]", count: limit) + "}")
            .write(toFile: config, atomically: true, encoding: .utf8)
        let taken = try daemon.whenctl(["reload"])
        #expect(taken.status == 0, "\(taken.output) \(taken.error)")
    }

    /// A plugin's value that is JSON but not an object is refused without quoting it.
    @Test func aPluginValueThatIsNotAnObjectIsNotQuoted() throws {
        let directory = scratchDirectory("secret-array")
        for value in [#"["LEAKME123"]"#, #"[{"a": "LEAKME123"}]"#] {
            try "plugin.analytics = \(value)\n".write(
                toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
            let check = try runCommand(executable("whend"), ["--config", directory + "/whend.conf", "--check-config"])
            #expect(check.status == 2, "\(check.output)")
            #expect(check.error.contains("plugin.analytics"), "\(check.error)")
            #expect(!(check.output + check.error).contains("LEAKME123"), "\(check.error)")
        }
    }

    /// `$file:` and `$credential:` read only regular files, at most 64 KiB: a device would be
    /// read without end, a FIFO would hold the reload until a writer came.
    @Test func onlyRegularFilesOfBoundedSizeAreRead() throws {
        let directory = scratchDirectory("secret-special")
        func failure(_ path: String) -> String {
            do {
                _ = try Secrets.resolveReferences(#"{"token": "$file:\#(path)"}"#, environment: [:])
                return "resolved"
            } catch {
                return error.description
            }
        }
        // A FIFO: were it opened blocking, only this writer (after 5 s) would let it go.
        let fifo = directory + "/fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        let writer = Thread {
            usleep(5_000_000)
            let fd = open(fifo, O_WRONLY | O_NONBLOCK)
            if fd >= 0 { close(fd) }
        }
        writer.start()
        let started = Date()
        #expect(failure(fifo).contains("not a regular file"))
        #expect(Date().timeIntervalSince(started) < 4, "the FIFO held the read")
        #expect(failure("/dev/null").contains("not a regular file"))
        #expect(failure(directory).contains("not a regular file"))
        let large = directory + "/large"
        try String(repeating: "k", count: Secrets.maximumSecretSize + 1).write(
            toFile: large, atomically: true, encoding: .utf8)
        #expect(failure(large).contains("64 KiB"))
        // A symlink to a regular file is followed (systemd and container secrets are often links).
        let target = directory + "/target"
        try "s3cret-value\n".write(toFile: target, atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: directory + "/link", withDestinationPath: target)
        let (resolved, secrets) = try Secrets.resolveReferences(
            #"{"token": "$file:\#(directory)/link"}"#, environment: [:])
        #expect(secrets == ["s3cret-value"] && resolved.contains("s3cret-value"))
        // The same for a credential.
        let credential = try? Secrets.resolveReferences(
            #"{"token": "$credential:fifo"}"#, environment: ["CREDENTIALS_DIRECTORY": directory])
        #expect(credential == nil)
        while writer.isExecuting { usleep(100_000) }
    }

    /// A value read from a file is a secret wherever it is: here an endpoint carrying its API key
    /// in the query, quoted by the analytics worker's retry warnings while the endpoint refuses.
    @Test func aValueFromAFileIsScrubbedFromTheWorkersLog() throws {
        let server = try HTTPTestServer(answers: [.init(status: 503)])
        defer { server.stop() }
        let directory = scratchDirectory("secret-endpoint")
        let key = "SEKRET" + String(UInt32.random(in: 0...UInt32.max), radix: 36)
        try "http://127.0.0.1:\(server.port)/v1/batch?api_key=\(key)\n".write(
            toFile: directory + "/endpoint", atomically: true, encoding: .utf8)
        let config = directory + "/whend.conf"
        try """
        plugin.analytics = {"endpoint": "$file:\(directory)/endpoint", "file": null, "flush_interval": 0.2, "max_backoff": 0.2}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live(
            "secret-endpoint-d", arguments: ["--builtin-pipelines", "true", "--config", config])
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "com.example.k", session: "s", [#"{"type":"when","name":"x"}"#])
        // The endpoint got the key (the reference was read), and refused twice: warnings logged.
        #expect(eventually { server.requests.count >= 2 })
        #expect(eventually { daemon.log.contains("503") }, "\(daemon.log)")
        #expect(!daemon.log.contains(key), "\(daemon.log)")
    }

    /// A plugin that crashes while its configuration is in its registers: the backtrace of the
    /// processes that run plugin code (`--plugin-check`, pipeline workers) keeps its stack but
    /// dumps no registers, which printed the bytes they pointed at — the configuration's.
    @Test func aCrashingPluginsBacktraceDumpsNoRegisters() throws {
        let directory = scratchDirectory("secret-crash")
        let plugins = try pluginDirectory(in: directory)
        _ = try buildTestPlugin("recorder", into: plugins, name: "recorder")
        let token = "crashtok" + String(UInt32.random(in: 0...UInt32.max), radix: 36)
        let config = directory + "/whend.conf"
        try """
        plugin_dirs = \(plugins)
        pipeline.rec = recorder
        plugin.recorder = {"create_crashes":true, "token": "\(token)"}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let check = try runCommand(executable("whend"), ["--check-config", "--config", config])
        let checked = check.output + check.error
        #expect(check.status == 2 && checked.contains("signal 11"), "\(checked)")
        #expect(!checked.contains("Registers:") && !checked.contains(token), "\(checked)")

        try """
        plugin_dirs = \(plugins)
        pipeline.rec = recorder
        plugin.recorder = {"crash_at": 1, "token": "\(token)"}
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live("secret-crash-d", arguments: ["--config", config])
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "com.example.c", session: "s", [#"{"type":"when","name":"x"}"#])
        // The worker's crash, with its backtrace, is in whend's log.
        #expect(eventually { daemon.log.contains("crashed") }, "\(daemon.log)")
        #expect(!daemon.log.contains("Registers:") && !daemon.log.contains(token), "\(daemon.log)")
    }

    /// The walker of configurations takes as JSON what `Settings` takes (Foundation's reader),
    /// no more: a lone surrogate, a number beyond a Double and a nesting deeper than the limit
    /// are not shown; and nothing of a configuration it cannot read is.
    @Test func theRedactorReadsWhatSettingsReads() throws {
        let limit = Secrets.maximumDepth
        let texts = [
            #"{"a": "\ud800"}"#, #"{"a": "\udc00\ud800"}"#, #"{"a": "\ud83d\ude00"}"#, #"{"a": 1e400}"#,
            #"{"a": -1.8e308}"#, #"{"a": 1.7976931348623157e308}"#, #"{"a": 01}"#, #"{"a": 1.}"#, "{\"a\": \"x\ty\"}",
            #"{"a": "\x"}"#, #"{"a": 1} x"#, #"{"a": 123456789012345678901234567890}"#,
            #"{"a": "\u0000\/"}"#, #" {"a": [true, false, null]} "#,
        ]
        for text in texts {
            let read = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) != nil
            #expect((Secrets.redact(text) != nil) == read, "\(text)")
        }
        func nested(_ depth: Int) -> String {
            #"{"token": 7, "a": "# + String(repeating: "[", count: depth - 1) + String(repeating: "]", count: depth - 1)
                + "}"
        }
        #expect(Secrets.redact(nested(limit)) == #"{"token": "***""# + nested(limit).dropFirst(#"{"token": 7"#.count))
        #expect(Secrets.redact(nested(limit + 1)) == nil)
        #expect(
            Secrets.shown(key: "plugin.x", value: #"{"a": "\ud800", "token": "LEAKME1"}"#) == "(not shown: not JSON)")
        // What Foundation alone would take is refused where the file is read, naming the key
        // and not the value: a secret after a trailing comma was neither resolved nor hidden.
        let file = scratchDirectory("cfg-comma") + "/whend.conf"
        try #"plugin.x = {"a": [1,], "token": "LEAKME2"}"#.appending("\n").write(
            toFile: file, atomically: true, encoding: .utf8)
        #expect((try? JSONSerialization.jsonObject(with: Data(#"{"a": [1,], "token": "LEAKME2"}"#.utf8))) != nil)
        do {
            _ = try DaemonConfiguration.resolve(file: file, environment: [:])
            Issue.record("a trailing comma was taken")
        } catch {
            #expect(error.description.contains("plugin.x") && !error.description.contains("LEAKME2"), "\(error)")
        }
    }
}
