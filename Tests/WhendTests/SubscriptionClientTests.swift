import Foundation
import TestScratch
import Testing
import WhenClient
import WhendWire

/// whenctl running with `arguments` (and `environment`, else this process's), its standard
/// output and error on pipes.
func startWhenctl(_ arguments: [String], environment: [String: String]? = nil) throws -> (Process, Pipe, Pipe) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable("whenctl"))
    p.arguments = arguments
    if let environment { p.environment = environment }
    let out = Pipe()
    let err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    return (p, out, err)
}

/// The subscription's two clients: `whenctl tail -f` and WhenClient's `WhendSubscription`.
@Suite(.serialized) struct SubscriptionClientTests {
    /// `tail -f` on whend's socket prints each record once, in order, across a restart of whend.
    @Test func tailFollowsThroughASubscriptionAcrossARestart() throws {
        let daemon = TestDaemon("tail-subscribe")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "a", session: "s", (1...20).map { #"{"type":"when","name":"early\#($0)"}"# })
        let (p, out, err) = try startWhenctl([
            "tail", "-f", "-n", "3", "--type", "when", "--state-dir", daemon.stateDirectory, "--socket",
            daemon.socketPath,
        ])
        defer { if p.isRunning { p.terminate() } }
        usleep(300_000)
        try sendSession(daemon, app: "a", session: "s", (1...30).map { #"{"type":"when","name":"before\#($0)"}"# })
        usleep(300_000)
        daemon.stop()
        try daemon.start()
        try sendSession(daemon, app: "a", session: "s", (1...30).map { #"{"type":"when","name":"after\#($0)"}"# })
        var names: [String] = []
        readLines(from: out.fileHandleForReading.fileDescriptor, until: Date().addingTimeInterval(15)) { line in
            if let name = (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["name"]
                as? String
            {
                names.append(name)
            }
            return names.count < 63
        }
        p.terminate()
        #expect(eventually(5) { !p.isRunning })
        p.end(within: 5)  // before reading to its end: one that ran on would hold the read
        #expect(
            names == ["early18", "early19", "early20"] + (1...30).map { "before\($0)" } + (1...30).map { "after\($0)" })
        let said = String(decoding: err.fileHandleForReading.availableData, as: UTF8.self)
        #expect(said.contains("resuming after _seq 50"), "\(said)")
    }

    /// `tail -f --to N` ends once whend has examined N, even when the filters pass nothing
    /// after it (as it ends reading the files).
    @Test func tailToEndsThroughASubscription() throws {
        let daemon = TestDaemon("tail-subscribe-to")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "a", session: "s", (1...3).map { #"{"type":"when","name":"n\#($0)"}"# })
        let (p, out, _) = try startWhenctl([
            "tail", "-f", "-n", "10", "--to", "6", "--type", "when", "--state-dir", daemon.stateDirectory, "--socket",
            daemon.socketPath,
        ])
        defer { if p.isRunning { p.terminate() } }
        usleep(300_000)
        try sendSession(
            daemon, app: "a", session: "s",
            [#"{"type":"when","name":"n4"}"#] + (1...5).map { _ in #"{"type":"error","message":"m"}"# })
        #expect(eventually(10) { !p.isRunning }, "tail -f --to 6 ended once _seq 6 was examined")
        p.end(within: 5)  // before reading to its end: one that ran on would hold the read
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(text.split(separator: "\n").count == 4)
    }

    /// `tail -f --socket` with no journal named takes everything from that whend: the last
    /// matches of its catch-up, then the live ones. It used to read the last ones from the
    /// default journal, another daemon's or none ("no journal at …"). And its short form shows
    /// a client's control characters escaped, never as a terminal would act on them.
    @Test func tailFollowsThroughTheSocketAloneAndEscapesControlCharacters() throws {
        let daemon = TestDaemon("tail-socket-only")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "a", session: "s", (1...10).map { #"{"type":"when","name":"n\#($0)"}"# })
        // No journal where whenctl would look by default.
        let elsewhere = ScratchDirectory.make("tail-socket-only-home")
        let (p, out, err) = try startWhenctl(
            ["tail", "-f", "-n", "3", "--to", "14", "-o", "short", "--socket", daemon.socketPath],
            environment: ["HOME": elsewhere, "XDG_STATE_HOME": elsewhere + "/state", "PATH": "/usr/bin:/bin"])
        defer { if p.isRunning { p.terminate() } }
        usleep(300_000)
        try sendSession(
            daemon, app: "a", session: "s",
            (11...13).map { #"{"type":"when","name":"n\#($0)"}"# } + [
                #"{"type":"error","message":"\u001b[2J\u202egone"}"#
            ])
        #expect(eventually(10) { !p.isRunning }, "tail -f --to 14 ended once _seq 14 was examined")
        p.end(within: 5)  // before reading to its end: one that ran on would hold the read
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let problems = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let lines = text.split(separator: "\n")
        #expect(
            lines.map { $0.split(separator: " ").last.map(String.init) ?? "" }
                == ["n8", "n9", "n10", "n11", "n12", "n13", #"\x1b[2J\u{202e}gone"#], "\(text)\(problems)")
        #expect(!text.utf8.contains(0x1B) && !text.unicodeScalars.contains("\u{202E}"))
    }

    /// An app's tool reads records with `for try await`: the journal, caught up, then live.
    @Test func whenClientReadsTheJournalThenLiveRecords() async throws {
        let daemon = TestDaemon("whenclient-subscribe")
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(daemon, app: "a", session: "s", (1...5).map { #"{"type":"when","name":"n\#($0)"}"# })
        let subscription = WhendSubscription(
            .init(start: .oldest, names: ["n2", "n4", "live"]), socketPath: daemon.socketPath)
        var seen: [String] = []
        var caughtUp: UInt64?
        for try await element in subscription {
            switch element {
            case .record(_, let json):
                let name = (try JSONSerialization.jsonObject(with: json) as? [String: Any])?["name"] as? String
                seen.append(name ?? "?")
                if name == "live" { break }
            case .caughtUp(let seq):
                caughtUp = seq
                try sendSession(daemon, app: "a", session: "s", [#"{"type":"when","name":"live"}"#])
            case .checkpoint, .gap: continue
            }
            if seen.last == "live" { break }
        }
        #expect(seen == ["n2", "n4", "live"])
        #expect(caughtUp == 5)
        // A request whend cannot honour is an error thrown, with whend's reason.
        await #expect(throws: WhendSubscription.Refused.self) {
            for try await _ in WhendSubscription(
                .init(start: .after(1), app: String(repeating: "x", count: 300)), socketPath: daemon.socketPath)
            {}
        }
    }
}

/// whend closed (or was killed) in the middle of a record: the piece that came is not a record.
/// A reader that took it would resume after it, and the record would never be shown.
@Suite struct SubscriptionReaderTests {
    @Test func aLineCutByTheEndOfTheConnectionIsNotARecord() throws {
        let path = scratchDirectory("reader-cut") + "/events.sock"
        let listener = try UnixTestListener(path: path)
        let served = listener.serveOne { fd in
            var request = [UInt8](repeating: 0, count: 4096)
            _ = recv(fd, &request, request.count, 0)
            let answer =
                Array(#"{"subscribed":{"protocol":1,"after":4}}"#.utf8) + [0x0A]
                + Array(#"{"_seq":5,"type":"when","name":"whole"}"#.utf8) + [0x0A]
                + Array(#"{"_seq":6,"type":"when","na"#.utf8)
            _ = answer.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            close(fd)
        }
        var request = SubscribeRequest()
        request.start = .after(4)
        let reader = try SubscriptionReader(path: path, request: request)
        var events: [SubscriptionReader.Event] = []
        while let event = try reader.next() { events.append(event) }
        served.wait()
        #expect(
            events == [
                .subscribed(after: 4), .record(seq: 5, line: Array(#"{"_seq":5,"type":"when","name":"whole"}"#.utf8)),
            ])
    }
}
