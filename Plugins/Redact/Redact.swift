import WhendPluginSDK

/// Ingest middleware that removes fields before an event reaches the journal: every key named
/// in `fields`, at any depth (so `"email"` also goes from inside `params`). Configuration:
/// `{"fields": ["email", "password"]}`.
final class Redact: WhendPlugin {
    static let name = "redact"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.ingest, .pipeline]

    private let fields: Set<String>
    /// Each field as a quoted key is spelled plainly: `"email"`.
    private let quoted: [[UInt8]]

    init(host: PluginHost, configuration: [String: Any]) throws {
        fields = Set(configuration["fields"] as? [String] ?? [])
        guard !fields.isEmpty else { throw PluginError.fail(#"redact needs {"fields": ["name", …]}"#) }
        quoted = fields.sorted().map { Array("\"\($0)\"".utf8) }
        host.log(.info, "redacting \(fields.sorted().joined(separator: ", "))")
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        // Most records carry none of the fields: pass those on untouched, without decoding. A
        // record with any escape is decoded: a key may spell a field with `\u` escapes.
        let bytes = record.bytes
        guard bytes.contains(UInt8(ascii: "\\")) || quoted.contains(where: { JSONBytes.contains(bytes, $0) }) else {
            return try next(record)
        }
        try next(strip(try record.object()) as? [String: Any] ?? [:])
    }

    private func strip(_ value: Any) -> Any {
        if let object = value as? [String: Any] {
            return object.filter { !fields.contains($0.key) }.mapValues(strip)
        }
        if let array = value as? [Any] { return array.map(strip) }
        return value
    }
}

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(Redact.self) }
