import Foundation
import Testing
import WhendPluginHost

/// Each way a plugin fails to load says what kind of trouble it is, for whoever acts on it.
@Suite struct PluginLoadErrorTests {
    func kind(_ name: String, _ directories: [String]) -> PluginLoadError.Kind? {
        do {
            _ = try PluginLibrary.load(name: name, directories: directories)
            return nil
        } catch {
            return error.kind
        }
    }

    @Test func everyFailureToLoadSaysItsKind() throws {
        let parent = scratchDirectory("load-kinds")
        let plugins = try pluginDirectory(in: parent)
        #expect(kind("Not A Name", [plugins]) == .misconfigured)
        #expect(kind("anything", []) == .misconfigured)
        #expect(kind("absent", [plugins]) == .notFound)
        // Not a library at all: dlopen refuses it.
        try Data("not a library".utf8).write(to: URL(fileURLWithPath: plugins + "/libtext.so"))
        #expect(kind("text", [plugins]) == .cannotOpen)
        // A real library, not a whend plugin.
        let zstd = URL(fileURLWithPath: "/usr/lib/x86_64-linux-gnu/libzstd.so.1").resolvingSymlinksInPath().path
        try FileManager.default.copyItem(atPath: zstd, toPath: plugins + "/libzstdcopy.so")
        #expect(kind("zstdcopy", [plugins]) == .notAPlugin)
        // A directory others may write.
        chmod(plugins, 0o777)
        #expect(kind("zstdcopy", [plugins]) == .unsafe)
        chmod(plugins, 0o755)
        // One plugin under two names.
        try FileManager.default.copyItem(atPath: executable("libredact.so"), toPath: plugins + "/libredact.so")
        symlink(plugins + "/libredact.so", plugins + "/libalias.so")
        #expect(kind("redact", [plugins]) == nil)
        do {
            _ = try PluginLibrary.loadChain(["redact", "alias"], directories: [plugins])
            Issue.record("one library under two names was loaded twice")
        } catch {
            #expect(error.kind == .misconfigured, "\(error)")
        }

    }
}
