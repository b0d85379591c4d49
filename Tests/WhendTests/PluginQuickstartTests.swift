import Foundation
import Testing

/// The plugin guide's quickstart (docs/writing-plugins.md), run as written from a fresh home:
/// its package and plugin source written from the guide's own blocks, built by SwiftPM against
/// the checkout by path, replayed, loaded beside the built-in pipelines, its counters read
/// (how the guide is read: `RunnableDocument`).
///
/// The checkout is `~/src/whend`, as the guide has it: a directory that links to this
/// repository's files, and whose `.build/release` is what the tests were built into (whend,
/// whenctl, whend-demo and the built-in plugins), so the guide's first build (the whole of
/// whend in release) is the one this test already has. The plugin's own build is real and
/// from nothing: SwiftPM resolves whend's dependencies and compiles the SDK.
@Suite(.serialized) struct PluginQuickstartTests {
    @Test func thePluginQuickstartRunsAsWritten() throws {
        let guide = try RunnableDocument(
            "docs/writing-plugins.md", section: "## Quickstart from a checkout", markerPrefix: "quickstart")
        #expect(
            guide.files.map(\.path).sorted() == [
                "~/src/screen-milestones/Package.swift",
                "~/src/screen-milestones/Sources/ScreenMilestones/ScreenMilestones.swift",
            ])
        #expect(guide.steps.filter { $0.command == "swift build -c release" }.count == 2)

        let dir = scratchDirectory("quickstart")
        let home = dir + "/home"
        let checkout = home + "/src/whend"
        let files = FileManager.default
        try files.createDirectory(atPath: checkout + "/.build", withIntermediateDirectories: true)
        for entry in try files.contentsOfDirectory(atPath: repositoryRoot)
        where !entry.hasPrefix(".build") && entry != ".git" {
            try files.createSymbolicLink(
                atPath: checkout + "/" + entry, withDestinationPath: repositoryRoot + "/" + entry)
        }
        let products = (executable("whend") as NSString).deletingLastPathComponent
        try files.createSymbolicLink(atPath: checkout + "/.build/release", withDestinationPath: products)
        for file in guide.files {
            let path = home + file.path.dropFirst(1)
            try files.createDirectory(
                atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try file.contents.write(toFile: path, atomically: true, encoding: .utf8)
        }

        var builtWhend = false
        try guide.run(in: home, environment: RunnableDocument.freshEnvironment(home: home), timeout: 900) { step in
            // The first build is whend's, done already; the second, the plugin's, runs.
            guard step.command == "swift build -c release", !builtWhend else { return nil }
            builtWhend = true
            return "ls .build/release/whend .build/release/libscreen-tracking.so > /dev/null"
        }
        // The plugin's build holds copies of whend's dependencies: a few hundred megabytes.
        try? files.removeItem(atPath: dir)
    }
}
