import Foundation
import WhendSystem
import WhendWire

/// Where crash-reports keeps its reports, and how they are named: shared by the plugin and by
/// `whenctl crashes`.
package enum CrashReportStore {
    package static func directory(pluginState: String) -> String { pluginState + "/reports" }

    /// The plugin's state directory under whend's: `<state>/plugins/crash-reports`.
    package static func directory(stateDirectory: String) -> String {
        directory(pluginState: stateDirectory + "/plugins/crash-reports")
    }

    /// The reports of every instance: crash-reports in more than one pipeline keeps each
    /// instance's in `<state>/plugins/crash-reports@<pipeline>` besides the first's. Sorted by
    /// file name, each name once (two instances that saw one record wrote one report of it);
    /// the first instance's copy is the one listed.
    package static func reports(stateDirectory: String) -> [(file: String, path: String)] {
        let plugins = stateDirectory + "/plugins"
        let others = ((try? FileManager.default.contentsOfDirectory(atPath: plugins)) ?? [])
            .filter { $0.hasPrefix("crash-reports@") }.sorted()
        var found: [String: String] = [:]
        for directory in [self.directory(stateDirectory: stateDirectory)]
            + others.map({ self.directory(pluginState: plugins + "/" + $0) })
        {
            for file in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
            where file.hasSuffix(".json") && found[file] == nil {
                found[file] = directory + "/" + file
            }
        }
        return found.sorted { $0.key < $1.key }.map { (file: $0.key, path: $0.value) }
    }

    package static func fileName(seq: UInt64, kind: String) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + "-" + kind + ".json"
    }
}

/// Written beside, synced and renamed (`DurableFile`): a reader, or whend after a power cut,
/// never sees half a file.
package func writeFileAtomically(_ bytes: [UInt8], to path: String) throws {
    try DurableFile.replace(path, with: bytes)
}

/// A session's records counted by type: the few types a session has (five in `make bench`'s
/// journeys), in a sorted array rather than a dictionary: one allocation of ~160 bytes where a
/// dictionary's header, bitmap and eight buckets took ~256, for every session indexed. Reads,
/// saves and exports as `[String: Int]` did, in the same order.
package struct TypeCounts: Codable, Equatable, Sendable, Sequence, ExpressibleByDictionaryLiteral {
    private struct Pair: Equatable, Sendable {
        var type: String
        var count: Int
    }

    /// By type, in the order of their bytes: each type once. Told apart by their bytes, as the
    /// journal stores them (Swift's `==` and `<` on strings take "é" and "e\u{301}" for one).
    private var pairs: [Pair] = []

    package init() {}

    package init(dictionaryLiteral elements: (String, Int)...) {
        for (type, count) in elements { self[type] = count }
    }

    package var count: Int { pairs.count }
    package var keys: [String] { pairs.map(\.type) }
    package var values: [Int] { pairs.map(\.count) }

    private func position(of type: String) -> (index: Int, found: Bool) {
        var low = 0
        var high = pairs.count
        while low < high {
            let middle = (low + high) / 2
            if pairs[middle].type.utf8.lexicographicallyPrecedes(type.utf8) { low = middle + 1 } else { high = middle }
        }
        return (low, low < pairs.count && pairs[low].type.utf8.elementsEqual(type.utf8))
    }

    package subscript(type: String) -> Int? {
        get {
            let (index, found) = position(of: type)
            return found ? pairs[index].count : nil
        }
        set {
            let (index, found) = position(of: type)
            switch (newValue, found) {
            case (let count?, true): pairs[index].count = count
            case (let count?, false): pairs.insert(Pair(type: type, count: count), at: index)
            case (nil, true): pairs.remove(at: index)
            case (nil, false): break
            }
        }
    }

    /// One more record of `type`.
    package mutating func add(_ type: String) {
        let (index, found) = position(of: type)
        if found { pairs[index].count += 1 } else { pairs.insert(Pair(type: type, count: 1), at: index) }
    }

    package func makeIterator() -> some IteratorProtocol<(key: String, value: Int)> {
        pairs.lazy.map { (key: $0.type, value: $0.count) }.makeIterator()
    }

    private struct TypeKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    package init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: TypeKey.self)
        for key in c.allKeys { self[key.stringValue] = try c.decode(Int.self, forKey: key) }
    }

    /// Each type a key of its own, where a dictionary of strings trapped on two types that
    /// differ in their bytes only ("é" and "e\u{301}"). Foundation's encoder and decoder keep an
    /// object's keys in such a dictionary: through them, one of the two is lost (docs/plugins.md).
    package func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: TypeKey.self)
        for pair in pairs { try c.encode(pair.count, forKey: TypeKey(stringValue: pair.type)) }
    }
}

/// Keeps a `SessionIndex` under its limit and exports it to `sessions.json` every `exportEvery`
/// records indexed (at least eight per session kept, so that an export's cost per record stays
/// the same however many sessions there are) and when closed. An export changes nothing of the
/// index: what the plugin keeps depends on the records alone, not on when it last exported or
/// restarted, and a reader completing any of its exports from the journal keeps the same.
package final class SessionIndexExport {
    /// Unchecked exclusivity: its plugin instance calls it on one thread at a time, for every
    /// record.
    @exclusivity(unchecked) private var kept: SessionIndex
    /// The index, its last session's newest time given to it; one set (a restored state) is
    /// kept under this limit.
    package var index: SessionIndex {
        get {
            kept.settle()
            return kept
        }
        set {
            kept = newValue
            kept.maxSessions = maxSessions
        }
    }
    @exclusivity(unchecked) private var sinceExport = 0
    private let exportEvery: Int
    private let maxSessions: Int

    package init(directory: String, exportEvery: Int = 1_000_000, maxSessions: Int = 100_000) throws {
        try DurableFile.createDirectory(directory)
        self.exportEvery = exportEvery
        self.maxSessions = max(1, maxSessions)
        kept = SessionIndex(directory: directory)
        kept.maxSessions = self.maxSessions
    }

    /// Indexes a record. `app`, `session`, `type` and `time` are JSON values as stored; true when the
    /// index is due for an export.
    package func record(
        seq: UInt64, session key: SessionDigest, app: JSONValue, session: JSONValue, type: JSONValue?, time: JSONValue?
    ) -> Bool {
        guard
            kept.apply(
                seq: seq, session: key, app: { app.string ?? "" }, sessionID: { session.string ?? "" }, type: type,
                time: time)
        else { return false }
        sinceExport += 1
        return sinceExport >= max(exportEvery, 8 * kept.count)
    }

    /// Writes `sessions.json` (synced, renamed into place), then drops a log an earlier
    /// version left, which the export now holds.
    package func export() throws {
        kept.settle()
        let index = kept
        try DurableFile.replace(kept.directory + "/sessions.json") { write throws(DurableFileError) in
            try index.writeSnapshotJSON(write)
        }
        sinceExport = 0
        let log = kept.directory + "/sessions.log"
        if FileManager.default.fileExists(atPath: log) { try? FileManager.default.removeItem(atPath: log) }
    }
}
