import Foundation
import Testing
import WhendWire

/// Builds the C test plugin with the system's compiler, against the ABI header.
func buildGatePlugin(into directory: String, name: String, defines: [String] = []) throws -> String {
    let root = DocumentationTests.root
    let output = directory + "/lib\(name).so"
    let r = try runCommand(
        "/usr/bin/cc",
        ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I", root + "/Sources/CWhendPlugin/include"] + defines + [
            root + "/Tests/Fixtures/gate.c", "-o", output,
        ])
    guard r.status == 0 else { throw TestFailure(description: "cc failed: \(r.error)") }
    return output
}

@Suite(.serialized) struct PluginTests {
    /// The Swift redact plugin (built by `swift build` through the SDK) and the C gate plugin
    /// (built here with cc), loaded with dlopen into a running daemon as ingest middleware.
    @Test func swiftAndCPluginsChangeDropAndRejectBeforeTheJournal() throws {
        let daemon = DaemonProcess("plugins")
        let plugins = daemon.directory + "/plugins"
        try FileManager.default.createDirectory(atPath: plugins, withIntermediateDirectories: true)
        chmod(plugins, 0o755)
        _ = try buildGatePlugin(into: plugins, name: "gate")
        let marker = daemon.directory + "/old-plugin-ran"
        _ = try buildGatePlugin(
            into: plugins, name: "old", defines: ["-DGATE_ABI=2", "-DGATE_MARKER=\"\(marker)\""])
        let builtPlugins = (executable("whend") as NSString).deletingLastPathComponent
        let config = daemon.directory + "/whend.conf"
        func configure(ingest: String) throws {
            try """
            plugin_dirs = \(plugins):\(builtPlugins)
            ingest = \(ingest)
            plugin.redact = {"fields": ["email", "password"]}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        }
        try configure(ingest: "gate, redact")
        daemon.environment = ["WHEND_CONFIG": config]
        try daemon.start()

        let events = [
            #"{"type":"when","name":"changeEmail","params":{"email":"ann@example.com","password":"x","step":1}}"#,
            #"{"type":"when","name":"debugTrace","params":{"email":"ann@example.com"}}"#,
            #"{"type":"when","name":"forbidden"}"#,
            #"{"type":"screen","name":"Settings","id":"s-1"}"#,
        ]
        let answers = try exchange(daemon.socketPath, [helloWithAcks] + events)
        #expect(answers.acks.last == 4)
        #expect(answers.errors.map(\.code) == ["rejected"])
        #expect(answers.errors.first?.event == 3)
        #expect(answers.errors.first?.message.contains("gate") == true)
        #expect(answers.errors.first?.message.contains("forbidden events are not allowed here") == true)

        let listed = try daemon.whenctl(["plugins"])
        #expect(listed.status == 0 && listed.output.contains("redact 1.0.0 (ABI 1)"), "\(listed.output)")
        // The counter the C plugin keeps through the host: it saw all four events.
        #expect(listed.output.contains("gate 0.1.0 (ABI 1) running in ingest; seen 4"), "\(listed.output)")

        // An ABI this whend does not speak: refused with the reason, never called; the daemon
        // carries on with the chain it had.
        try configure(ingest: "old")
        let refused = try daemon.whenctl(["reload"])
        #expect(refused.status == 1)
        #expect(refused.error.contains("built for plugin ABI 2; this whend speaks ABI 1"), "\(refused.error)")
        #expect(!FileManager.default.fileExists(atPath: marker))
        #expect(try exchange(daemon.socketPath, [helloWithAcks, events[0]]).acks == [1])

        // A plugin directory others may write is refused.
        chmod(plugins, 0o777)
        try configure(ingest: "gate")
        let unsafe = try daemon.whenctl(["reload"])
        #expect(unsafe.status == 1 && unsafe.error.contains("others may write it"), "\(unsafe.error)")
        chmod(plugins, 0o755)
        #expect(daemon.stop() == 0)

        // The journal: the changed event without its secrets but with its trusted fields, the
        // screen; not the dropped or the rejected one.
        let records = daemon.records()
        #expect(records.map { $0["name"] as? String } == ["changeEmail", "Settings", "changeEmail"])
        let journalText = try runCommand(executable("whenctl"), ["cat", "--state-dir", daemon.stateDirectory]).output
        #expect(!journalText.contains("ann@example.com") && !journalText.contains("password"))
        #expect((records[0]["params"] as? [String: Any])?["step"] as? Int == 1)
        #expect(records[0]["_pid"] as? Int == Int(getpid()) && records[0]["_comm"] != nil)
    }

    @Test func aPluginThatWillNotStartStopsTheDaemonFromStarting() throws {
        let builtPlugins = (executable("whend") as NSString).deletingLastPathComponent
        let directory = scratchDirectory("plugin-bad")
        let r = try runCommand(
            executable("whend"),
            [
                "--socket", directory + "/events.sock", "--state-dir", directory + "/state",
            ],
            environment: ["WHEND_PLUGIN_DIRS": builtPlugins, "WHEND_INGEST": "redact"])
        #expect(r.status == 1)
        #expect(r.error.contains("plugin redact would not start") && r.error.contains("fields"), "\(r.error)")
    }
}
