import Foundation
import Testing
import WhendWire

/// A JSON value as a model: objects keep their members in order, keys as UTF-16 code units
/// (what they decode to) beside the spelling they were written with.
indirect enum JSONModel {
    case scalar(String)
    case object([(key: [UInt16], spelling: String, value: JSONModel)])
    case array([JSONModel])

    /// Written as an app might: each key in its own spelling, no whitespace.
    var text: String {
        switch self {
        case .scalar(let s): return s
        case .object(let members):
            return "{" + members.map { "\"\($0.spelling)\":\($0.value.text)" }.joined(separator: ",") + "}"
        case .array(let elements): return "[" + elements.map(\.text).joined(separator: ",") + "]"
        }
    }

    /// What a reader that takes the first of a repeated key sees, at every depth; with
    /// `replacing`, a reader that reads a surrogate without its partner as U+FFFD.
    func firstOfEach(replacing: Bool) -> JSONModel {
        switch self {
        case .scalar: return self
        case .object(let members):
            var given: [[UInt16]] = []
            var kept: [(key: [UInt16], spelling: String, value: JSONModel)] = []
            for m in members where !given.contains(Self.identity(m.key, replacing)) {
                given.append(Self.identity(m.key, replacing))
                kept.append((m.key, m.spelling, m.value.firstOfEach(replacing: replacing)))
            }
            return .object(kept)
        case .array(let elements): return .array(elements.map { $0.firstOfEach(replacing: replacing) })
        }
    }

    func hasRepeatedKey(replacing: Bool) -> Bool {
        switch self {
        case .scalar: return false
        case .object(let members):
            return Set(members.map { Self.identity($0.key, replacing) }).count < members.count
                || members.contains { $0.value.hasRepeatedKey(replacing: replacing) }
        case .array(let elements): return elements.contains { $0.hasRepeatedKey(replacing: replacing) }
        }
    }

    /// A key's code units, with `replacing` each surrogate that has no partner as U+FFFD.
    static func identity(_ units: [UInt16], _ replacing: Bool) -> [UInt16] {
        guard replacing else { return units }
        var out: [UInt16] = []
        var i = 0
        while i < units.count {
            let u = units[i]
            if (0xD800...0xDBFF).contains(u), i + 1 < units.count, (0xDC00...0xDFFF).contains(units[i + 1]) {
                out += [u, units[i + 1]]
                i += 2
                continue
            }
            out.append((0xD800...0xDFFF).contains(u) ? 0xFFFD : u)
            i += 1
        }
        return out
    }

    /// A value up to `depth` levels deep, keys from a few (so that they repeat), each written in
    /// any of its spellings.
    /// `plain`: every key written as its characters, no escape (the common case, which a quick
    /// pass decides).
    static func generated(_ g: inout GeneratedID, keys: [[UInt16]], plain: Bool, depth: Int) -> JSONModel {
        switch depth == 0 ? 0 : g.pick(4) {
        case 0, 1:
            let scalars = [#"1"#, #"-2.5e3"#, #"true"#, #"null"#, #""x""#, #""\u00e9\n""#, #""""#]
            return .scalar(scalars[g.pick(scalars.count)])
        case 2:
            return .object(
                (0..<g.pick(7)).map { _ in
                    let key = keys[g.pick(keys.count)]
                    let spelling = plain ? String(decoding: key, as: UTF16.self) : g.spelling(of: key)
                    return (key, spelling, generated(&g, keys: keys, plain: plain, depth: depth - 1))
                })
        default:
            return .array((0..<g.pick(4)).map { _ in generated(&g, keys: keys, plain: plain, depth: depth - 1) })
        }
    }
}

@Suite struct RepeatedKeysTests {
    /// For any value, keys spelled any way JSON allows (escapes, lone surrogates, pairs): a
    /// repeated key is found exactly where a reader that decodes keys finds one, and what is
    /// written keeps the first member of each key at every depth, everything else as it came.
    @Test(arguments: 0..<600 as Range<UInt64>)
    func theFirstOfEachKeyIsKeptAtEveryDepth(seed: UInt64) throws {
        var g = GeneratedID(seed: seed)
        // Half the seeds: keys of plain characters only, at any depth up to past the quick
        // pass's, in objects up to past its number of keys; the others' keys include lone
        // surrogates and U+FFFD, one key to a reader that replaces them and three to one that
        // does not.
        let plain = seed % 2 == 0
        let keys =
            plain
            ? ["a", "b", "x", "é", "日本"].map { Array($0.utf16) }
            : (0..<(1 + g.pick(4))).map { _ in g.value() } + [[0x78], [0xD800], [0xDC00], [0xFFFD]]
        let model = JSONModel.generated(&g, keys: keys, plain: plain, depth: plain ? 10 : 4)
        let text = model.text
        // A third of the seeds: lone surrogates read as U+FFFD, as analytics writes them.
        let replacing = seed % 3 == 1
        var repeated = RepeatedKeys(loneSurrogatesAsReplacement: replacing)
        let found = Array(text.utf8).withUnsafeBufferPointer { repeated.present(in: $0) }
        #expect(found == model.hasRepeatedKey(replacing: replacing), "\(text)")
        var out: [UInt8] = []
        Array(text.utf8).withUnsafeBufferPointer { repeated.appendFirstOfEach($0, to: &out) }
        #expect(String(decoding: out, as: UTF8.self) == model.firstOfEach(replacing: replacing).text, "\(text)")
        #expect(!out.withUnsafeBufferPointer { repeated.present(in: $0) }, "\(text)")
    }

    /// Over its linear limit an object's keys are compared through a set: the same answer, for
    /// an object of many keys, repeated far apart and in another spelling.
    @Test func manyKeysAreComparedThroughASet() throws {
        let members = (0..<200).map { #""k\#($0)":\#($0)"# } + [#""\u006b7":"again""#, #""k199":0"#]
        let text = "{" + members.joined(separator: ",") + "}"
        var repeated = RepeatedKeys()
        #expect(Array(text.utf8).withUnsafeBufferPointer { repeated.present(in: $0) })
        var out: [UInt8] = []
        Array(text.utf8).withUnsafeBufferPointer { repeated.appendFirstOfEach($0, to: &out) }
        let object = try #require(try JSONSerialization.jsonObject(with: Data(out)) as? [String: Int])
        #expect(object.count == 200 && object["k7"] == 7 && object["k199"] == 199)
    }
}
