import Foundation
import WhendConfiguration
import WhendPluginHost
import WhendSystem
import WhendWire

/// A pipeline's plugins' state saved together with the cursor it goes with: after a restart
/// the worker restores every stage and resumes from that cursor, so that what it derives is
/// what it would have derived without the restart.
///
/// On disk (`<pipeline>/snapshot`, the one before it in `snapshot.previous`): a magic line,
/// the cursor, each stage's plugin name, version and state, and a SipHash-128 of all that, so
/// that a file cut short or with a byte changed is never taken for a state.
package struct PipelineSnapshot: Equatable {
    package struct Stage: Equatable {
        package var plugin: String
        package var version: String
        package var state: [UInt8]
    }

    package var cursor: UInt64
    package var stages: [Stage]

    static let magic = Array("whend pipeline snapshot 1\n".utf8)

    package struct Unusable: Error, CustomStringConvertible {
        package var description: String
    }

    package func encoded() -> [UInt8] {
        var out = Self.magic
        Self.put(cursor, &out)
        Self.put(UInt64(stages.count), &out)
        for s in stages {
            Self.put(Array(s.plugin.utf8), &out)
            Self.put(Array(s.version.utf8), &out)
            Self.put(s.state, &out)
        }
        var hash = SipHash128()
        hash.write(out)
        let (a, b) = hash.finalize()
        Self.put(a, &out)
        Self.put(b, &out)
        return out
    }

    /// The snapshot in `bytes`, checked whole.
    package static func decode(_ bytes: [UInt8]) throws(Unusable) -> PipelineSnapshot {
        guard bytes.count >= magic.count + 16 + 16, Array(bytes[0..<magic.count]) == magic else {
            throw Unusable(description: "not a pipeline snapshot (or cut before its end)")
        }
        let body = bytes[0..<(bytes.count - 16)]
        var hash = SipHash128()
        hash.write(Array(body))
        let (a, b) = hash.finalize()
        var tail = bytes.count - 16
        guard take(bytes, &tail) == a, take(bytes, &tail) == b else {
            throw Unusable(description: "its checksum does not match: it was cut short or changed")
        }
        var i = magic.count
        let end = bytes.count - 16
        func integer() throws(Unusable) -> UInt64 {
            guard end - i >= 8 else { throw Unusable(description: "it ends early") }
            return take(bytes, &i)
        }
        func run() throws(Unusable) -> [UInt8] {
            let n = try integer()
            guard n <= UInt64(end - i) else { throw Unusable(description: "it ends early") }
            defer { i += Int(n) }
            return Array(bytes[i..<(i + Int(n))])
        }
        let cursor = try integer()
        let count = try integer()
        guard count <= 1024 else { throw Unusable(description: "it claims \(count) stages") }
        var stages: [Stage] = []
        for _ in 0..<count {
            let plugin = String(decoding: try run(), as: UTF8.self)
            let version = String(decoding: try run(), as: UTF8.self)
            stages.append(Stage(plugin: plugin, version: version, state: try run()))
        }
        guard i == end else { throw Unusable(description: "it has bytes after its last stage") }
        return PipelineSnapshot(cursor: cursor, stages: stages)
    }

    private static func put(_ value: UInt64, _ out: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { out.append(contentsOf: $0) }
    }

    private static func put(_ run: [UInt8], _ out: inout [UInt8]) {
        put(UInt64(run.count), &out)
        out += run
    }

    private static func take(_ bytes: [UInt8], _ at: inout Int) -> UInt64 {
        var v: UInt64 = 0
        for k in 0..<8 { v |= UInt64(bytes[at + k]) << (8 * UInt64(k)) }
        at += 8
        return v
    }

    /// Saves `self` as the newest snapshot; the one it replaces becomes the previous. Between
    /// the two (`midway`), a worker that dies leaves only the previous one, and resumes from it.
    func save(to path: String, midway: () -> Void = {}) throws(DurableFileError) {
        if FileManager.default.fileExists(atPath: path) {
            guard rename(path, path + ".previous") == 0 else {
                throw DurableFileError(operation: "rename \(path) to", path: path + ".previous", code: errno)
            }
        }
        midway()
        try DurableFile.replace(path, with: encoded())
    }

    /// The cursor a snapshot file says it goes with, from its first bytes alone (unchecked):
    /// for retention, which must keep the records after it.
    package static func cursor(at path: String) -> UInt64? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let head = try? handle.read(upToCount: magic.count + 8), head.count == magic.count + 8,
            Array(head.prefix(magic.count)) == magic
        else { return nil }
        var at = magic.count
        return take(Array(head), &at)
    }
}
