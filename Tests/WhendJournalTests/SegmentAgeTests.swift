import Foundation
import Testing
import WhendRecord
import WhendWire

@testable import WhendJournal

/// A wall clock the test moves by hand.
final class ManualWallClock: @unchecked Sendable {
    private let lock = NSLock()
    private var date = Date(timeIntervalSince1970: 1_800_000_000)
    var now: Date { lock.withLock { date } }
    func advance(seconds: TimeInterval) { lock.withLock { date += seconds } }
}

extension JournalWriterTests {
    static let screen =
        #""type":"screen","name":"A","app":"a","_rt":"2026-11-21T13:35:00.000000Z","_pid":1,"_uid":0,"_gid":0,"_comm":"t"}"#

    /// A segment is sealed and a new one begun once it is `segmentMaxAge` old on the writer's
    /// clock, whether or not anything is being written, and not a moment before.
    @Test func aSegmentRotatesOnceItIsOldOnTheWritersClock() throws {
        let directory = JournalDirectory(path: temporaryDirectory("age"))
        var configuration = JournalConfiguration(directory: directory)
        configuration.segmentMaxAge = 60
        let clock = ManualWallClock()
        let writer = try JournalWriter(configuration: configuration, now: { clock.now })
        writer.start(heartbeatInterval: 0.01)
        defer { writer.shutdown() }
        func store(_ id: String) -> JournalCommit { submitAndWait(writer, batch([(Self.screen, id)])) }

        #expect(store("1") == .stored(lastSeq: 1))
        clock.advance(seconds: 59)
        // Each commit is followed by a look at the segment's age: the one after "2" has run by
        // the time "3" is stored, and at 59 s it rotates nothing.
        #expect(store("2") == .stored(lastSeq: 2) && store("3") == .stored(lastSeq: 3))
        #expect(directory.segments().map(\.firstSeq) == [1])

        let first = directory.segmentPath(firstSeq: 1)
        #expect(SegmentIndex.read(fromFileAt: first) == nil)
        clock.advance(seconds: 2)
        // Idle, the writer still looks (at each heartbeat), and seals it.
        let deadline = Date().addingTimeInterval(10)
        while SegmentIndex.read(fromFileAt: first) == nil && Date() < deadline { usleep(1000) }
        #expect(SegmentIndex.read(fromFileAt: first) != nil)
        // What comes next begins the next segment.
        #expect(store("4") == .stored(lastSeq: 4))
        #expect(directory.segments().map(\.firstSeq) == [1, 4])
    }
}
