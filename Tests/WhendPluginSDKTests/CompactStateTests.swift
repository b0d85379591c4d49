import Testing
import WhendPluginSDK
import WhendWire

/// A state saved in the compact form reads back as it was, and damaged bytes are refused.
struct CompactStateTests {
    struct Visit: CompactCodable, Equatable {
        var screens: [String]
        var since: Double?
        var count: Int
        var open: Bool

        func encode(to writer: inout CompactWriter) {
            writer.write(screens)
            writer.write(since)
            writer.write(count)
            writer.write(open)
        }

        init(screens: [String], since: Double?, count: Int, open: Bool) {
            (self.screens, self.since, self.count, self.open) = (screens, since, count, open)
        }

        init(from reader: inout CompactReader) throws(StateDamaged) {
            screens = try reader.read([String].self)
            since = try reader.read(Double?.self)
            count = try reader.read(Int.self)
            open = try reader.read(Bool.self)
        }
    }

    func sample() -> BoundedSessions<Visit> {
        var sessions = BoundedSessions<Visit>(limit: 50)
        for i in 0..<40 {
            let id = SessionDigest(app: "com.example", session: "s\(i % 30)")
            sessions.with(id, seq: UInt64(i), make: { Visit(screens: [], since: nil, count: 0, open: false) }) {
                $0.screens.append(i % 3 == 0 ? "Détail \"\(i)\"" : "List")
                $0.since = i % 2 == 0 ? Double(i) / 3 : nil
                $0.count -= i * 1_000_003
                $0.open.toggle()
            }
        }
        return sessions
    }

    func encoded(_ sessions: BoundedSessions<Visit>) -> [UInt8] {
        var writer = CompactWriter()
        sessions.encode(to: &writer)
        return writer.bytes
    }

    @Test func aStateReadsBackAsItWasAndWritesTheSameBytes() throws {
        let bytes = encoded(sample())
        var reader = CompactReader(bytes)
        let back = try BoundedSessions<Visit>(from: &reader)
        #expect(reader.isAtEnd)
        #expect(back.count == 30 && back.limit == 50)
        #expect(encoded(back) == bytes)
        var probe = back
        let visit = probe.with(SessionDigest(app: "com.example", session: "s9"), seq: 99, make: { fatalError() }) { $0 }
        #expect(
            visit
                == Visit(
                    screens: ["Détail \"9\"", "Détail \"39\""], since: nil, count: -(9 + 39) * 1_000_003, open: false))
    }

    @Test func bytesCutAnywhereAreRefusedNeverMisread() {
        let bytes = encoded(sample())
        for cut in 0..<bytes.count {
            var reader = CompactReader(Array(bytes[..<cut]))
            #expect(throws: StateDamaged.self, "cut at \(cut)") { _ = try BoundedSessions<Visit>(from: &reader) }
        }
    }
}
