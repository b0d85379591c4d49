import Foundation
import OTelSemanticConventions
import SwiftProtobuf
import WhendPluginSDK
import WhendWire

typealias AnyValue = Opentelemetry_Proto_Common_V1_AnyValue
typealias KeyValue = Opentelemetry_Proto_Common_V1_KeyValue

/// How a whend record becomes an OpenTelemetry log record (the table is in docs/plugins.md):
/// the event name says what happened (`whend.<type>`, `whend.when.<name>`), the times are the
/// app's (`ts`) and whend's (`_rt`), the attributes are the semantic conventions' names where
/// they have one, and the body is the app's own members, nested values included.
enum LogRecordMapping {
    static func logRecord(for r: PluginRecord) -> LogRecord {
        var log = LogRecord()
        let type = r.string(.type) ?? ""
        if type == "when", let name = r.string(.name) {
            log.eventName = "whend.when." + name
        } else {
            log.eventName = "whend." + type
        }
        if let time = nanoseconds(r[.ts]) { log.timeUnixNano = time }
        if let received = nanoseconds(r[.receivedAt]) { log.observedTimeUnixNano = received }
        switch type {
        case "error":
            log.severityNumber = r.flag(.fatal) ? .fatal : .error
            log.severityText = r.flag(.fatal) ? "FATAL" : "ERROR"
        case "diagnostic":
            log.severityNumber = .warn
            log.severityText = "WARN"
        default:
            log.severityNumber = .info
            log.severityText = "INFO"
        }

        var attributes: [KeyValue] = []
        func add(_ key: String, _ value: AnyValue?) {
            guard let value else { return }
            attributes.append(
                KeyValue.with {
                    $0.key = key
                    $0.value = value
                })
        }
        add(OTelAttribute.session.id, string(r[.session]))
        add(OTelAttribute.user.id, string(r[.user]))
        // The screen a record is about: named `screen` by the app's events, `name` by a view
        // and a time on screen.
        let screen = type == "screen" || type == "screen_time" ? r[.name] : r[.screen]
        add(OTelAttribute.app.screen.name, string(screen))
        if type == "screen_time", let seconds = r.field("seconds")?.double {
            add("whend.screen_time.seconds", AnyValue.with { $0.doubleValue = seconds })
        }
        add("whend.seq", AnyValue.with { $0.intValue = Int64(truncatingIfNeeded: r.seq) })
        add("whend.rt", string(r[.receivedAt]))
        add("whend.origin", string(r[.origin]))
        if let cause = r[.cause]?.uint64 {
            add("whend.cause", AnyValue.with { $0.intValue = Int64(truncatingIfNeeded: cause) })
        }
        log.attributes = attributes
        log.body = appMembers(of: r.bytes)
        return log
    }

    /// One request: a resource per app (`service.name`), in the order they first come, each
    /// with whend as the instrumentation scope and its records in `_seq` order.
    static func request(_ batch: ArraySlice<ExportQueue.Entry>)
        -> Opentelemetry_Proto_Collector_Logs_V1_ExportLogsServiceRequest
    {
        var order: [String] = []
        var records: [String: [LogRecord]] = [:]
        for entry in batch {
            guard let log = entry.log else { continue }
            // OpenTelemetry's name for a service that did not say: no record is left out.
            let service = entry.service ?? "unknown_service"
            if records[service] == nil { order.append(service) }
            records[service, default: []].append(log)
        }
        return .with { request in
            request.resourceLogs = order.map { service in
                .with {
                    $0.resource = .with {
                        $0.attributes = [
                            KeyValue.with {
                                $0.key = OTelAttribute.service.name
                                $0.value = AnyValue.with { $0.stringValue = service }
                            }
                        ]
                    }
                    $0.scopeLogs = [
                        .with {
                            $0.scope = .with {
                                $0.name = "whend"
                                $0.version = OTLPExport.version
                            }
                            $0.logRecords = records[service] ?? []
                        }
                    ]
                }
            }
        }
    }

    /// An RFC 3339 string as nanoseconds since 1970; nil if it is none (the field is then left 0,
    /// which OTLP reads as unknown).
    static func nanoseconds(_ value: JSONValue?) -> UInt64? {
        guard let text = value?.stringContents, let instant = RFC3339.parse(text), instant.seconds >= 0 else {
            return nil
        }
        return UInt64(instant.seconds) * 1_000_000_000 + UInt64(instant.nanoseconds)
    }

    static func string(_ value: JSONValue?) -> AnyValue? {
        guard let text = value?.string else { return nil }
        return AnyValue.with { $0.stringValue = text }
    }

    /// The record's members but whend's own (`_…`), in order, as a key-value list.
    static func appMembers(of bytes: UnsafeBufferPointer<UInt8>) -> AnyValue {
        keyValueList(bytes, leavingOutWhends: true)
    }

    /// An object as a key-value list, in order; `leavingOutWhends` at the top of a record only
    /// (an app's `_` keys are reserved there, not in its nested values). A key the object gives
    /// twice is listed once, with its first value: OTLP allows each key of a list once, and
    /// whend's own readers take the first.
    private static func keyValueList(_ raw: UnsafeBufferPointer<UInt8>, leavingOutWhends: Bool) -> AnyValue {
        var list = Opentelemetry_Proto_Common_V1_KeyValueList()
        var given = Set<[UInt8]>()
        var scanner = JSONScanner(raw)
        // A stored record is valid JSON: whend checked it before it was stored.
        try? scanner.scanObject { m in
            let key = m.keyHasEscapes ? decodeJSONString(UnsafeBufferPointer(rebasing: raw[m.key])) : Array(raw[m.key])
            if leavingOutWhends && key.first == UInt8(ascii: "_") { return }
            // As the collector reads it: by its bytes (two spellings Unicode takes for one text
            // are two keys), a lone surrogate as U+FFFD, which `key` already has.
            guard given.insert(key).inserted else { return }
            list.values.append(
                KeyValue.with {
                    $0.key = String(decoding: key, as: UTF8.self)
                    $0.value = anyValue(m.kind, UnsafeBufferPointer(rebasing: raw[m.value]))
                })
        }
        return AnyValue.with { $0.kvlistValue = list }
    }

    /// A JSON value as OTLP's AnyValue: objects as key-value lists, arrays as arrays, integers
    /// that fit as ints, other numbers as doubles, and null as an AnyValue with no value.
    static func anyValue(_ kind: JSONKind, _ raw: UnsafeBufferPointer<UInt8>) -> AnyValue {
        let value = JSONValue(raw: raw)
        var out = AnyValue()
        switch kind {
        case .string: out.stringValue = value.string ?? ""
        case .bool: out.boolValue = value.bool ?? false
        case .null: break
        case .number:
            let integral = !raw.contains {
                $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E")
            }
            if integral, let n = Int64(String(decoding: raw, as: UTF8.self)) {
                out.intValue = n
            } else {
                out.doubleValue = value.double ?? 0
            }
        case .object: out = keyValueList(raw, leavingOutWhends: false)
        case .array:
            var array = Opentelemetry_Proto_Common_V1_ArrayValue()
            var scanner = JSONScanner(raw)
            try? scanner.scanArray { kind, range in
                array.values.append(anyValue(kind, UnsafeBufferPointer(rebasing: raw[range])))
            }
            out.arrayValue = array
        }
        return out
    }
}
