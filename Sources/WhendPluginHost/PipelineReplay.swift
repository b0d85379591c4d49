import Foundation
import Logging
import WhendConfiguration
import WhendRecord
import WhendWire

/// A pipeline run offline over records the caller reads from a journal: the same plugin
/// loading, host services and chain as a live pipeline's worker, but no cursor, no retries,
/// and the plugins' state in a directory of the caller's choosing, so that nothing live is
/// touched. Derived records come out stamped with the time of the record that caused them
/// (`_rt` of the cause), so the same input gives byte-identical output.
package final class PipelineReplay {
    private var chain: PluginChain
    private let derived: DerivedSink

    package enum Outcome: Equatable {
        case passed
        case dropped
        case failed(String)
    }

    /// - Parameters:
    ///   - stages: plugin names and their configuration (JSON), in order.
    ///   - output: receives each derived record, a complete journal-style JSON object.
    package init(
        stages: [(plugin: String, configuration: String)], pluginDirectories: [String], stateDirectory: String,
        logger: Logger, output: @escaping @Sendable (UnsafeBufferPointer<UInt8>) -> Void
    ) throws(PluginLoadError) {
        let sink = DerivedSink(output: output)
        derived = sink
        chain = try PipelineChainBuilder.build(
            stages.map { .init(plugin: $0.plugin, configuration: $0.configuration) }, directories: pluginDirectories,
            stateRoot: stateDirectory, logger: logger,
            services: .init(emit: { plugin, json in sink.emit(json, origin: plugin) })
        ).chain
    }

    /// The stages of pipeline `name` as `configuration` defines it.
    package static func stages(of name: String, in configuration: DaemonConfiguration) -> [(
        plugin: String, configuration: String
    )]? {
        configuration.effectivePipelines[name].map { plugins in
            plugins.map { ($0, configuration.pluginConfigurations[$0] ?? "{}") }
        }
    }

    /// Runs one stored record (with its `_seq` and `_rt`) through the chain.
    package func handle(_ record: UnsafeBufferPointer<UInt8>, seq: UInt64) -> Outcome {
        derived.begin(cause: seq, record: record)
        let outcome = chain.run(record, seq: seq)
        // As a live worker: what a record that failed derived is not stored.
        derived.end(keep: { if case .rejected = outcome { false } else { true } }())
        switch outcome {
        case .unchanged, .changed: return .passed
        case .dropped: return .dropped
        case .rejected(let why): return .failed(why)
        }
    }

    /// Has the plugins make durable what they hold, then closes them; throws with a plugin's
    /// reason if one cannot (it is closed all the same).
    package func finish() throws(PluginLoadError) {
        defer { chain = PluginChain([]) }
        try chain.flush()
    }

    /// The record's `_rt` value, as it is spelled. The trusted fields are at the end of a
    /// stored record, so the search runs backwards and allocates nothing.
    package static func receivedAt(_ record: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        let key: StaticString = #""_rt":""#
        let k = key.utf8Start
        let n = key.utf8CodeUnitCount
        var i = record.count - n
        while i >= 0 {
            if record[i] == k[0] && record[i + 4] == k[4] {
                var same = true
                for j in 1..<n where record[i + j] != k[j] {
                    same = false
                    break
                }
                if same {
                    let start = i + n
                    var end = start
                    while end < record.count, record[end] != UInt8(ascii: "\"") { end += 1 }
                    return Array(record[start..<end])
                }
            }
            i -= 1
        }
        return []
    }
}

/// Where a replay's derived records go: the live daemon's `appendDerived`, without a journal.
private final class DerivedSink: @unchecked Sendable {
    // Unchecked: a replay runs one record at a time on one thread. So are the runtime's
    // exclusivity checks on what every record touches: they were a sixth of a replay's time.
    package let output: @Sendable (UnsafeBufferPointer<UInt8>) -> Void
    @exclusivity(unchecked) package var cause: UInt64 = 0
    /// The record in hand, valid during `handle`: its `_rt` is found only if a plugin derives
    /// something from it.
    @exclusivity(unchecked) package var record = UnsafeBufferPointer<UInt8>(start: nil, count: 0)

    package init(output: @escaping @Sendable (UnsafeBufferPointer<UInt8>) -> Void) { self.output = output }

    package func begin(cause: UInt64, record: UnsafeBufferPointer<UInt8>) {
        self.cause = cause
        self.record = record
        receivedAt = nil
    }

    @exclusivity(unchecked) private var builder = DerivedRecordBuilder(pipeline: nil)
    /// The `_rt` of the record in hand, once a plugin derived something from it.
    @exclusivity(unchecked) private var receivedAt: [UInt8]?
    /// What the record in hand derived, each record's end in `ends`: it goes out only once the
    /// record is through the chain, and not if it failed.
    @exclusivity(unchecked) private var held: [UInt8] = []
    @exclusivity(unchecked) private var ends: [Int] = []

    package func end(keep: Bool) {
        if keep {
            var start = 0
            held.withUnsafeBufferPointer { all in
                for end in ends {
                    output(UnsafeBufferPointer(rebasing: all[start..<end]))
                    start = end
                }
            }
        }
        held.removeAll(keepingCapacity: held.count <= 1 << 20)
        ends.removeAll(keepingCapacity: true)
    }

    package func emit(_ json: UnsafeBufferPointer<UInt8>, origin: String) -> Bool {
        if receivedAt == nil { receivedAt = PipelineReplay.receivedAt(self.record) }
        // Built where it is held: on error `appendBody` leaves `held` as it was, but for the brace.
        let start = held.count
        held.append(UInt8(ascii: "{"))
        do {
            try builder.appendBody(json, origin: origin, cause: cause, receivedAt: receivedAt ?? [], to: &held)
        } catch {
            held.removeSubrange(start...)
            return false
        }
        ends.append(held.count)
        return true
    }
}
