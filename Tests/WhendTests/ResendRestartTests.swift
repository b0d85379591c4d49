import Foundation
import Testing
import WhendJournal
import WhendPipelines
import WhendWire

/// What a whend that starts again treats as the first copies of resent events: records it can
/// count on after a power cut, client events only, each told apart as its stored record is.
/// Real whend processes, real plugins, and the power-cut file system
/// (Tests/Fixtures/powercut_fs.py).
@Suite(.serialized) struct ResendRestartTests {
    /// Events with ids and random padding, so that a few of them fill a small segment.
    static func noisyEvents(_ prefix: String, _ range: Range<Int>) -> String {
        range.map {
            #"{"type":"when","name":"step","id":"\#(prefix)-\#($0)","params":{"pad":"\#(noise(300))"}}"# + "\n"
        }
        .joined()
    }

    /// whend is SIGKILLed while its sync thread, behind the writer, has not synced the sealed
    /// segments that hold events it was sent (held still by Tests/Fixtures/syncgate.c: those
    /// syncs never happen, as when the kill comes first). The next whend rebuilds its resend
    /// window from those records and acknowledges the client's resends as duplicates: by then
    /// their first copies must be durable, or a power cut loses events acknowledged under
    /// `durability = fsync`.
    @Test func aResendAcknowledgedAfterARestartSurvivesAPowerCut() throws {
        let fs = PowerCutFileSystem("pc-restart")
        try fs.mount()
        let daemon = try fs.daemon(
            "pc-restart", settings: "durability = fsync\nsegment_max_bytes = 4096\n", arguments: [])
        let gate = try daemon.holdingJournalSyncs(in: daemon.directory)
        try daemon.start()

        // One event larger than a segment: the writer syncs it itself, then seals the segment,
        // whose sync goes to the sync thread, which is held from then on.
        let first = try AckedConnection.sending(
            #"{"type":"when","name":"big","id":"big","params":{"pad":"\#(noise(6000))"}}"# + "\n",
            to: daemon.socketPath, answered: 1)
        #expect(first.stored == 1)
        #expect(eventually(10) { FileManager.default.fileExists(atPath: gate + ".waiting") }, "no sync was held")

        // The events: written and sealed in segments of their own, their syncs queued behind.
        let originals = try AckedConnection(daemon.socketPath)
        try originals.connection.send(Self.noisyEvents("o", 0..<30))
        #expect(
            eventually(10) { storedIDs(daemon.journal, whileWritten: true).contains("o-29") },
            "the events were not written")
        #expect(daemon.journal.segments().count >= 2)
        try originals.read(until: 30, seconds: 0.2)
        #expect(originals.stored == 0, "acknowledged before their sync")
        daemon.crashWithWorkers()

        // whend starts again (without the shim), and the client resends what was not acked.
        unlink(gate)
        daemon.environment = [:]
        try daemon.start()
        let resend = try AckedConnection.sending(Self.noisyEvents("o", 0..<30), to: daemon.socketPath, answered: 30)
        #expect(resend.stored == 30, "errors \(resend.errors)")
        // They were resends: their first copies were in the window.
        let journal = try daemon.status()["journal"] as? [String: Any]
        #expect(journal?["duplicates_skipped"] as? Int == 30)

        let seen = try fs.cutPower(under: daemon)
        let lost = lostEvents("o", resend.stored, from: seen)
        #expect(lost.isEmpty, "acknowledged as resends, lost at the power cut: \(lost)")
        #expect(seen.contains("big"))
        fs.cut()
    }

    /// Different strings are different events, before and after a restart: lone surrogates,
    /// which decoding makes U+FFFD alike, included. Another spelling of one of them is a resend.
    @Test func idsThatAreDifferentStringsAreDifferentEvents() throws {
        let daemon = TestDaemon("rs-surrogate")
        try daemon.start()
        let ids = [#"\ud800"#, #"\udfff"#, #"\ufffd"#, #"x\udc00"#, #"x\ud83d"#]
        func events(_ ids: [String]) -> [String] {
            ids.enumerated().map { #"{"type":"when","name":"e\#($0.offset)","id":"\#($0.element)"}"# }
        }
        // Foundation's reader refuses lone surrogates: the names are taken from the lines.
        func names() -> [String] {
            var names: [String] = []
            JournalReader(directory: daemon.journal).read { record, _ in
                let line = String(decoding: record.line, as: UTF8.self)
                if let name = line.range(of: #""name":""#) {
                    names.append(String(line[name.upperBound...].prefix { $0 != "\"" }))
                }
                return true
            } onProblem: {
                Issue.record("journal problem: \($0)")
            }
            return names
        }
        var answers = try exchange(daemon.socketPath, [helloWithAcks] + events(ids))
        #expect(answers.acks.last == 5 && answers.errors.isEmpty)
        #expect(names() == ["e0", "e1", "e2", "e3", "e4"])

        // The same strings spelled otherwise: resends, acknowledged and not stored again.
        let respelled = [#"\uD800"#, #"\uDFFF"#, "\u{FFFD}", #"\u0078\uDC00"#, #"x\uD83D"#]
        answers = try exchange(daemon.socketPath, [helloWithAcks] + events(respelled))
        #expect(answers.acks.last == 5 && answers.errors.isEmpty)
        #expect(names().count == 5)

        // After a restart the window, rebuilt from the stored records, says the same.
        #expect(daemon.stop() == 0)
        try daemon.start()
        answers = try exchange(daemon.socketPath, [helloWithAcks] + events(ids + [#"\ud801"#]))
        #expect(answers.acks.last == 6 && answers.errors.isEmpty)
        #expect(daemon.stop() == 0)
        #expect(names() == ["e0", "e1", "e2", "e3", "e4", "e5"])
    }

    /// A pipeline derives records that carry an app, a session and an id, as a client's event
    /// can. Live, they are not first copies of client events; after a restart they must not be
    /// either: a client's event with the same three is stored, not acknowledged as a resend.
    @Test func aDerivedRecordIsNoFirstCopyOfAClientsEventAfterARestart() throws {
        let daemon = try fixturePipelineDaemon("rs-derived", plugin: "claimid", pipeline: "claims", .live)
        try daemon.start()
        let hello = #"{"hello":{"protocol":1,"acks":true}}"#
        func client(_ name: String, id: String) -> String {
            #"{"type":"when","name":"\#(name)","app":"victim","session":"s","id":"\#(id)"}"#
        }
        // _seq 1 claims, 2 is derived from it (id "d1"), 3 is a client's event with id "d1".
        #expect(try exchange(daemon.socketPath, [hello, #"{"type":"when","name":"claim"}"#]).acks.last == 1)
        #expect(try daemon.waitForPipeline("claims", cursor: 2, seconds: 20), "\(daemon.log.suffix(2000))")
        #expect(try exchange(daemon.socketPath, [hello, client("live", id: "d1")]).acks.last == 1)
        // _seq 4 claims, 5 is derived from it (id "d4").
        #expect(try exchange(daemon.socketPath, [hello, #"{"type":"when","name":"claim"}"#]).acks.last == 1)
        #expect(try daemon.waitForPipeline("claims", cursor: 5, seconds: 20), "\(daemon.log.suffix(2000))")
        #expect(daemon.stop() == 0)

        try daemon.start()
        // A first event with the derived record's id, and a resend of the client's own one.
        let answers = try exchange(
            daemon.socketPath, [hello, client("afterRestart", id: "d4"), client("live", id: "d1")])
        #expect(answers.acks.last == 2)
        #expect(answers.errors.isEmpty, "\(answers.errors)")
        #expect(daemon.stop() == 0)
        let clients = daemon.records().filter { $0["_origin"] == nil && $0["app"] as? String == "victim" }
        #expect(clients.compactMap { $0["name"] as? String } == ["live", "afterRestart"])
    }
}
