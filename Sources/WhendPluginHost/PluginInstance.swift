import CWhendPlugin
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendSystem
import WhendWire

/// One created instance of a plugin, with the services whend offers it. Calls into the
/// instance are serialised: a plugin never sees two records at once.
package final class PluginInstance: @unchecked Sendable {
    // Unchecked: `instance` and `host` are set in init and freed in deinit; every call into
    // the plugin happens under `lock`.
    package let library: PluginLibrary
    package let configuration: String
    private let instance: UnsafeMutableRawPointer
    private let host: UnsafeMutablePointer<whend_host>
    private let services: Unmanaged<PluginServices>
    private let lock = NIOLock()

    package var name: String { library.name }
    package var counters: [String: Int64] { services.takeUnretainedValue().counters.withLockedValue { $0 } }
    /// The secret values of its configuration: what it says prints them as `***`.
    package var secrets: Set<String> { services.takeUnretainedValue().secrets }

    /// - Parameters:
    ///   - secrets: secret values beyond those `Secrets.values` finds in `configuration`: those
    ///     read from files and credentials, which are secrets wherever they are.
    ///   - emit: where the plugin's derived records go (pipelines only); without it, `emit` fails.
    package init(
        library: PluginLibrary, configuration: String, secrets: Set<String> = [], stateDirectory: String,
        logger: Logger,
        emit: (@Sendable (String, UnsafeBufferPointer<UInt8>) -> Bool)? = nil,
        complete: (@Sendable (UInt64) -> Void)? = nil, completeThrough: (@Sendable (UInt64) -> Void)? = nil
    ) throws(PluginLoadError) {
        self.library = library
        self.configuration = configuration
        try? DurableFile.createDirectory(stateDirectory)
        let services = Unmanaged.passRetained(
            PluginServices(
                name: library.name, logger: logger, emit: emit, complete: complete, completeThrough: completeThrough,
                secrets: Secrets.values(in: configuration).union(secrets)))
        self.services = services
        let host = UnsafeMutablePointer<whend_host>.allocate(capacity: 1)
        self.host = host
        host.initialize(
            to: whend_host(
                abi_version: WHEND_PLUGIN_ABI_VERSION, struct_size: UInt32(MemoryLayout<whend_host>.size),
                context: services.toOpaque(), log: hostLog, emit: hostEmit, count: hostCount,
                state_directory: strdup(stateDirectory), complete: hostComplete,
                complete_through: hostCompleteThrough))
        var error = [CChar](repeating: 0, count: 1024)
        let capacity = error.count
        let config = Array(configuration.utf8)
        let create = library.descriptor.pointee.create!
        let created = config.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { create(host, $0.baseAddress, $0.count, &error, capacity) }
        }
        // What a plugin did to 3 and 4 is not left for the next plugin (`PluginDescriptors`).
        PluginDescriptors.refill()
        guard let created else {
            free(UnsafeMutableRawPointer(mutating: host.pointee.state_directory))
            host.deallocate()
            // A plugin may quote its configuration when it refuses it.
            let why = Secrets.scrub(
                String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self),
                services.takeUnretainedValue().secrets)
            services.release()
            throw PluginLoadError(
                .refused,
                description: "plugin \(library.name) would not start: \(why.isEmpty ? "no reason given" : why)")
        }
        instance = created
    }

    deinit {
        lock.withLock { library.descriptor.pointee.destroy(instance) }
        PluginDescriptors.refill()
        free(UnsafeMutableRawPointer(mutating: host.pointee.state_directory))
        host.deallocate()
        services.release()
    }

    /// Whether the plugin can save and restore its state (`snapshot` and `restore` in ABI 1).
    package var keepsState: Bool {
        let d = library.descriptor.pointee
        let minimum =
            MemoryLayout<whend_plugin>.offset(of: \whend_plugin.restore)! + MemoryLayout<UnsafeRawPointer>.size
        return Int(d.struct_size) >= minimum && d.snapshot != nil && d.restore != nil
    }

    /// The plugin's state as bytes, or nil if it keeps none or could not give it.
    package func snapshot() -> [UInt8]? {
        guard keepsState, let snapshot = library.descriptor.pointee.snapshot else { return nil }
        let sink = SnapshotSink()
        let rc = lock.withLock {
            snapshot(instance, snapshotWrite, Unmanaged.passUnretained(sink).toOpaque())
        }
        return rc == WHEND_OK ? sink.bytes : nil
    }

    /// Gives the plugin back a state `snapshot()` took; throws with the plugin's reason.
    package func restore(_ bytes: [UInt8]) throws(PluginLoadError) {
        guard keepsState, let restore = library.descriptor.pointee.restore else {
            throw PluginLoadError(.state, description: "plugin \(library.name) keeps no state")
        }
        var error = [CChar](repeating: 0, count: 1024)
        let capacity = error.count
        let rc = lock.withLock {
            bytes.withUnsafeBufferPointer { restore(instance, $0.baseAddress, $0.count, &error, capacity) }
        }
        PluginDescriptors.refill()
        guard rc == WHEND_OK else {
            // A plugin may quote its configuration when it refuses it.
            let why = Secrets.scrub(
                String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self),
                services.takeUnretainedValue().secrets)
            throw PluginLoadError(.state, description: "plugin \(library.name) could not restore its state: \(why)")
        }
    }

    /// Asks the plugin to make durable what it holds for the records handled (ABI 1's `flush`,
    /// when the plugin has it); throws with the plugin's reason.
    package func flush() throws(PluginLoadError) {
        let d = library.descriptor.pointee
        let minimum =
            MemoryLayout<whend_plugin>.offset(of: \whend_plugin.flush)! + MemoryLayout<UnsafeRawPointer>.size
        guard Int(d.struct_size) >= minimum, let flush = d.flush else { return }
        var error = [CChar](repeating: 0, count: 1024)
        let capacity = error.count
        let rc = lock.withLock { flush(instance, &error, capacity) }
        guard rc == WHEND_OK else {
            // A plugin may quote its configuration when it refuses it.
            let why = Secrets.scrub(
                String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self),
                services.takeUnretainedValue().secrets)
            throw PluginLoadError(.state, description: "plugin \(library.name) could not flush: \(why)")
        }
    }

    /// Calls the plugin's middleware with `record`; `next` continues the chain.
    package func handle(
        _ record: UnsafePointer<whend_record>, next: whend_next_fn, context: UnsafeMutableRawPointer,
        message: UnsafeMutablePointer<CChar>, capacity: Int
    ) -> Int32 {
        lock.withLock { library.descriptor.pointee.handle(instance, record, next, context, message, capacity) }
    }
}

/// What a plugin instance's host table calls back into.
package final class PluginServices: Sendable {
    package let name: String
    package let logger: Logger
    package let counters = NIOLockedValueBox<[String: Int64]>([:])
    package let emit: (@Sendable (String, UnsafeBufferPointer<UInt8>) -> Bool)?
    package let complete: (@Sendable (UInt64) -> Void)?
    package let completeThrough: (@Sendable (UInt64) -> Void)?
    /// The secret values of the plugin's configuration: its log lines print them as `***`.
    package let secrets: Set<String>

    /// A plugin's counters are its word: at most this many names, each at most
    /// `counterNameLimit` bytes, whatever names it makes up (one per session would grow whend's
    /// memory, and every scrape's size, without end).
    package static let counterLimit = 256
    package static let counterNameLimit = 128
    private let countersRefused = NIOLockedValueBox(false)

    /// Each name a plugin counted under (as UTF-8 decodes it), as it is shown (`shownName`):
    /// made once per name rather than at every call.
    private let shownNames = NIOLockedValueBox<[String: String]>([:])

    /// `host.count`: adds `delta`, saturating (a plugin adding `Int64.max` twice must not trap
    /// the process that hosts it). An empty name, or one past the limits, is not counted, and
    /// said once.
    package func count(_ counter: UnsafePointer<CChar>, _ delta: Int64) {
        let length = strnlen(counter, Self.counterNameLimit + 1)
        var shown: String?
        // Its length is checked before it is looked up: a longer name whose first bytes are a
        // name counted already is not that name.
        if length > 0 && length <= Self.counterNameLimit {
            // A String, not the bytes: a short name allocates nothing on this per-record path.
            // Names whose bytes decode alike show alike, and are summed either way.
            let key = String(decoding: UnsafeRawBufferPointer(start: counter, count: length), as: UTF8.self)
            shown = shownNames.withLockedValue { names -> String? in
                if let shown = names[key] { return shown }
                guard names.count < Self.counterLimit else { return nil }
                let shown = Self.shownName(key, secrets)
                names[key] = shown
                return shown
            }
        }
        let refused = counters.withLockedValue { counters -> Bool in
            guard let shown else { return true }
            let (sum, overflow) = (counters[shown] ?? 0).addingReportingOverflow(delta)
            counters[shown] = overflow ? (delta > 0 ? .max : .min) : sum
            return false
        }
        // Only a refusal looks at whether one was said: a name counted takes no third lock.
        guard refused else { return }
        let saidBefore = countersRefused.withLockedValue { said in
            defer { said = true }
            return said
        }
        if !saidBefore {
            // Scrubbed whole before it is cut, so that a secret the cut falls in is hidden too.
            let longest = secrets.map(\.utf8.count).max() ?? 0
            let whole = Array(
                UnsafeRawBufferPointer(start: counter, count: strnlen(counter, 1024 + 24 * longest)))
            let named = Self.printable(Secrets.scrub(whole, secrets, keeping: Self.counterNameLimit))
            logger.warning(
                "plugin \(name): a counter named \(named.debugDescription)\(whole.count > Self.counterNameLimit ? "…" : "") is not counted: a plugin has at most \(Self.counterLimit) counters, of names of 1 to \(Self.counterNameLimit) bytes (said once)"
            )
        }
    }

    /// A counter's name as `whenctl plugins` and the metrics show it: UTF-8 (a byte that is not
    /// is U+FFFD), its secrets hidden, no control character (a newline or an escape sequence
    /// would forge or garble a listing), and at most `counterNameLimit` bytes (U+FFFD takes three:
    /// a name of 60 invalid bytes became 180, which whend took for a broken worker's message).
    /// Two names may show the same; their counts are summed.
    static func shownName(_ decoded: String, _ secrets: Set<String>) -> String {
        let printable = printable(secrets.isEmpty ? decoded : Secrets.scrub(decoded, secrets))
        var shown = ""
        for character in printable {
            guard shown.utf8.count + character.utf8.count <= counterNameLimit else { break }
            shown.append(character)
        }
        return shown
    }

    private static func printable(_ text: String) -> String {
        String(
            String.UnicodeScalarView(
                text.unicodeScalars.map { scalar in
                    let v = scalar.value
                    return v < 0x20 || (0x7F...0x9F).contains(v) || v == 0x2028 || v == 0x2029 ? "\u{FFFD}" : scalar
                }))
    }

    package init(
        name: String, logger: Logger, emit: (@Sendable (String, UnsafeBufferPointer<UInt8>) -> Bool)?,
        complete: (@Sendable (UInt64) -> Void)?, completeThrough: (@Sendable (UInt64) -> Void)?,
        secrets: Set<String> = []
    ) {
        self.secrets = secrets
        self.name = name
        self.logger = logger
        self.emit = emit
        self.complete = complete
        self.completeThrough = completeThrough
    }
}

/// A plugin's message as one line of whend's log: a line break in it would start a line that
/// reads as whend's own (a collector's error message, quoted by otlp, forged a "critical" one),
/// and a terminal escape would act on whoever reads the log. Both are shown escaped.
func oneLogLine(_ text: String) -> String {
    guard text.unicodeScalars.contains(where: isControl) else { return text }
    var out = ""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out.unicodeScalars.append(scalar)
        case _ where isControl(scalar): out += "\\u{\(String(scalar.value, radix: 16))}"
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out
}

private func isControl(_ scalar: Unicode.Scalar) -> Bool {
    let v = scalar.value
    return (v < 0x20 && v != 0x09) || (0x7F...0x9F).contains(v) || v == 0x2028 || v == 0x2029
}

private let hostLog: @convention(c) (UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void = {
    context, level, message in
    guard let context, let message else { return }
    let services = Unmanaged<PluginServices>.fromOpaque(context).takeUnretainedValue()
    let text = "plugin \(services.name): \(oneLogLine(Secrets.scrubbedLogLine(message, services.secrets)))"
    switch level {
    case WHEND_LOG_DEBUG: services.logger.debug("\(text)")
    case WHEND_LOG_INFO: services.logger.info("\(text)")
    case WHEND_LOG_WARNING: services.logger.warning("\(text)")
    default: services.logger.error("\(text)")
    }
}

// Derived records come from pipelines, which run in workers; in-process ingest middleware has
// no journal position to derive from yet, so emit fails there.
private let hostEmit: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UInt8>?, Int) -> Int32 = {
    context, json, length in
    guard let context, let json else { return Int32(WHEND_FAIL) }
    let services = Unmanaged<PluginServices>.fromOpaque(context).takeUnretainedValue()
    guard let emit = services.emit else { return Int32(WHEND_FAIL) }
    return emit(services.name, UnsafeBufferPointer(start: json, count: length)) ? Int32(WHEND_OK) : Int32(WHEND_FAIL)
}

// A deferred pipeline stage finished a record; elsewhere (ingest, replay) there is no cursor
// to move, and the call does nothing.
private let hostComplete: @convention(c) (UnsafeMutableRawPointer?, UInt64) -> Void = { context, seq in
    guard let context else { return }
    Unmanaged<PluginServices>.fromOpaque(context).takeUnretainedValue().complete?(seq)
}

private let hostCompleteThrough: @convention(c) (UnsafeMutableRawPointer?, UInt64) -> Void = { context, seq in
    guard let context else { return }
    Unmanaged<PluginServices>.fromOpaque(context).takeUnretainedValue().completeThrough?(seq)
}

private let hostCount: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, Int64) -> Void = {
    context, name, delta in
    guard let context, let name else { return }
    let services = Unmanaged<PluginServices>.fromOpaque(context).takeUnretainedValue()
    services.count(name, delta)
}

/// Where a plugin's snapshot() writes.
private final class SnapshotSink {
    package var bytes: [UInt8] = []
}

private let snapshotWrite: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UInt8>?, Int) -> Void = {
    context, bytes, length in
    guard let context, let bytes else { return }
    Unmanaged<SnapshotSink>.fromOpaque(context).takeUnretainedValue().bytes += UnsafeBufferPointer(
        start: bytes, count: length)
}
