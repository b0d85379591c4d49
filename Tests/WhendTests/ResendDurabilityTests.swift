import Foundation
import Testing
import WhendJournal
import WhendWire

/// A resent event is acknowledged as stored only once its first copy is durable, never before
/// the sync that covers it, and never after that sync failed: a power cut after the ack must
/// find it. On the power-cut file system (Tests/Fixtures/powercut_fs.py), whose holds order what
/// whend's journal threads do.
@Suite(.serialized) struct ResendDurabilityTests {
    /// Events with ids, one line each.
    static func events(_ prefix: String, _ range: Range<Int>) -> String {
        range.map { #"{"type":"when","name":"step","id":"\#(prefix)-\#($0)"}"# + "\n" }.joined()
    }

    /// The threads of `pid` blocked in system call `number` (as /proc/PID/task/TID/syscall
    /// gives it). whend's threads have no names of their own on Linux: they are told apart by
    /// what they are doing.
    static func threads(of pid: pid_t, in number: Int) -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.filter { task in
            let syscall = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/syscall", encoding: .utf8)) ?? ""
            return syscall.split(separator: " ").first.flatMap { Int($0) } == number
        }
    }

    static func syscall(of pid: pid_t, thread: String) -> Int? {
        let syscall = (try? String(contentsOfFile: "/proc/\(pid)/task/\(thread)/syscall", encoding: .utf8)) ?? ""
        return syscall.split(separator: " ").first.flatMap { Int($0) }
    }

    static let write = 1
    static let fdatasync = 75
    static let futex = 202

    /// The first copies of events are written, and their sync is under way on the journal's
    /// sync thread, when a client resends them on another connection (as after a reconnect):
    /// the resend is a group of duplicates only. The sync then fails. The resend must not be
    /// acknowledged as stored (its first copies are not durable), and a power cut must find
    /// every event that was acknowledged.
    @Test func aResendIsNotAckedBeforeTheSyncOfItsFirstCopies() throws {
        let fs = PowerCutFileSystem("pc-resend")
        try fs.mount()
        let daemon = try fs.daemon("pc-resend", settings: "durability = fsync\n")
        try daemon.start()
        let pid = daemon.process!.processIdentifier
        let hold = fs.backing + "/hold"
        let held = fs.backing + "/held"
        func holding(_ kinds: String) throws {
            try kinds.write(toFile: hold + ".tmp", atomically: false, encoding: .utf8)
            rename(hold + ".tmp", hold)
        }
        func heldKind() -> String? { try? String(contentsOfFile: held, encoding: .utf8) }
        // Whatever ends the test, nothing stays held: a SIGKILLed whend whose write the harness
        // holds cannot die, and the test would wait for it for ever.
        defer { unlink(hold) }

        let first = try AckedConnection.sending(Self.events("a", 0..<20), to: daemon.socketPath, answered: 20)
        #expect(first.stored == 20)

        // The first copies' write waits: the writer thread is in it, their keys in the window.
        try holding("write fsync")
        let originals = try AckedConnection(daemon.socketPath)
        try originals.connection.send(Self.events("b", 0..<10))
        #expect(eventually(10) { heldKind() == "write" }, "the journal's write was not held")
        // The writer thread: the one writing.
        let writer = try #require(Self.threads(of: pid, in: Self.write).first)
        // The resend reaches the writer's queue while it writes, so that it is a group of its
        // own, and the written group goes to the sync thread rather than being synced in place.
        let resend = try AckedConnection(daemon.socketPath)
        try resend.connection.send(Self.events("b", 0..<10))
        usleep(500_000)
        try holding("fsync")
        #expect(eventually(10) { heldKind() == "fsync" }, "the journal's sync was not held")
        #expect(eventually(10) { !Self.threads(of: pid, in: Self.fdatasync).isEmpty })
        #expect(
            Self.threads(of: pid, in: Self.fdatasync) != [writer],
            "the writer syncs in place: the resend did not come while the first copies were written")
        // The writer has taken the resend (duplicates only: nothing to write) and waits for more.
        #expect(eventually(10) { Self.syscall(of: pid, thread: writer) == Self.futex })

        // The sync of the first copies fails.
        fs.failSyncs(true)
        unlink(hold)
        try originals.read(until: 10)
        try resend.read(until: 10)
        #expect(originals.stored == 0, "\(originals.stored) events acked whose sync failed")
        #expect(resend.errors == Array(repeating: "unavailable", count: resend.errors.count))
        // Syncs work again: sent once more, the events are acknowledged (stored once, the
        // failed sync's records rewritten and synced), and survive the cut.
        fs.failSyncs(false)
        let again = try AckedConnection.sending(Self.events("b", 0..<10), to: daemon.socketPath, answered: 10)
        #expect(again.stored == 10, "errors \(again.errors)")

        let seen = try fs.cutPower(under: daemon)
        let lostFirst = lostEvents("a", first.stored, from: seen)
        #expect(lostFirst.isEmpty, "acked and lost: \(lostFirst)")
        let lost = lostEvents("b", max(resend.stored, again.stored), from: seen)
        #expect(
            lost.isEmpty,
            "the resend was acked (\(resend.stored) stored, errors \(resend.errors)) and \(lost.count) of its events are lost: \(lost)"
        )
        fs.cut()
    }

    /// Events written under `durability = write` (never synced), then `durability = fsync` by
    /// a reload, then the same events resent: the resend's ack promises a power cut loses
    /// nothing, so it waits for a sync that covers the first copies.
    @Test func aResendAckedUnderFsyncSurvivesAPowerCutWhenItsFirstCopiesWereNeverSynced() throws {
        let fs = PowerCutFileSystem("pc-resend-w")
        try fs.mount()
        let daemon = try fs.daemon("pc-resend-w", settings: "durability = write\n")
        try daemon.start()
        let originals = try AckedConnection.sending(Self.events("w", 0..<10), to: daemon.socketPath, answered: 10)
        #expect(originals.stored == 10)

        try "durability = fsync\n".write(toFile: fs.configurationFile, atomically: true, encoding: .utf8)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "\(reload.output) \(reload.error)")
        let resend = try AckedConnection.sending(Self.events("w", 0..<10), to: daemon.socketPath, answered: 10)
        #expect(resend.stored == 10, "errors \(resend.errors)")

        let seen = try fs.cutPower(under: daemon)
        let lost = lostEvents("w", resend.stored, from: seen)
        #expect(lost.isEmpty, "acked under fsync and lost at the cut: \(lost)")
        fs.cut()
    }
}
