import CWhendPlugin
import Foundation
import WhendConfiguration
import WhendWire

/// What a chain of plugins made of one record.
package enum ChainOutcome {
    /// Passed on as it came.
    case unchanged
    /// Passed on changed: the last plugin's output, one JSON object, and that plugin's name.
    case changed([UInt8], by: String)
    /// A plugin did not call next: not stored, and acknowledged like a stored event.
    case dropped
    /// Refused: the client gets `rejected` with this message, which names the plugin.
    case rejected(String)
}

/// Plugins in order, in the seed's middleware shape: each gets the record and `next`. The
/// ingest middleware is one (in the daemon, before the journal); each pipeline is one (in its
/// worker, after the journal).
package final class PluginChain: Sendable {
    package let plugins: [PluginInstance]

    package init(_ plugins: [PluginInstance]) {
        self.plugins = plugins
    }

    package var isEmpty: Bool { plugins.isEmpty }

    /// Every stage makes durable what it holds for the records handled (see `whend_plugin.flush`).
    package func flush() throws(PluginLoadError) {
        for plugin in plugins { try plugin.flush() }
    }

    /// Runs `record` (a JSON object) through the chain; `seq` is its `_seq`, 0 before the journal.
    package func run(_ record: UnsafeBufferPointer<UInt8>, seq: UInt64 = 0) -> ChainOutcome {
        var call = ChainCall(chain: self, original: record, seq: seq)
        var r = whend_record(json: record.baseAddress, length: record.count, seq: seq)
        let rc = withUnsafeMutablePointer(to: &call) { ChainCall.invoke($0, 0, &r) }
        if let rejection = call.rejection { return .rejected(rejection) }
        if rc != WHEND_OK { return .rejected("a plugin failed") }
        guard call.reachedEnd else { return .dropped }
        return call.changed.map { .changed($0, by: plugins[call.changedBy].name) } ?? .unchanged
    }
}

/// One record's way through the chain, on the stack of `run`: the plugins' nested `next` calls
/// reach it through their context pointer. (It was an object: one allocation and a dozen
/// reference counts per record, a fifth of a replay through a plugin that does nothing.)
private struct ChainCall {
    /// `run` holds the chain for the whole call.
    unowned(unsafe) let chain: PluginChain
    let original: UnsafeBufferPointer<UInt8>
    let seq: UInt64
    var index = 0
    var reachedEnd = false
    var changed: [UInt8]?
    /// The plugin whose output `changed` is.
    var changedBy = 0
    /// A changed record handed from one plugin to the next, in the form it would be stored in.
    var between: [UInt8] = []
    /// The first refusal, from the plugin that refused: plugins before it only see that the
    /// rest of the chain refused.
    var rejection: String?

    static func invoke(_ call: UnsafeMutablePointer<ChainCall>, _ index: Int, _ record: UnsafePointer<whend_record>)
        -> Int32
    {
        let plugin = call.pointee.chain.plugins[index]
        call.pointee.index = index
        // On the stack: this runs for every record and every stage.
        let (rc, text) = withUnsafeTemporaryAllocation(of: CChar.self, capacity: 512) { buffer in
            buffer[0] = 0
            let rc = plugin.handle(
                record, next: ingestNext, context: UnsafeMutableRawPointer(call), message: buffer.baseAddress!,
                capacity: buffer.count)
            guard rc != WHEND_OK else { return (rc, "") }
            buffer[buffer.count - 1] = 0
            // Its reason may quote its configuration.
            return (rc, Secrets.scrub(String(cString: buffer.baseAddress!), plugin.secrets))
        }
        call.pointee.index = index
        if rc != WHEND_OK && call.pointee.rejection == nil {
            let verb = rc == WHEND_REJECT ? "rejected the event" : "failed"
            call.pointee.rejection = "plugin \(plugin.name) \(verb)\(text.isEmpty ? "" : ": \(text)")"
        }
        return rc
    }
}

/// `next` as the plugins see it: the following plugin, or the end of the chain.
private let ingestNext: whend_next_fn = { context, json, length in
    guard let context else { return Int32(WHEND_FAIL) }
    let call = context.assumingMemoryBound(to: ChainCall.self)
    let following = call.pointee.index + 1
    if following < call.pointee.chain.plugins.count {
        guard let json, json != call.pointee.original.baseAddress || length != call.pointee.original.count else {
            var record = whend_record(json: json, length: length, seq: call.pointee.seq)
            return ChainCall.invoke(call, following, &record)
        }
        // Changed: the next plugin sees it as it would be stored (one line, canonical, whend's
        // own `_` members), as every plugin sees records, or it goes no further.
        let output = UnsafeBufferPointer(start: json, count: length)
        do {
            let body = try IngestRewrite.body(output: output, original: call.pointee.original)
            call.pointee.between = [UInt8(ascii: "{")] + body
        } catch {
            let name = call.pointee.chain.plugins[call.pointee.index].name
            call.pointee.rejection = "plugin \(name) passed on something invalid: \(error)"
            return Int32(WHEND_REJECT)
        }
        let between = call.pointee.between
        return between.withUnsafeBufferPointer { b in
            var record = whend_record(json: b.baseAddress, length: b.count, seq: call.pointee.seq)
            return ChainCall.invoke(call, following, &record)
        }
    }
    call.pointee.reachedEnd = true
    call.pointee.changedBy = call.pointee.index
    if json == call.pointee.original.baseAddress && length == call.pointee.original.count {
        call.pointee.changed = nil
    } else if let json {
        call.pointee.changed = Array(UnsafeBufferPointer(start: json, count: length))
    } else {
        call.pointee.changed = []
    }
    return Int32(WHEND_OK)
}
