import Foundation
import Testing
import WhendJournal
import WhendWire

// What the durability tests share: a client that counts what whend acknowledged, and what the
// journal holds once the power has been cut.

/// An ack-wanting connection's answers: the last ack and the codes of the errors.
final class AckedConnection {
    let connection: BlockingSocket
    var lastAck = 0
    var errors: [String] = []
    private var pending: [UInt8] = []

    init(_ socketPath: String) throws {
        connection = try BlockingSocket(path: socketPath)
        try connection.send(helloWithAcks + "\n")
    }

    /// A new connection that sends `events` (lines) and reads until `lines` of them are answered.
    static func sending(_ events: String, to socketPath: String, answered lines: Int) throws -> AckedConnection {
        let connection = try AckedConnection(socketPath)
        try connection.connection.send(events)
        try connection.read(until: lines)
        return connection
    }

    /// Reads until `lines` lines are answered (acked or refused), for at most `seconds`.
    func read(until lines: Int, seconds: Double = 20) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while lastAck < lines, Date() < deadline {
            guard connection.waitReadable(timeout: 0.1) else { continue }
            let bytes = try connection.receive()
            if bytes.isEmpty { return }
            pending += bytes
            while let nl = pending.firstIndex(of: 0x0A) {
                let line = Array(pending[..<nl])
                pending.removeSubrange(...nl)
                let o = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any]
                if let a = o?["ack"] as? Int { lastAck = max(lastAck, a) }
                if let e = o?["error"] as? [String: Any] { errors.append(e["code"] as? String ?? "?") }
            }
        }
    }

    /// Lines acknowledged as stored: an ack covers refused lines too, which are the errors.
    var stored: Int { lastAck - errors.count }
}

/// The journal's records in `_seq` order: each one's `_seq` and, for a client's event, its id.
/// Every problem a reader meets is an issue, unless whend is still writing the journal.
func storedRecords(_ journal: JournalDirectory, whileWritten: Bool = false) -> [(seq: UInt64?, id: String?)] {
    var records: [(seq: UInt64?, id: String?)] = []
    JournalReader(directory: journal).read { record, _ in
        let o = try? JSONSerialization.jsonObject(with: Data(buffer: record.line)) as? [String: Any]
        records.append((record.seq, o?["id"] as? String))
        return true
    } onProblem: { problem in
        if !whileWritten { Issue.record("journal problem: \(problem)") }
    }
    return records
}

/// The ids of the events in `journal`, in `_seq` order.
func storedIDs(_ journal: JournalDirectory, whileWritten: Bool = false) -> [String] {
    storedRecords(journal, whileWritten: whileWritten).compactMap(\.id)
}

/// Which of the events with ids `prefix`-0 ..< `prefix`-`count` (acknowledged as stored) are
/// not among `stored`.
func lostEvents(_ prefix: String, _ count: Int, from stored: Set<String>) -> [String] {
    (0..<count).map { "\(prefix)-\($0)" }.filter { !stored.contains($0) }
}

extension PowerCutFileSystem {
    /// The power goes while `daemon` runs (it and its workers are killed first: none writes after
    /// the cut) and comes back: mounted again, the file system shows what was durable.
    /// - Returns: the ids of the events its journal then holds.
    @discardableResult
    func cutPower(under daemon: TestDaemon) throws -> Set<String> {
        daemon.crashWithWorkers()
        cut()
        try mount()
        return Set(storedIDs(daemon.journal))
    }

    /// whend's configuration file: beside the mount, so that a cut keeps it.
    var configurationFile: String { directory + "/whend.conf" }

    /// A whend (not started) whose state directory is on this file system, on `settings`.
    func daemon(
        _ name: String, settings: String, arguments: [String] = ["--builtin-pipelines", "false"]
    ) throws -> TestDaemon {
        try settings.write(toFile: configurationFile, atomically: true, encoding: .utf8)
        return TestDaemon.live(
            name, arguments: arguments + ["--config", configurationFile], stateDirectory: mountPoint + "/state")
    }
}

extension TestDaemon {
    /// Preloads Tests/Fixtures/syncgate.c, built into `directory`, at the next start: while the
    /// returned file exists, the journal's sync thread waits before each `fdatasync`.
    func holdingJournalSyncs(in directory: String) throws -> String {
        let gate = directory + "/sync-gate"
        let shim = try buildTestPlugin("syncgate", into: directory, name: "syncgate")
        _ = FileManager.default.createFile(atPath: gate, contents: nil)
        environment = ["LD_PRELOAD": shim, "WHEND_TEST_SYNC_GATE": gate]
        return gate
    }

    /// One event, `big`, larger than a 4 KiB segment, sent with acks: the writer syncs it
    /// itself, then seals the segment, whose sync goes to the sync thread (held from then on,
    /// under `holdingJournalSyncs`).
    func sendingSegmentSizedEvent() throws -> AckedConnection {
        try AckedConnection.sending(
            #"{"type":"when","name":"big","id":"big","params":{"pad":"\#(incompressible(6000))"}}"# + "\n",
            to: socketPath, answered: 1)
    }
}
