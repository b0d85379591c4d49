import BuiltinPluginSupport
import Foundation
import PluginHTTP
import WhendPluginSDK
import WhendSystem
import WhendWire

/// Turns `when` records into track events and screen views into screen events, in the Segment
/// HTTP Tracking API's batch shape, and delivers the batches to an NDJSON file and/or an HTTP
/// endpoint. With an endpoint, events wait in a spool file under the plugin's state directory
/// until delivered, so a restart loses none; with only a file, the file is where they wait
/// (`AnalyticsFileBatches`). `messageId` is stable per record, so that what is sent twice after
/// a failure de-duplicates downstream. The configuration keys are in docs/plugins.md.
final class Analytics: WhendPlugin {
    static let name = "analytics"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline]

    private let host: PluginHost
    /// Called on one thread at a time (the pipeline's): its scratch space needs no checks.
    @exclusivity(unchecked) private var filter: AnalyticsFilter
    private let eventMaxBytes: Int
    /// What `eventMaxBytes` comes from, as the log says it.
    private let eventBound: String
    private let route: Route

    /// Where events go: straight to the file from the pipeline's thread when it is the only
    /// destination, else through the spool and its sender thread.
    private enum Route {
        case file(AnalyticsFileBatches)
        case spool(AnalyticsSpool, AnalyticsSender)
    }

    init(host: PluginHost, configuration c: [String: Any]) throws {
        self.host = host
        filter = AnalyticsFilter(c)
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
        // Segment takes at most 2,500 events and 500 KB in a batch.
        let batchEvents = max(1, min(c["batch_events"] as? Int ?? 100, 2_500))
        let batchBytes = max(1024, min(c["batch_max_bytes"] as? Int ?? 500_000, 500_000))
        // An event a batch cannot hold within its bound is oversized too.
        let configured = c["event_max_bytes"] as? Int ?? 32_000
        eventMaxBytes = min(configured, batchBytes - 65)
        eventBound =
            eventMaxBytes == configured
            ? "event_max_bytes \(configured)"
            : "the \(eventMaxBytes) bytes a batch of batch_max_bytes \(batchBytes) holds"
        let spoolPath = host.stateDirectory + "/spool.ndjson"
        if delivery == nil, let file {
            let batches = AnalyticsFileBatches(
                file: AnalyticsFileDestination(path: file), host: host, batchEvents: batchEvents,
                batchBytes: batchBytes)
            try Self.drainSpool(at: spoolPath, into: batches, host: host)
            route = .file(batches)
        } else {
            let spool = try AnalyticsSpool(
                path: spoolPath, maxBytes: c["spool_max_bytes"] as? Int ?? 64 << 20,
                compactBytes: c["spool_compact_bytes"] as? Int ?? 1 << 20)
            Self.sayDamaged(spool, host: host)
            let sender = AnalyticsSender(
                spool: spool, host: host, file: file, delivery: delivery, writeKey: writeKey,
                batchEvents: batchEvents, batchBytes: batchBytes, flushInterval: c["flush_interval"] as? Double ?? 1,
                timeout: timeout)
            sender.start()
            route = .spool(spool, sender)
        }
        host.log(
            .info,
            "analytics to \([file, delivery?.endpoint.absoluteString].compactMap { $0 }.joined(separator: " and "))")
    }

    deinit { if case .spool(_, let sender) = route { sender.stop() } }

    /// Events a spool holds (an endpoint configured before, or an older whend) go to the file
    /// before any new one, and then the spool goes: nothing waits in it that no sender will send.
    /// Opened as the spool always is, so a link put in its place is refused, not followed.
    private static func drainSpool(at path: String, into batches: AnalyticsFileBatches, host: PluginHost) throws {
        var status = stat()
        guard lstat(path, &status) == 0 else { return }
        let spool = try AnalyticsSpool(path: path, maxBytes: .max)
        sayDamaged(spool, host: host)
        while case let events = spool.peek(maxEvents: 2_500, maxBytes: .max, wait: 0), !events.isEmpty {
            for event in events { try batches.append(event) }
            spool.remove(events.count)
        }
        try batches.flush()
        guard unlink(path) == 0 || errno == ENOENT else {
            throw PluginError.fail("analytics: cannot remove the spool \(path): \(String(cString: strerror(errno)))")
        }
        do {
            try DurableFile.syncDirectory(of: path)
        } catch {
            throw PluginError.fail("analytics: \(error)")
        }
    }

    private static func sayDamaged(_ spool: AnalyticsSpool, host: PluginHost) {
        guard spool.damagedLines > 0 else { return }
        host.log(
            .warning,
            "analytics: \(spool.damagedLines) lines of the spool were not whole events (a write cut short?) and are left out"
        )
        host.count("spool_lines_damaged", by: Int64(spool.damagedLines))
    }

    func flush() throws {
        switch route {
        case .file(let batches): try batches.flush()
        case .spool(let spool, _): try spool.flush()
        }
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        if record.has(.type, "when") || record.has(.type, "screen") {
            if let line = filter.event(for: record) {
                if line.count > eventMaxBytes {
                    host.log(
                        .warning,
                        "analytics: the event of _seq \(record.seq) is \(line.count) bytes, over \(eventBound); not sent"
                    )
                    host.count("oversized")
                } else if case .file(let batches) = route {
                    try batches.append(line)
                } else if case .spool(let spool, _) = route, try !spool.append(line) {
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

    // By their UTF-8 bytes: Swift's `String` equality takes "é" and "e\u{301}" for one app,
    // and an app id or a `when` name is the bytes the app sent, nothing it looks like.
    var includeApps: Set<[UInt8]>?
    var excludeApps: Set<[UInt8]>
    var includeWhens: Set<[UInt8]>?
    var excludeWhens: Set<[UInt8]>
    /// Screen views from screen-tracking (default), or the `screen` events apps send.
    var screensFrom: String
    /// Reused from event to event: a `when`'s params are checked for a key given twice. A lone
    /// surrogate is U+FFFD's, as the event writes it (`appendCopied`).
    private var repeatedKeys = RepeatedKeys(loneSurrogatesAsReplacement: true)

    init(_ c: [String: Any]) {
        func bytes(_ key: String) -> Set<[UInt8]>? { (c[key] as? [String]).map { Set($0.map { Array($0.utf8) }) } }
        includeApps = bytes("include_apps")
        excludeApps = bytes("exclude_apps") ?? []
        includeWhens = bytes("include_whens")
        excludeWhens = bytes("exclude_whens") ?? []
        screensFrom = c["screens_from"] as? String ?? "screen-tracking"
    }

    /// The Segment event for `r`, keys in alphabetical order; nil when the filters leave it out.
    ///
    /// Written straight into one buffer, the nested objects in place: this runs for every `when`
    /// and screen view, and building it from a writer per object and a `String` per field was
    /// most of the plugin's time. A string the event repeats (app, session, id) is copied as
    /// stored when it is plain printable ASCII, else decoded and escaped again, exactly as the
    /// writers did it.
    mutating func event(for r: PluginRecord) -> [UInt8]? {
        let app = r[.app]
        if includeApps != nil || !excludeApps.isEmpty {
            let text = Array((app?.string ?? "").utf8)
            guard includeApps?.contains(text) ?? true, !excludeApps.contains(text) else { return nil }
        }
        let session = r[.session]
        let hasSession = session?.stringContents.map { !$0.isEmpty } ?? false
        let isWhen = r.has(.type, "when")
        let name: JSONValue
        if isWhen {
            guard !r.isDerived, let n = r[.name], n.kind == .string else { return nil }
            if includeWhens != nil || !excludeWhens.isEmpty {
                let text = Array((n.string ?? "").utf8)
                guard includeWhens?.contains(text) ?? true, !excludeWhens.contains(text) else { return nil }
            }
            name = n
        } else {
            guard Self.isFrom(r[.origin], screensFrom), let n = r[.name], n.kind == .string else { return nil }
            name = n
        }
        var out: [UInt8] = []
        out.reserveCapacity(512)
        // Both ids, the one not given null, and a screen's `category` null: as Segment's own
        // libraries send them.
        let user = r[.user]
        if user == nil {
            Self.literal(#"{"anonymousId":"#, &out)
            Self.quoted(&out) { text in
                text.append(app)
                if hasSession {
                    text.append(":")
                    text.append(session)
                }
            }
        } else {
            Self.literal(#"{"anonymousId":null"#, &out)
        }
        if !isWhen { Self.literal(#","category":null"#, &out) }
        Self.literal(#","context":{"app":{"name":"#, &out)
        Self.quoted(&out) { $0.append(app) }
        // Who sent it, where Segment's own libraries say it (`context.library`).
        Self.literal(#"},"library":"#, &out)
        out += Self.library
        if isWhen, let screen = r[.screen] { Self.member(#","screen":"#, screen, &out) }
        if hasSession {
            Self.literal(#","session":"#, &out)
            Self.quoted(&out) { $0.append(session) }
        }
        Self.literal("}", &out)
        if isWhen { Self.member(#","event":"#, name, &out) }
        Self.literal(#","integrations":{},"messageId":"#, &out)
        Self.messageID(seq: r.seq, &out) { text in
            if let id = r[.id], id.kind == .string {
                text.append(id)
            } else {
                text.append(app)
                text.append(":")
                text.append(session)
            }
        }
        if !isWhen { Self.member(#","name":"#, name, &out) }
        if isWhen, let params = r[.params] {
            // The first of a key given twice, as whend's plugins read it; the destination's
            // reader would take the last.
            Self.literal(#","properties":"#, &out)
            repeatedKeys.withFirstOfEach(params.raw) { Self.appendCopied($0, &out) }
        } else if isWhen {
            Self.literal(#","properties":{}"#, &out)
        } else if let previous = r[.previous], previous.kind == .string {
            Self.member(#","properties":{"previous":"#, previous, &out)
            Self.literal("}", &out)
        } else {
            Self.literal(#","properties":{}"#, &out)
        }
        Self.member(#","timestamp":"#, r.time, or: #""""#, &out)
        Self.literal(isWhen ? #","type":"track""# : #","type":"screen""#, &out)
        Self.member(#","userId":"#, user, or: "null", &out)
        Self.literal("}", &out)
        return out
    }

    /// Whether a record's `_origin` (`app` when it has none) is `source`.
    private static func isFrom(_ origin: JSONValue?, _ source: String) -> Bool {
        guard let origin, let contents = origin.stringContents else { return source == "app" }
        guard DecodedText.isPlain(contents) else { return origin.string == source }
        var source = source
        return source.withUTF8 { JSONBytes.equal(contents, $0) }
    }

    @inline(__always)
    private static func literal(_ text: StaticString, _ out: inout [UInt8]) {
        out.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    @inline(__always)
    private static func member(_ prefix: StaticString, _ value: JSONValue, _ out: inout [UInt8]) {
        literal(prefix, &out)
        appendCopied(value.raw, &out)
    }

    @inline(__always)
    private static func member(
        _ prefix: StaticString, _ value: JSONValue?, or absent: StaticString, _ out: inout [UInt8]
    ) {
        literal(prefix, &out)
        if let value { appendCopied(value.raw, &out) } else { literal(absent, &out) }
    }

    /// A value as stored, but with the escape of a lone surrogate (a `\ud800` without its
    /// partner, which whend stores as an app sent it) written as U+FFFD's, as the strings the
    /// event decodes have it: strict JSON readers (Foundation's; I-JSON) refuse a whole batch for
    /// one. Escapes are only ever replaced by escapes, so the value's shape is the same.
    static func appendCopied(_ raw: UnsafeBufferPointer<UInt8>, _ out: inout [UInt8]) {
        guard let base = raw.baseAddress, memchr(base, 0x5C, raw.count) != nil else {
            out.append(contentsOf: raw)
            return
        }
        func hex4(_ at: Int) -> UInt32? {
            var v: UInt32 = 0
            for k in at..<at + 4 {
                let b = raw[k]
                let digit: UInt8
                switch b {
                case 0x30...0x39: digit = b - 0x30
                case 0x41...0x46: digit = b - 0x41 + 10
                case 0x61...0x66: digit = b - 0x61 + 10
                default: return nil
                }
                v = v << 4 | UInt32(digit)
            }
            return v
        }
        let n = raw.count
        var i = 0
        var copied = 0
        while i < n {
            guard raw[i] == UInt8(ascii: "\\") else {
                i += 1
                continue
            }
            // `\uXXXX` with its four digits; any other escape is two bytes.
            guard i + 5 < n, raw[i + 1] == UInt8(ascii: "u"), let v = hex4(i + 2) else {
                i += 2
                continue
            }
            if v >= 0xD800 && v <= 0xDBFF, i + 11 < n, raw[i + 6] == UInt8(ascii: "\\"),
                raw[i + 7] == UInt8(ascii: "u"),
                let w = hex4(i + 8), w >= 0xDC00 && w <= 0xDFFF
            {
                i += 12
                continue
            }
            guard v >= 0xD800 && v <= 0xDFFF else {
                i += 6
                continue
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: raw[copied..<i]))
            out.append(contentsOf: #"\ufffd"#.utf8)
            i += 6
            copied = i
        }
        out.append(contentsOf: UnsafeBufferPointer(rebasing: raw[copied..<n]))
    }

    /// A JSON string of the text `body` appends.
    private static func quoted(_ out: inout [UInt8], _ body: (inout DecodedText) -> Void) {
        var text = DecodedText(out: out, start: out.count + 1)
        out = []
        text.out.append(UInt8(ascii: "\""))
        body(&text)
        out = text.finishQuoted()
    }

    /// Stable per record, so that an event sent twice is one event downstream: `whend-<_seq>-<id>`
    /// as a JSON string, `id` the text `body` appends, under the 100 characters Segment allows, counted in UTF-8 bytes (a
    /// longer id is replaced by its digest).
    private static func messageID(seq: UInt64, _ out: inout [UInt8], _ body: (inout DecodedText) -> Void) {
        var text = DecodedText(out: out, start: out.count + 1)
        out = []
        text.out.append(UInt8(ascii: "\""))
        literal("whend-", &text.out)
        JSONBytes.appendDecimal(seq, to: &text.out)
        text.out.append(UInt8(ascii: "-"))
        let idStart = text.out.count
        body(&text)
        if text.out.count - text.start >= 100 {
            let id = Array(text.out[idStart...])
            text.out.removeSubrange(idStart...)
            var hash = SipHash128()
            hash.write(id)
            let (a, b) = hash.finalize()
            text.out.append(contentsOf: (String(a, radix: 16) + String(b, radix: 16)).utf8)
        }
        out = text.finishQuoted()
    }
}

/// The decoded text of string fields, appended after an opening quote: a field's contents as
/// stored when they are plain printable ASCII (nothing to decode, nothing to escape), else
/// decoded as `JSONValue.string` decodes them. `finishQuoted()` escapes the text again where it
/// needs it and closes the quote.
struct DecodedText {
    var out: [UInt8]
    /// Where the text starts in `out`.
    let start: Int
    /// Whether every byte appended is plain printable ASCII other than a quote or backslash.
    private var plain = true

    init(out: [UInt8], start: Int) {
        self.out = out
        self.start = start
    }

    /// A string field's text; nothing for a field that is absent or not a string.
    mutating func append(_ value: JSONValue?) {
        guard let value, let contents = value.stringContents else { return }
        if Self.isPlain(contents) {
            out.append(contentsOf: contents)
        } else if let text = value.string {
            plain = false
            out.append(contentsOf: text.utf8)
        }
    }

    mutating func append(_ text: StaticString) {
        out.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    consuming func finishQuoted() -> [UInt8] {
        if plain {
            out.append(UInt8(ascii: "\""))
            return out
        }
        let text = Array(out[start...])
        out.removeSubrange((start - 1)...)
        appendJSONString(text, to: &out)
        return out
    }

    static func isPlain(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        for b in bytes where b < 0x20 || b >= 0x7F || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") {
            return false
        }
        return true
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(Analytics.self) }
