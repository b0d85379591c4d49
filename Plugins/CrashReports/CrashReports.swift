import BuiltinPluginSupport
import Foundation
import WhendPluginSDK
import WhendSystem
import WhendWire

/// Keeps the last records of each session as breadcrumbs and, on a fatal `error` (or on every
/// `error` with `"on_every_error": true`), writes a crash report: a JSON file under
/// `<state>/reports/` with the error, app, session, the screen on show and the breadcrumbs,
/// oldest first. Like the seed's crash-reporting middleware, which catches what `next` throws,
/// it also reports the failure of a plugin after it in its pipeline (and passes the failure on,
/// so the pipeline retries). A report is named after the `_seq` that caused it, so a record
/// handled again after a restart rewrites the same report rather than adding one.
/// Configuration: `{"breadcrumbs": 100, "on_every_error": false, "max_sessions": 10000}`.
final class CrashReports: PersistentStatePlugin {
    static let name = "crash-reports"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    // Unchecked exclusivity on the properties every record touches: an instance is called on
    // one thread at a time, and the runtime's checks cost a twentieth of its time.
    @exclusivity(unchecked) private var sessionIDs = SessionIDCache()
    private let breadcrumbLimit: Int
    private let onEveryError: Bool
    private let directory: String
    @exclusivity(unchecked) private var sessions: BoundedSessions<Trail>
    private let maxSessions: Int

    /// Saved with the pipeline's cursor: every session's breadcrumbs and screen on show.
    var state: BoundedSessions<Trail> {
        get { sessions }
        set { sessions = newValue.withLimit(maxSessions) }
    }

    /// A session's last records in a ring, kept compactly (a copy of the members a breadcrumb
    /// is made of, cheaper than building each breadcrumb, which is done only for a report),
    /// and the screen on show.
    ///
    /// The crumbs lie one after another in one buffer, in the order written (each its seq, its
    /// length and its form), and `starts` says where each crumb of the ring is: one allocation
    /// for a session's crumbs where each crumb was an array of its own, and each crumb its
    /// members' values without their keys (`Crumb.compact(_:into:)`). A crumb replaced leaves
    /// its bytes behind until they are a quarter of the rest, which is then written again in ring
    /// order.
    struct Trail: Codable {
        /// A record as stored (its JSON text, as a string when saved).
        struct Crumb: Codable {
            var seq: UInt64
            var record: [UInt8]

            init(seq: UInt64, record: [UInt8]) {
                self.seq = seq
                self.record = record
            }

            init(from decoder: any Decoder) throws {
                var c = try decoder.unkeyedContainer()
                seq = try c.decode(UInt64.self)
                record = Array(try c.decode(String.self).utf8)
            }

            func encode(to encoder: any Encoder) throws {
                var c = encoder.unkeyedContainer()
                try c.encode(seq)
                try c.encode(String(decoding: record, as: UTF8.self))
            }
        }

        /// The crumbs, each: its seq (a varint), the length of what follows (`append`), then either 0 and a JSON object as it was given (a crumb restored that is not
        /// in the compact form), or 1, a byte of which members it has, one of the time's key, and
        /// each member's value as stored, its length first (a varint).
        private var log: [UInt8] = []
        /// Where each crumb of the ring starts in `log`, in ring order.
        private var starts: [Int] = []
        /// Bytes in `log` of crumbs no longer in the ring.
        private var unused = 0
        var next = 0
        var screen: String?

        init() {}

        var count: Int { starts.count }

        mutating func add(_ record: PluginRecord, limit: Int) {
            if starts.count < limit {
                starts.append(log.count)
            } else {
                unused += Self.size(log, at: starts[next])
                starts[next] = log.count
                next = (next + 1) % limit
            }
            Self.append(seq: record.seq, log: &log) { Self.compact(record, into: &$0) }
            if unused > 512 && unused > (log.count - unused) / 4 { rewrite() }
        }

        /// Writes the ring's crumbs again, in ring order, without the unused bytes between.
        private mutating func rewrite() {
            var kept: [UInt8] = []
            kept.reserveCapacity((log.count - unused) * 5 / 4 + 256)
            for i in starts.indices {
                let start = starts[i]
                starts[i] = kept.count
                kept += log[start..<start + Self.size(log, at: start)]
            }
            log = kept
            unused = 0
        }

        /// Appends a crumb to `log`: its seq (a varint), its length (two bytes, or four with the
        /// top bit of the first two set) and the bytes `body` appends. The buffer grows by a
        /// quarter, not double: it is most of a session's memory.
        private static func append(seq: UInt64, log: inout [UInt8], _ body: (inout [UInt8]) -> Void) {
            if log.capacity - log.count < 256 { log.reserveCapacity(log.count + max(256, log.count / 4)) }
            var v = seq
            while v >= 0x80 {
                log.append(UInt8(truncatingIfNeeded: v) | 0x80)
                v >>= 7
            }
            log.append(UInt8(v))
            let lengthAt = log.count
            log.append(0)
            log.append(0)
            body(&log)
            let length = log.count - lengthAt - 2
            if length < 0x8000 {
                log[lengthAt] = UInt8(truncatingIfNeeded: length)
                log[lengthAt + 1] = UInt8(truncatingIfNeeded: length >> 8)
            } else {
                log[lengthAt] = UInt8(truncatingIfNeeded: length)
                log[lengthAt + 1] = UInt8(truncatingIfNeeded: length >> 8) | 0x80
                log.insert(
                    contentsOf: [UInt8(truncatingIfNeeded: length >> 15), UInt8(truncatingIfNeeded: length >> 23)],
                    at: lengthAt + 2)
            }
        }

        /// The crumb at `start`: its seq, and where its body is.
        private static func crumb(_ log: [UInt8], at start: Int) -> (seq: UInt64, body: Range<Int>) {
            var seq: UInt64 = 0
            var shift: UInt64 = 0
            var at = start
            while true {
                let byte = log[at]
                at += 1
                seq |= UInt64(byte & 0x7F) << shift
                if byte & 0x80 == 0 { break }
                shift += 7
            }
            var length = Int(log[at]) | Int(log[at + 1] & 0x7F) << 8
            if log[at + 1] & 0x80 != 0 {
                length |= Int(log[at + 2]) << 15 | Int(log[at + 3]) << 23
                at += 2
            }
            at += 2
            return (seq, at..<at + length)
        }

        private static func size(_ log: [UInt8], at start: Int) -> Int { crumb(log, at: start).body.upperBound - start }

        private static func seq(_ log: [UInt8], at start: Int) -> UInt64 { crumb(log, at: start).seq }

        /// The crumb at `start` in `log` as its JSON object.
        private static func record(_ log: [UInt8], at start: Int) -> [UInt8] {
            let body = log[crumb(log, at: start).body]
            guard body.first == 1 else { return Array(body.dropFirst()) }
            return expand(body.dropFirst())
        }

        /// The crumbs of the ring, in ring order.
        var crumbs: [Crumb] {
            starts.map { Crumb(seq: Self.seq(log, at: $0), record: Self.record(log, at: $0)) }
        }

        /// A ring as saved (`crumbs`, `next`): each crumb kept compact where that gives back
        /// its bytes.
        init(crumbs: [Crumb], next: Int, screen: String?) {
            for crumb in crumbs {
                starts.append(log.count)
                Self.append(seq: crumb.seq, log: &log) { out in
                    let at = out.count
                    let compact = crumb.record.withUnsafeBufferPointer { bytes -> Bool in
                        Self.compact(PluginRecord(bytes: bytes, seq: crumb.seq), into: &out)
                        return Self.expand(out[(at + 1)...]) == crumb.record
                    }
                    if !compact {
                        out.removeSubrange(at...)
                        out.append(0)
                        out += crumb.record
                    }
                }
            }
            self.next = next
            self.screen = screen
        }

        private static let keptFields: [RecordField] = [.type, .action, .message, .name, .params, .screen, .status]

        /// The members a breadcrumb is made of (`breadcrumb(_:)`), as `expand(_:)` reads them:
        /// a breadcrumb read from them is the one read from the whole record, at less than half
        /// its bytes. 1, a byte of which of `keptFields` (and the time, its top bit) the record
        /// has, a byte for the time's key (bit 0: `ts`, else when whend received it; bit 1: the
        /// time packed; bit 2: the type as its number in `types`), then each value as stored,
        /// its length first (the time packed: its eight bytes; the type numbered: its number).
        static func compact(_ record: PluginRecord, into out: inout [UInt8]) {
            let timeField: RecordField = record[.ts] != nil ? .ts : .receivedAt
            out.append(1)
            let maskAt = out.count
            out.append(0)
            out.append(timeField == .ts ? 0 : 1)
            var mask: UInt8 = 0
            func member(_ field: RecordField, _ bit: UInt8) {
                guard let value = record[field] else { return }
                mask |= bit
                var n = value.raw.count
                while n >= 0x80 {
                    out.append(UInt8(truncatingIfNeeded: n) | 0x80)
                    n >>= 7
                }
                out.append(UInt8(n))
                out.append(contentsOf: value.raw)
            }
            // The type as its number in `types` where it is one of them.
            if let value = record[.type],
                let code = types.firstIndex(where: { JSONBytes.equal(value.raw, Self.bytes($0)) })
            {
                mask |= 1
                out[maskAt + 1] |= 4
                out.append(UInt8(code))
            } else {
                member(.type, 1)
            }
            for (i, field) in keptFields.enumerated() where i > 0 { member(field, 1 << UInt8(i)) }
            // The time in eight bytes where it packs (`PackedTime`): most are written so.
            if let value = record[timeField], let time = packedTime(value.raw) {
                mask |= 0x80
                out[maskAt + 1] |= 2
                withUnsafeBytes(of: time.bits.littleEndian) { out.append(contentsOf: $0) }
            } else {
                member(timeField, 0x80)
            }
            out[maskAt] = mask
        }

        /// The types most records have, as stored: a crumb keeps one as its number.
        private static let types: [StaticString] = [
            #""lifecycle""#, #""navigation""#, #""when""#, #""screen""#, #""error""#,
        ]

        private static func bytes(_ s: StaticString) -> UnsafeBufferPointer<UInt8> {
            UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount)
        }

        /// A JSON string's time as `PackedTime` packs it (no escapes inside), if it does.
        private static func packedTime(_ raw: UnsafeBufferPointer<UInt8>) -> PackedTime? {
            guard raw.count >= 22, raw[0] == UInt8(ascii: "\""), raw[raw.count - 1] == UInt8(ascii: "\"") else {
                return nil
            }
            return PackedTime(UnsafeBufferPointer(rebasing: raw[1..<raw.count - 1]))
        }

        /// The JSON object of a compact crumb (after its form byte): the members in the order
        /// of `keptFields`, then the time.
        static func expand(_ crumb: ArraySlice<UInt8>) -> [UInt8] {
            var out: [UInt8] = []
            out.reserveCapacity(crumb.count + 64)
            out.append(UInt8(ascii: "{"))
            guard crumb.count >= 2 else { return out + [UInt8(ascii: "}")] }
            let mask = crumb[crumb.startIndex]
            let timeField: RecordField = crumb[crumb.startIndex + 1] & 1 == 0 ? .ts : .receivedAt
            let timePacked = crumb[crumb.startIndex + 1] & 2 != 0
            let typeCoded = crumb[crumb.startIndex + 1] & 4 != 0
            var at = crumb.startIndex + 2
            func member(_ field: RecordField) {
                var n = 0
                var shift = 0
                while at < crumb.endIndex {
                    let byte = crumb[at]
                    at += 1
                    n |= Int(byte & 0x7F) << shift
                    if byte & 0x80 == 0 { break }
                    shift += 7
                }
                if out.count > 1 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "\""))
                let key = field.key
                out.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
                out.append(UInt8(ascii: "\""))
                out.append(UInt8(ascii: ":"))
                let end = min(at + n, crumb.endIndex)
                out += crumb[at..<end]
                at = end
            }
            for (i, field) in keptFields.enumerated() where mask & (1 << UInt8(i)) != 0 {
                if i == 0, typeCoded, at < crumb.endIndex {
                    let code = Int(crumb[at])
                    at += 1
                    out += #""type":"#.utf8
                    if code < types.count { out.append(contentsOf: bytes(types[code])) }
                } else {
                    member(field)
                }
            }
            if mask & 0x80 != 0, timePacked {
                var bits: UInt64 = 0
                for i in 0..<8 where at + i < crumb.endIndex { bits |= UInt64(crumb[at + i]) << (8 * UInt64(i)) }
                if out.count > 1 { out.append(UInt8(ascii: ",")) }
                let key = timeField.key
                out.append(UInt8(ascii: "\""))
                out.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
                out += #"":""#.utf8
                out += (PackedTime(bits: bits).string ?? "").utf8
                out.append(UInt8(ascii: "\""))
            } else if mask & 0x80 != 0 {
                member(timeField)
            }
            out.append(UInt8(ascii: "}"))
            return out
        }

        /// The last `limit` breadcrumbs before the newest one when `skippingNewest` (the record
        /// being reported on), oldest first, as a JSON array.
        func json(limit: Int, skippingNewest: Bool) -> [UInt8] {
            let ordered = (0..<starts.count).map { starts[(next + $0) % starts.count] }
            var out: [UInt8] = [UInt8(ascii: "[")]
            for (i, start) in ordered.dropLast(skippingNewest ? 1 : 0).suffix(limit).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                Self.record(log, at: start).withUnsafeBufferPointer {
                    out += CrashReports.breadcrumb(PluginRecord(bytes: $0, seq: Self.seq(log, at: start)))
                }
            }
            out.append(UInt8(ascii: "]"))
            return out
        }

        private enum CodingKeys: String, CodingKey { case ring, next, screen }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            self.init(
                crumbs: try c.decode([Crumb].self, forKey: .ring), next: try c.decode(Int.self, forKey: .next),
                screen: try c.decodeIfPresent(String.self, forKey: .screen))
        }

        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(crumbs, forKey: .ring)
            try c.encode(next, forKey: .next)
            try c.encodeIfPresent(screen, forKey: .screen)
        }
    }

    init(host: PluginHost, configuration: [String: Any]) throws {
        self.host = host
        breadcrumbLimit = max(1, configuration["breadcrumbs"] as? Int ?? 100)
        onEveryError = configuration["on_every_error"] as? Bool ?? false
        maxSessions = configuration["max_sessions"] as? Int ?? 10_000
        sessions = BoundedSessions(limit: maxSessions)
        directory = CrashReportStore.directory(pluginState: host.stateDirectory)
        try DurableFile.createDirectory(directory)
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        // One more than the limit is kept: a report shows the `breadcrumbs` records before the
        // one it is about. Changed in place: copying a session's trail per record cost more
        // than all the rest.
        let capacity = breadcrumbLimit + 1
        let id = sessionIDs.id(of: record)
        let crumb = !record.isDerived || record.has(.type, "screen")
        let screenBefore = sessions.with(id, seq: record.seq, make: Trail.init) { trail -> String? in
            let before = trail.screen
            if let screen = Self.screen(shownBy: record) { trail.screen = screen }
            if crumb { trail.add(record, limit: capacity) }
            return before
        }
        // The trail as it was before this record, read only for a report.
        func trail() -> (json: [UInt8], screen: String?) {
            let now = sessions.with(id, seq: record.seq, make: Trail.init) { $0 }
            return (now.json(limit: breadcrumbLimit, skippingNewest: crumb), screenBefore)
        }
        if record.has(.type, "error"), !record.isDerived, record.flag(.fatal) || onEveryError {
            try write(kind: "error", record: record, trail: trail(), error: Self.errorPart(record).bytes)
        }
        do {
            try next(record)
        } catch {
            var part = JSONObjectWriter()
            part.string("message", "a plugin after crash-reports failed on _seq \(record.seq): \(error)")
            try? write(kind: "plugin_failure", record: record, trail: trail(), error: part.bytes)
            throw error
        }
    }

    private func write(kind: String, record: PluginRecord, trail: (json: [UInt8], screen: String?), error: [UInt8])
        throws
    {
        var report = JSONObjectWriter(capacity: 4096)
        report.value("app", record[.app])
        report.raw("breadcrumbs", trail.json)
        report.raw("error", error)
        report.string("kind", kind)
        let screen = (record.has(.type, "error") ? record.string(.screen) : nil) ?? trail.screen
        if let screen { report.string("screen", screen) }
        report.number("seq", record.seq)
        report.value("session", record[.session])
        if let time = record.time { report.value("time", time) } else { report.string("time", "") }
        report.value("user", record[.user])
        let name = CrashReportStore.fileName(seq: record.seq, kind: kind)
        try writeFileAtomically(report.bytes, to: directory + "/" + name)
        host.count("reports_\(kind)")
        host.log(
            .warning,
            "crash report \(name): \(record.string(.app) ?? "")/\(record.string(.session) ?? "") on \(screen ?? "no screen")"
        )
    }

    /// The screen a record says is on show.
    static func screen(shownBy r: PluginRecord) -> String? {
        guard let type = r[.type] else { return nil }
        if type.isString("screen") { return r.string(.name) }
        if type.isString("lifecycle") { return r.has(.status, "didAppear") ? r.string(.screen) : nil }
        if type.isString("navigation"), let action = r[.action],
            action.isString("root") || action.isString("push") || action.isString("present")
                || action.isString("replace")
        {
            return r.string(.screen)
        }
        return nil
    }

    /// What a breadcrumb keeps of a record, keys in alphabetical order.
    static func breadcrumb(_ r: PluginRecord) -> [UInt8] {
        var crumb = JSONObjectWriter(capacity: 192)
        crumb.value("action", r[.action])
        crumb.value("message", r[.message])
        crumb.value("name", r[.name])
        if let params = r[.params] {
            // The first of a key given twice, as whend's plugins read it (`jq` takes the last).
            var repeated = RepeatedKeys()
            repeated.withFirstOfEach(params.raw) { crumb.value("params", JSONValue(raw: $0)) }
        }
        crumb.value("screen", r[.screen])
        crumb.number("seq", r.seq)
        crumb.value("status", r[.status])
        if let time = r.time { crumb.value("time", time) } else { crumb.string("time", "") }
        if let type = r[.type] { crumb.value("type", type) } else { crumb.string("type", "") }
        return crumb.bytes
    }

    static func errorPart(_ r: PluginRecord) -> JSONObjectWriter {
        var error = JSONObjectWriter()
        error.value("fatal", r[.fatal])
        error.value("message", r[.message])
        error.value("name", r[.name])
        error.value("screen", r[.screen])
        error.value("stack", r[.stack])
        return error
    }
}

/// As saved in a snapshot: the ring as it lies (each breadcrumb's seq and bytes), where it
/// continues, the screen on show.
extension CrashReports.Trail: CompactCodable {
    func encode(to writer: inout CompactWriter) {
        let crumbs = crumbs
        writer.write(UInt64(crumbs.count))
        for crumb in crumbs {
            writer.write(crumb.seq)
            writer.write(bytes: crumb.record)
        }
        writer.write(next)
        writer.write(screen)
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        let count = try reader.readCount()
        var crumbs: [Crumb] = []
        crumbs.reserveCapacity(count)
        for _ in 0..<count {
            let seq = try reader.read(UInt64.self)
            crumbs.append(Crumb(seq: seq, record: Array(try reader.readBytes())))
        }
        let next = try reader.read(Int.self)
        guard next >= 0, next < max(1, crumbs.count) else {
            throw StateDamaged("a breadcrumb ring continues at \(next) of \(crumbs.count)")
        }
        self.init(crumbs: crumbs, next: next, screen: try reader.read(String?.self))
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(CrashReports.self) }
