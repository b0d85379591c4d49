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

    /// A session's last records in a ring, kept as stored (a copy of the bytes: cheaper than
    /// building each breadcrumb, which is done only for a report), and the screen on show.
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

        var ring: [Crumb] = []
        var next = 0
        var screen: String?

        init() {}

        mutating func add(_ record: PluginRecord, limit: Int) {
            if ring.count < limit {
                var kept: [UInt8] = []
                Self.keep(record, in: &kept)
                ring.append(Crumb(seq: record.seq, record: kept))
            } else {
                // In the buffer of the crumb it replaces: a full ring allocates nothing.
                ring[next].seq = record.seq
                Self.keep(record, in: &ring[next].record)
                next = (next + 1) % limit
            }
        }

        /// The members a breadcrumb is made of (`breadcrumb(_:)`), copied as stored into a
        /// record of their own: a breadcrumb read from it is the one read from the whole record,
        /// at less than half its bytes (the app's other members and whend's trusted ones are not
        /// kept for 10,000 sessions of 100 breadcrumbs). A crumb saved whole by an earlier
        /// version reads the same.
        static func keep(_ record: PluginRecord, in out: inout [UInt8]) {
            // The size first (the fields are found once, then read from the index): a crumb
            // grown a member at a time reallocated its buffer three times or four.
            let timeField: RecordField = record[.ts] != nil ? .ts : .receivedAt
            var size = 2
            for field in keptFields {
                if let value = record[field] { size += value.raw.count + field.key.utf8CodeUnitCount + 4 }
            }
            if let value = record[timeField] { size += value.raw.count + timeField.key.utf8CodeUnitCount + 4 }
            out.removeAll(keepingCapacity: true)
            out.reserveCapacity(size)
            out.append(UInt8(ascii: "{"))
            func member(_ field: RecordField) {
                guard let value = record[field] else { return }
                if out.count > 1 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "\""))
                let key = field.key
                out.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
                out.append(UInt8(ascii: "\""))
                out.append(UInt8(ascii: ":"))
                out.append(contentsOf: value.raw)
            }
            for field in keptFields { member(field) }
            // `time` is `ts`, else when whend received it.
            member(timeField)
            out.append(UInt8(ascii: "}"))
        }

        private static let keptFields: [RecordField] = [.type, .action, .message, .name, .params, .screen, .status]

        /// The last `limit` breadcrumbs before the newest one when `skippingNewest` (the record
        /// being reported on), oldest first, as a JSON array.
        func json(limit: Int, skippingNewest: Bool) -> [UInt8] {
            let ordered = (0..<ring.count).map { ring[(next + $0) % ring.count] }
            var out: [UInt8] = [UInt8(ascii: "[")]
            for (i, crumb) in ordered.dropLast(skippingNewest ? 1 : 0).suffix(limit).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                crumb.record.withUnsafeBufferPointer {
                    out += CrashReports.breadcrumb(PluginRecord(bytes: $0, seq: crumb.seq))
                }
            }
            out.append(UInt8(ascii: "]"))
            return out
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
        crumb.value("params", r[.params])
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
        writer.write(UInt64(ring.count))
        for crumb in ring {
            writer.write(crumb.seq)
            writer.write(bytes: crumb.record)
        }
        writer.write(next)
        writer.write(screen)
    }

    init(from reader: inout CompactReader) throws(StateDamaged) {
        let count = try reader.readCount()
        ring.reserveCapacity(count)
        for _ in 0..<count {
            let seq = try reader.read(UInt64.self)
            ring.append(Crumb(seq: seq, record: Array(try reader.readBytes())))
        }
        next = try reader.read(Int.self)
        guard next >= 0, next < max(1, ring.count) else {
            throw StateDamaged("a breadcrumb ring continues at \(next) of \(ring.count)")
        }
        screen = try reader.read(String?.self)
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(CrashReports.self) }
