import CWhendPlugin
import Foundation

/// What the ingest middleware made of one event.
enum IngestOutcome {
    /// Passed on as it came.
    case unchanged
    /// Passed on changed: the last plugin's output, one JSON object.
    case changed([UInt8])
    /// A plugin did not call next: not stored, and acknowledged like a stored event.
    case dropped
    /// Refused: the client gets `rejected` with this message, which names the plugin.
    case rejected(String)
}

/// The ingest middleware, in order: trusted plugins that see each event in the daemon, after
/// validation and before the journal, in the seed's middleware shape.
final class IngestChain: Sendable {
    let plugins: [PluginInstance]

    init(_ plugins: [PluginInstance]) {
        self.plugins = plugins
    }

    var isEmpty: Bool { plugins.isEmpty }

    /// Runs `record` (a JSON object as it would be stored, without `_seq`) through the chain.
    func run(_ record: UnsafeBufferPointer<UInt8>) -> IngestOutcome {
        let call = ChainCall(chain: self, original: record)
        var r = whend_record(json: record.baseAddress, length: record.count, seq: 0)
        let rc = withExtendedLifetime(call) { call.invoke(0, &r) }
        if let rejection = call.rejection { return .rejected(rejection) }
        if rc != WHEND_OK { return .rejected("an ingest plugin failed") }
        guard call.reachedEnd else { return .dropped }
        return call.changed.map { .changed($0) } ?? .unchanged
    }
}

/// One record's way through the chain. A class, so that the plugins' nested `next` calls reach
/// the same state through a plain pointer without overlapping Swift accesses.
private final class ChainCall {
    let chain: IngestChain
    let original: UnsafeBufferPointer<UInt8>
    var index = 0
    var reachedEnd = false
    var changed: [UInt8]?
    /// The first refusal, from the plugin that refused: plugins before it only see that the
    /// rest of the chain refused.
    var rejection: String?

    init(chain: IngestChain, original: UnsafeBufferPointer<UInt8>) {
        self.chain = chain
        self.original = original
    }

    func invoke(_ index: Int, _ record: UnsafePointer<whend_record>) -> Int32 {
        let plugin = chain.plugins[index]
        self.index = index
        var message = [CChar](repeating: 0, count: 512)
        let capacity = message.count
        let context = Unmanaged.passUnretained(self).toOpaque()
        let rc = message.withUnsafeMutableBufferPointer { buffer in
            plugin.handle(record, next: ingestNext, context: context, message: buffer.baseAddress!, capacity: capacity)
        }
        self.index = index
        if rc != WHEND_OK && rejection == nil {
            let text = String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let verb = rc == WHEND_REJECT ? "rejected the event" : "failed"
            rejection = "ingest plugin \(plugin.name) \(verb)\(text.isEmpty ? "" : ": \(text)")"
        }
        return rc
    }
}

/// `next` as the plugins see it: the following plugin, or the end of the chain.
private let ingestNext: whend_next_fn = { context, json, length in
    guard let context else { return Int32(WHEND_FAIL) }
    let call = Unmanaged<ChainCall>.fromOpaque(context).takeUnretainedValue()
    let following = call.index + 1
    if following < call.chain.plugins.count {
        var record = whend_record(json: json, length: length, seq: 0)
        return call.invoke(following, &record)
    }
    call.reachedEnd = true
    if json == call.original.baseAddress && length == call.original.count {
        call.changed = nil
    } else if let json {
        call.changed = Array(UnsafeBufferPointer(start: json, count: length))
    } else {
        call.changed = []
    }
    return Int32(WHEND_OK)
}
