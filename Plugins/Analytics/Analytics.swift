import BuiltinPluginSupport
import Foundation
import PluginHTTP
import WhendPluginSDK
import WhendWire

/// Turns `when` records into track events and screen views into screen events, in the Segment
/// HTTP Tracking API's batch shape, and delivers the batches to an NDJSON file and/or an HTTP
/// endpoint. Events wait in a spool file under the plugin's state directory until delivered,
/// so a restart loses none; `messageId` is stable per record, so that what is sent twice after a
/// failure de-duplicates downstream. The configuration keys are in docs/plugins.md.
final class Analytics: WhendPlugin {
    static let name = "analytics"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    private let filter: AnalyticsFilter
    private let eventMaxBytes: Int
    private let spool: AnalyticsSpool
    private let sender: AnalyticsSender

    init(host: PluginHost, configuration c: [String: Any]) throws {
        self.host = host
        filter = AnalyticsFilter(c)
        eventMaxBytes = c["event_max_bytes"] as? Int ?? 32_000
        let file: String? =
            c["file"] is NSNull ? nil : (c["file"] as? String ?? host.stateDirectory + "/events.ndjson")
        let writeKey = c["write_key"] as? String
        let timeout = c["timeout"] as? Double ?? 10
        let delivery = try (c["endpoint"] as? String).map {
            // Segment's libraries send the key as HTTP Basic auth too.
            try HTTPDelivery(
                plugin: "analytics", host: host, endpoint: $0, contentType: "application/json",
                headers: writeKey.map { ["Authorization": "Basic " + Data(($0 + ":").utf8).base64EncodedString()] }
                    ?? [:],
                gzip: c["gzip"] as? Bool ?? false, timeout: timeout, maxBackoff: c["max_backoff"] as? Double ?? 60,
                retryable: { $0 == 408 || $0 == 429 || $0 >= 500 })
        }
        guard file != nil || delivery != nil else {
            throw PluginError.fail(#"analytics: nowhere to send: set "file" or "endpoint""#)
        }
        spool = try AnalyticsSpool(
            path: host.stateDirectory + "/spool.ndjson", maxBytes: c["spool_max_bytes"] as? Int ?? 64 << 20,
            compactBytes: c["spool_compact_bytes"] as? Int ?? 1 << 20)
        sender = AnalyticsSender(
            spool: spool, host: host, file: file, delivery: delivery, writeKey: writeKey,
            batchEvents: c["batch_events"] as? Int ?? 100, batchBytes: c["batch_max_bytes"] as? Int ?? 500_000,
            flushInterval: c["flush_interval"] as? Double ?? 1, timeout: timeout)
        sender.start()
        host.log(
            .info,
            "analytics to \([file, delivery?.endpoint.absoluteString].compactMap { $0 }.joined(separator: " and "))")
    }

    deinit { sender.stop() }

    func flush() throws { try spool.flush() }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        if record.has(.type, "when") || record.has(.type, "screen") {
            if let event = filter.event(for: record) {
                let line = event.bytes
                if line.count > eventMaxBytes {
                    host.log(
                        .warning,
                        "analytics: the event of _seq \(record.seq) is \(line.count) bytes, over event_max_bytes \(eventMaxBytes); not sent"
                    )
                    host.count("oversized")
                } else if try !spool.append(line) {
                    // The destination has been down for long: hold the pipeline at this record.
                    throw PluginError.fail(
                        "analytics: the spool is full (\(spool.maxBytes) bytes); is the destination down?")
                }
            }
        }
        try next(record)
    }
}

/// Which records become which events.
struct AnalyticsFilter {
    /// `{"name":"whend-analytics","version":…}`, as Segment's libraries name themselves.
    static let library: [UInt8] = {
        var library = JSONObjectWriter()
        library.string("name", "whend-analytics")
        library.string("version", Analytics.version)
        return library.bytes
    }()

    /// Stable per record, so that an event sent twice is one event downstream: `whend-<_seq>-<id>`,
    /// under the 100 characters Segment allows (a longer id is replaced by its digest).
    static func messageID(seq: UInt64, id: String) -> String {
        let plain = "whend-\(seq)-" + id
        guard plain.utf8.count >= 100 else { return plain }
        var hash = SipHash128()
        hash.write(Array(id.utf8))
        let (a, b) = hash.finalize()
        return "whend-\(seq)-" + String(a, radix: 16) + String(b, radix: 16)
    }

    var includeApps: Set<String>?
    var excludeApps: Set<String>
    var includeWhens: Set<String>?
    var excludeWhens: Set<String>
    /// Screen views from screen-tracking (default), or the `screen` events apps send.
    var screensFrom: String

    init(_ c: [String: Any]) {
        includeApps = (c["include_apps"] as? [String]).map(Set.init)
        excludeApps = Set(c["exclude_apps"] as? [String] ?? [])
        includeWhens = (c["include_whens"] as? [String]).map(Set.init)
        excludeWhens = Set(c["exclude_whens"] as? [String] ?? [])
        screensFrom = c["screens_from"] as? String ?? "screen-tracking"
    }

    /// The Segment event for `r`, keys in alphabetical order; nil when the filters leave it out.
    func event(for r: PluginRecord) -> JSONObjectWriter? {
        let app = r.string(.app) ?? ""
        guard includeApps?.contains(app) ?? true, excludeApps.isEmpty || !excludeApps.contains(app) else { return nil }
        let session = r.string(.session) ?? ""
        let isWhen = r.has(.type, "when")
        var out = JSONObjectWriter(capacity: 512)
        let name: JSONValue
        if isWhen {
            guard !r.isDerived, let n = r[.name], n.kind == .string else { return nil }
            if includeWhens != nil || !excludeWhens.isEmpty {
                let text = n.string ?? ""
                guard includeWhens?.contains(text) ?? true, !excludeWhens.contains(text) else { return nil }
            }
            name = n
        } else {
            let origin = r.string(.origin) ?? "app"
            guard origin == screensFrom, let n = r[.name], n.kind == .string else { return nil }
            name = n
        }
        // Both ids, the one not given null, and a screen's `category` null: as Segment's own
        // libraries send them.
        if r[.user] == nil {
            out.string("anonymousId", session.isEmpty ? app : app + ":" + session)
        } else {
            out.null("anonymousId")
        }
        if !isWhen { out.null("category") }
        var context = JSONObjectWriter()
        var appObject = JSONObjectWriter()
        appObject.string("name", app)
        context.object("app", appObject)
        // Who sent it, where Segment's own libraries say it (`context.library`).
        context.raw("library", Self.library)
        if isWhen { context.value("screen", r[.screen]) }
        if !session.isEmpty { context.string("session", session) }
        out.object("context", context)
        if isWhen { out.value("event", name) }
        out.raw("integrations", Array("{}".utf8))
        out.string("messageId", Self.messageID(seq: r.seq, id: r.string(.id) ?? app + ":" + session))
        if !isWhen { out.value("name", name) }
        if isWhen {
            if let params = r[.params] {
                out.value("properties", params)
            } else {
                out.raw("properties", Array("{}".utf8))
            }
        } else {
            var properties = JSONObjectWriter()
            properties.value("previous", r[.previous].flatMap { $0.kind == .string ? $0 : nil })
            out.object("properties", properties)
        }
        if let time = r.time { out.value("timestamp", time) } else { out.string("timestamp", "") }
        out.string("type", isWhen ? "track" : "screen")
        out.valueOrNull("userId", r[.user])
        return out
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(Analytics.self) }
