@_exported import CWhendPlugin
import CWhendPluginABI
import Foundation
@_exported import WhendWire

/// What a plugin can be: ingest middleware (in the daemon, before the journal) or a pipeline
/// stage (in a worker, after the journal).
public struct PluginRoles: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let ingest = PluginRoles(rawValue: WHEND_ROLE_INGEST)
    public static let pipeline = PluginRoles(rawValue: WHEND_ROLE_PIPELINE)
    /// A pipeline stage that finishes records later: see `PluginHost.complete(_:)`.
    public static let deferred = PluginRoles(rawValue: WHEND_ROLE_DEFERRED)
}

/// Thrown from `handle`: `reject` refuses the event (ingest; the client gets `rejected` with the
/// message), `fail` says the plugin cannot handle the record now (a pipeline retries).
public enum PluginError: Error {
    case reject(String)
    case fail(String)
}

/// A record as stored: JSON bytes valid only during the call. A view, not a copy.
///
/// The well-known fields (`RecordField`) are found as they are asked for (the record is read
/// no further than that) and read as `JSONValue` views: a plugin that looks at a record's type
/// and passes it on allocates nothing and reads a few bytes. `field(_:)` finds any other top-level key; `object()` decodes the whole record.
public struct PluginRecord {
    public let bytes: UnsafeBufferPointer<UInt8>
    /// `_seq`; 0 before the journal (ingest).
    public let seq: UInt64
    /// The instance's index, reset for this record and filled as fields are asked for (the
    /// records whend hands a plugin), or nil with `index` complete (a record it makes itself).
    private let lazy: UnsafeMutablePointer<RecordFieldIndex>?
    private let index: RecordFieldIndex?

    public init(bytes: UnsafeBufferPointer<UInt8>, seq: UInt64) {
        self.bytes = bytes
        self.seq = seq
        lazy = nil
        index = RecordFieldIndex(bytes)
    }

    init(bytes: UnsafeBufferPointer<UInt8>, seq: UInt64, index: UnsafeMutablePointer<RecordFieldIndex>) {
        self.bytes = bytes
        self.seq = seq
        index.pointee.reset()
        lazy = index
        self.index = nil
    }

    /// A well-known field's value, if the record has it.
    public subscript(_ field: RecordField) -> JSONValue? {
        // A record from the journal (`_seq` above 0) is in whend's layout, its trusted members last.
        let span = lazy.map { $0.pointee.find(field, in: bytes, storedLayout: seq > 0) } ?? index?.stored(field)
        return span.map { JSONValue(raw: UnsafeBufferPointer(rebasing: bytes[$0])) }
    }

    /// Any top-level field, by key (a well-known one from the field index, any other found by a
    /// pass over the record).
    public func field(_ key: String) -> JSONValue? {
        var wanted = key
        if let known = wanted.withUTF8({ RecordField.named($0) }) { return self[known] }
        var found: Range<Int>?
        wanted.withUTF8 { want in
            _ = forEachMember(of: bytes) { name, escaped, value in
                let same =
                    escaped
                    ? decodeJSONString(name).elementsEqual(want)
                    : JSONBytes.equal(name, want)
                if same { found = value }
                return !same
            }
        }
        return found.map { JSONValue(raw: UnsafeBufferPointer(rebasing: bytes[$0])) }
    }

    /// A well-known string field, decoded.
    public func string(_ field: RecordField) -> String? { self[field]?.string }

    /// Whether a well-known field is the string `text`.
    public func has(_ field: RecordField, _ text: StaticString) -> Bool { self[field]?.isString(text) ?? false }

    /// A well-known field that is `true`.
    public func flag(_ field: RecordField) -> Bool { self[field]?.bool ?? false }

    /// When it happened: the client's `ts` when it gave one, else when whend received it.
    public var time: JSONValue? { self[.ts] ?? self[.receivedAt] }

    /// `time` as seconds since 1970.
    public var seconds: Double? { time?.seconds }

    /// Whether a plugin derived it (it carries `_origin`). For a record from the journal this
    /// reads no further than the app's own fields: whend stores the trusted ones after them,
    /// `_origin` first.
    public var isDerived: Bool {
        guard let lazy, seq > 0 else { return self[.origin] != nil }
        return lazy.pointee.isDerived(in: bytes)
    }

    /// The record decoded (a copy, for plugins that do not mind the cost).
    public func object() throws -> [String: Any] {
        guard let o = try JSONSerialization.jsonObject(with: Data(buffer: bytes)) as? [String: Any] else {
            throw PluginError.fail("the record is not a JSON object")
        }
        return o
    }

    public var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// The continuation: call it with the record, or a changed one, to pass it on. Not calling it
/// drops the record.
public struct PluginNext {
    let call: whend_next_fn
    let context: UnsafeMutableRawPointer?

    init(call: whend_next_fn, context: UnsafeMutableRawPointer?) {
        self.call = call
        self.context = context
    }

    public func callAsFunction(_ record: PluginRecord) throws { try pass(record.bytes) }

    public func callAsFunction(_ json: [UInt8]) throws { try json.withUnsafeBufferPointer { try pass($0) } }

    public func callAsFunction(_ object: [String: Any]) throws {
        try self(Array(try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])))
    }

    private func pass(_ bytes: UnsafeBufferPointer<UInt8>) throws {
        let rc = call(context, bytes.baseAddress, bytes.count)
        if rc == WHEND_REJECT { throw PluginError.reject("rejected further down") }
        if rc != WHEND_OK { throw PluginError.fail("failed further down") }
    }
}

/// The services whend gives a plugin instance.
public struct PluginHost: @unchecked Sendable {
    // Unchecked: the host table lives until the instance is destroyed, and its functions are
    // callable from any thread.
    let host: UnsafePointer<whend_host>

    public enum Level: Int32 {
        case debug = 0
        case info = 1
        case warning = 2
        case error = 3
    }

    public func log(_ level: Level = .info, _ message: String) {
        host.pointee.log(host.pointee.context, level.rawValue, message)
    }

    /// Appends a derived record to the journal (the host sets `_origin` and `_cause`), stored as
    /// these bytes: build it with `JSONObjectWriter`.
    public func emit(_ record: JSONObjectWriter) throws { try emit(record.bytes) }

    /// Appends a derived record to the journal (the host sets `_origin` and `_cause`).
    public func emit(_ json: [UInt8]) throws {
        let rc = json.withUnsafeBufferPointer { host.pointee.emit(host.pointee.context, $0.baseAddress, $0.count) }
        if rc != WHEND_OK { throw PluginError.fail("whend could not append the derived record") }
    }

    public func count(_ name: String, by delta: Int64 = 1) {
        host.pointee.count(host.pointee.context, name, delta)
    }

    /// For a `.deferred` stage: record `seq` is done, and the pipeline's cursor may pass it.
    /// Callable from any thread. Does nothing where there is no cursor (a replay).
    public func complete(_ seq: UInt64) {
        let minimum = MemoryLayout<whend_host>.offset(of: \whend_host.complete)! + MemoryLayout<UnsafeRawPointer>.size
        guard Int(host.pointee.struct_size) >= minimum, let complete = host.pointee.complete else { return }
        complete(host.pointee.context, seq)
    }

    /// For a `.deferred` stage that finishes records in the order it was given them: every
    /// record up to and including `seq` is done (one call for many). Callable from any thread.
    /// Falls back to nothing on a host that predates it only where there is no cursor.
    public func complete(through seq: UInt64) {
        let minimum =
            MemoryLayout<whend_host>.offset(of: \whend_host.complete_through)! + MemoryLayout<UnsafeRawPointer>.size
        guard Int(host.pointee.struct_size) >= minimum, let completeThrough = host.pointee.complete_through else {
            return
        }
        completeThrough(host.pointee.context, seq)
    }

    /// The plugin's own directory, kept across restarts.
    public var stateDirectory: String { String(cString: host.pointee.state_directory) }
}

/// A whend plugin: one type, exported with one line:
///
///     @_cdecl("whend_plugin_entry") public func entry() -> UnsafeRawPointer { exportPlugin(MyPlugin.self) }
public protocol WhendPlugin: AnyObject {
    static var name: String { get }
    static var version: String { get }
    static var roles: PluginRoles { get }
    /// `configuration` is the plugin's JSON object from whend's configuration (empty if none).
    /// Throw to refuse one the plugin cannot work with: `whend --check-config` and a reload create
    /// an instance first, in a short-lived process with an empty scratch state directory, and
    /// refuse the configuration with the error's message (see `whend_plugin.create`).
    init(host: PluginHost, configuration: [String: Any]) throws
    /// Handles one record; calls `next` to pass it (or a changed one) on.
    func handle(_ record: PluginRecord, next: PluginNext) throws
    /// Makes durable what the plugin wrote or holds for the records it has handled — written
    /// and synced (`fdatasync`), so that neither a SIGKILL nor a power cut loses it: a
    /// pipeline's worker calls it before it saves its cursor (or a snapshot) past them, at most
    /// every tenth of a second while records flow, and retries later if it throws. A plugin may
    /// then batch its writes and sync once per flush, not per record. By default, nothing.
    func flush() throws
}

extension WhendPlugin {
    public func flush() throws {}
}

/// A plugin whose state survives restarts: declare the state `Codable` and keep it in `state`.
/// A pipeline's worker saves it with its cursor every so often (JSON, beside the cursor; or the
/// compact bytes of `CompactCodable`, much faster, when the state conforms to it too) and
/// restores it after a restart before the first record, so that what the plugin derives after
/// a crash is what it would have derived without one. A snapshot of another plugin version, or
/// one that cannot be read, is not used: the worker rebuilds the state from the journal.
public protocol PersistentStatePlugin: WhendPlugin {
    associatedtype State: Codable
    var state: State { get set }
}

/// What a compact state's bytes begin with: JSON never does.
private let compactStateMagic: [UInt8] = Array("\u{0}whend-state-1\n".utf8)

private func encodeState<P: PersistentStatePlugin>(_ plugin: P) throws -> [UInt8] {
    if let compact = plugin.state as? any CompactCodable {
        var writer = CompactWriter(capacity: 1 << 20)
        writer.bytes += compactStateMagic
        compact.encode(to: &writer)
        return writer.bytes
    }
    if let lines = plugin.state as? any LineSnapshot {
        var out: [UInt8] = []
        try lines.snapshotLines { out += $0 }
        return out
    }
    return Array(try JSONEncoder().encode(plugin.state))
}

private func decodeState<P: PersistentStatePlugin>(_ plugin: P, _ bytes: [UInt8]) throws {
    if bytes.starts(with: compactStateMagic) {
        guard let type = P.State.self as? any CompactCodable.Type else {
            throw StateDamaged("saved in the compact form, which \(P.State.self) does not read")
        }
        var reader = CompactReader(bytes, from: compactStateMagic.count)
        guard let state = try type.init(from: &reader) as? P.State, reader.isAtEnd else {
            throw StateDamaged("the saved state has bytes past its end")
        }
        plugin.state = state
    } else if let type = P.State.self as? any LineSnapshot.Type,
        let state = try type.init(snapshotLines: bytes) as? P.State
    {
        plugin.state = state
    } else {
        plugin.state = try JSONDecoder().decode(P.State.self, from: Data(bytes))
    }
}

/// The one plugin type this library exports, and its C description. One plugin per library.
nonisolated(unsafe) private var exportedType: (any WhendPlugin.Type)?
nonisolated(unsafe) private var exportedDescription: UnsafeMutablePointer<whend_plugin>?

/// Describes `type` to whend through the C ABI. Call it from `whend_plugin_entry`.
public func exportPlugin<P: WhendPlugin>(_ type: P.Type) -> UnsafeRawPointer {
    if let exportedDescription { return UnsafeRawPointer(exportedDescription) }
    exportedType = type
    let description = UnsafeMutablePointer<whend_plugin>.allocate(capacity: 1)
    description.initialize(
        to: whend_plugin(
            abi_version: whend_plugin_abi_version,
            struct_size: UInt32(MemoryLayout<whend_plugin>.size),
            name: strdup(P.name), version: strdup(P.version), roles: P.roles.rawValue,
            create: createInstance, destroy: destroyInstance, handle: handleRecord,
            snapshot: type is any PersistentStatePlugin.Type ? snapshotInstance : nil,
            restore: type is any PersistentStatePlugin.Type ? restoreInstance : nil, flush: flushInstance))
    exportedDescription = description
    return UnsafeRawPointer(description)
}

/// Holds an instance for the C side; the host keeps the pointer, so no reference counting
/// happens per record.
private final class InstanceBox {
    let plugin: any WhendPlugin
    /// The field index of the record in hand: one per instance, whose calls never overlap.
    let index = UnsafeMutablePointer<RecordFieldIndex>.allocate(capacity: 1)

    init(_ plugin: any WhendPlugin) {
        self.plugin = plugin
        index.initialize(to: RecordFieldIndex())
    }

    deinit {
        index.deinitialize(count: 1)
        index.deallocate()
    }
}

private func write(_ text: String, to buffer: UnsafeMutablePointer<CChar>?, capacity: Int) {
    guard let buffer, capacity > 0 else { return }
    let bytes = Array(text.utf8.prefix(capacity - 1))
    bytes.withUnsafeBufferPointer { b in
        for i in 0..<b.count { buffer[i] = CChar(bitPattern: b[i]) }
    }
    buffer[bytes.count] = 0
}

private let createInstance:
    @convention(c) (
        UnsafePointer<whend_host>?, UnsafePointer<CChar>?, Int, UnsafeMutablePointer<CChar>?, Int
    ) -> UnsafeMutableRawPointer? = { host, config, length, errorBuffer, capacity in
        guard let host, let type = exportedType else {
            write("the plugin was not exported", to: errorBuffer, capacity: capacity)
            return nil
        }
        do {
            var configuration: [String: Any] = [:]
            if let config, length > 0 {
                let data = Data(bytes: config, count: length)
                guard let object = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
                    throw PluginError.fail("the configuration is not a JSON object")
                }
                configuration = object
            }
            let plugin = try type.init(host: PluginHost(host: host), configuration: configuration)
            return Unmanaged.passRetained(InstanceBox(plugin)).toOpaque()
        } catch PluginError.fail(let message), PluginError.reject(let message) {
            write(message, to: errorBuffer, capacity: capacity)
        } catch {
            write("\(error)", to: errorBuffer, capacity: capacity)
        }
        return nil
    }

private let destroyInstance: @convention(c) (UnsafeMutableRawPointer?) -> Void = { instance in
    guard let instance else { return }
    Unmanaged<InstanceBox>.fromOpaque(instance).release()
}

private let handleRecord:
    @convention(c) (
        UnsafeMutableRawPointer?, UnsafePointer<whend_record>?, whend_next_fn?, UnsafeMutableRawPointer?,
        UnsafeMutablePointer<CChar>?, Int
    ) -> Int32 = { instance, record, next, nextContext, message, capacity in
        guard let instance, let record, let next else { return Int32(WHEND_FAIL) }
        let continuation = PluginNext(call: next, context: nextContext)
        do {
            // Borrowed, not retained: the host holds the instance for as long as it calls it.
            try Unmanaged<InstanceBox>.fromOpaque(instance)._withUnsafeGuaranteedRef { box in
                let view = PluginRecord(
                    bytes: UnsafeBufferPointer(start: record.pointee.json, count: record.pointee.length),
                    seq: record.pointee.seq, index: box.index)
                try box.plugin.handle(view, next: continuation)
            }
            return Int32(WHEND_OK)
        } catch PluginError.reject(let text) {
            write(text, to: message, capacity: capacity)
            return Int32(WHEND_REJECT)
        } catch PluginError.fail(let text) {
            write(text, to: message, capacity: capacity)
            return Int32(WHEND_FAIL)
        } catch {
            write("\(error)", to: message, capacity: capacity)
            return Int32(WHEND_FAIL)
        }
    }

private let snapshotInstance:
    @convention(c) (
        UnsafeMutableRawPointer?,
        (@convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UInt8>?, Int) -> Void)?, UnsafeMutableRawPointer?
    ) -> Int32 = { instance, write, context in
        guard let instance, let write else { return Int32(WHEND_FAIL) }
        let plugin = Unmanaged<InstanceBox>.fromOpaque(instance).takeUnretainedValue().plugin
        guard let persistent = plugin as? any PersistentStatePlugin, let bytes = try? encodeState(persistent) else {
            return Int32(WHEND_FAIL)
        }
        bytes.withUnsafeBufferPointer { write(context, $0.baseAddress, $0.count) }
        return Int32(WHEND_OK)
    }

private let flushInstance: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutablePointer<CChar>?, Int) -> Int32 = {
    instance, errorBuffer, capacity in
    guard let instance else { return Int32(WHEND_FAIL) }
    do {
        try Unmanaged<InstanceBox>.fromOpaque(instance).takeUnretainedValue().plugin.flush()
        return Int32(WHEND_OK)
    } catch {
        write("\(error)", to: errorBuffer, capacity: capacity)
        return Int32(WHEND_FAIL)
    }
}

private let restoreInstance:
    @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<CChar>?, Int) -> Int32 =
        {
            instance, bytes, length, errorBuffer, capacity in
            guard let instance else { return Int32(WHEND_FAIL) }
            let plugin = Unmanaged<InstanceBox>.fromOpaque(instance).takeUnretainedValue().plugin
            guard let persistent = plugin as? any PersistentStatePlugin else { return Int32(WHEND_FAIL) }
            do {
                try decodeState(persistent, bytes.map { Array(UnsafeBufferPointer(start: $0, count: length)) } ?? [])
                return Int32(WHEND_OK)
            } catch {
                write("the saved state cannot be read: \(error)", to: errorBuffer, capacity: capacity)
                return Int32(WHEND_FAIL)
            }
        }
