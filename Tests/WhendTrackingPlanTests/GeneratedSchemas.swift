import SeededRandom

/// A JSON value for the generated cases, written out as text (keys in order, some characters
/// as `\u` escapes, so that the validator's escaped paths are crossed too).
indirect enum GeneratedJSON {
    case object([(String, GeneratedJSON)])
    case array([GeneratedJSON])
    case string(String)
    /// As written: "3", "2.5", "1e1", "-0".
    case number(String)
    case bool(Bool)
    case null

    func text(_ random: inout SplitMix64) -> String {
        switch self {
        case .object(let members):
            return "{" + members.map { Self.quoted($0.0, &random) + ":" + $0.1.text(&random) }.joined(separator: ",")
                + "}"
        case .array(let items): return "[" + items.map { $0.text(&random) }.joined(separator: ",") + "]"
        case .string(let s): return Self.quoted(s, &random)
        case .number(let n): return n
        case .bool(let b): return b ? "true" : "false"
        case .null: return "null"
        }
    }

    static func quoted(_ s: String, _ random: inout SplitMix64) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\t": out += "\\t"
            case "\n": out += "\\n"
            default:
                // One character in eight of the plain letters as an escape.
                if scalar.isASCII, scalar.properties.isAlphabetic, random.int(8) == 0 {
                    out += "\\u00" + String(scalar.value, radix: 16)
                } else if scalar.value > 0xFFFF, random.int(2) == 0 {
                    // As a surrogate pair, which counts as one character.
                    let v = scalar.value - 0x10000
                    out +=
                        "\\u" + String(0xD800 + (v >> 10), radix: 16) + "\\u" + String(0xDC00 + (v & 0x3FF), radix: 16)
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}

/// Schemas over every keyword a plan may use, and instances near them (most built to fit the
/// schema, then some of them bent), drawn from one seed.
///
/// Patterns are the part of ECMA-262 (and of Python's `re`, which the reference validator
/// uses) that POSIX extended expressions read the same, over strings of characters of one to
/// four bytes, a newline among them. (Python's `.` takes \r, U+2028 and U+2029, and its `$`
/// matches before a last newline, where ECMA-262, which JSON Schema names and whend follows,
/// does not: those are left out.)
struct SchemaGenerator {
    var random: SplitMix64

    static let patterns: [(String, [String])] = [
        ("^[a-z]+$", ["abc", "Abc", "", "é"]),
        ("^[0-9]{2,3}$", ["12", "1234", "123", "1"]),
        ("b|c", ["abc", "xyz", "c"]),
        ("^(ab)*$", ["abab", "aba", ""]),
        ("^a.*z$", ["az", "a-éz", "za"]),
        ("x?y+z", ["yz", "xyyz", "xz"]),
        ("^[^0-9]*$", ["abc", "a1", "é"]),
        ("^$", ["", "a"]),
        ("\\.", ["a.b", "ab"]),
        ("[A-Z][a-z]+", ["Hello", "hello", "HE"]),
        ("^a.c$", ["abc", "a\nc", "aéc", "a😀c", "ac"]),
        ("^.{2}$", ["ab", "é😀", "a", "abc", "a\nb"]),
        ("^[^@]+@[^@]+$", ["é@ü", "a@@b", "x@y"]),
        ("^[a-zé]{2}$", ["éa", "ée", "ÿa", "e"]),
        ("^(.)+$", ["a\nb", "ab", "😀"]),
    ]
    static let keys = ["id", "name", "a b", "é", "count", "tags", "x"]
    static let words = [
        "", "a", "ab", "abc", "Hello", "12", "123", "é", "aé😀", "a.b", "x\"y", "b\\c", "tab\there", "a\nb",
    ]
    static let numbers = ["0", "3", "-2", "2.5", "3.0", "1e1", "-0", "7", "100", "0.5e1", "-7.25"]

    init(seed: UInt64) { random = SplitMix64(state: seed) }

    mutating func chance(_ n: Int) -> Bool { random.int(n) == 0 }
    mutating func pick<T>(_ list: [T]) -> T { list[random.int(list.count)] }

    mutating func scalar() -> GeneratedJSON {
        switch random.int(5) {
        case 0: return .string(pick(Self.words))
        case 1, 2: return .number(pick(Self.numbers))
        case 3: return .bool(chance(2))
        default: return .null
        }
    }

    mutating func schema(depth: Int = 0) -> GeneratedJSON {
        if depth > 0 && chance(12) { return .bool(!chance(3)) }
        var members: [(String, GeneratedJSON)] = []
        let kinds = ["string", "integer", "number", "boolean", "null", "object", "array"]
        let kind = depth >= 3 ? pick(["string", "integer", "number", "boolean"]) : pick(kinds + ["object", "object"])
        switch random.int(6) {
        case 0: break  // no type: the keywords apply to the values of their type only
        case 1: members.append(("type", .array([.string(kind), .string(pick(kinds))].uniqued)))
        default: members.append(("type", .string(kind)))
        }
        switch kind {
        case "string":
            if chance(2) { members.append(("minLength", .number(String(random.int(4))))) }
            if chance(2) { members.append(("maxLength", .number(String(1 + random.int(4))))) }
            if chance(2) { members.append(("pattern", .string(pick(Self.patterns).0))) }
        case "integer", "number":
            if chance(2) { members.append(("minimum", .number(pick(["0", "-2", "2.5", "3", "1e1"])))) }
            if chance(2) { members.append(("maximum", .number(pick(["3", "7", "2.5", "100", "-0.5"])))) }
        case "object":
            var properties: [(String, GeneratedJSON)] = []
            for key in Self.keys where chance(3) { properties.append((key, schema(depth: depth + 1))) }
            if !properties.isEmpty || chance(2) { members.append(("properties", .object(properties))) }
            let required = Self.keys.filter { _ in chance(4) }
            if !required.isEmpty { members.append(("required", .array(required.map { .string($0) }))) }
            switch random.int(4) {
            case 0: members.append(("additionalProperties", .bool(false)))
            case 1: members.append(("additionalProperties", schema(depth: depth + 1)))
            default: break
            }
        case "array":
            if chance(4) == false { members.append(("items", schema(depth: depth + 1))) }
        default: break
        }
        if chance(6) { members.append(("enum", .array((0...random.int(4)).map { _ in scalar() }))) }
        if chance(10) { members.append(("const", scalar())) }
        if chance(10) { members.append(("description", .string("annotation"))) }
        return .object(members)
    }

    /// An instance: one built to fit `schema` most of the time, anything otherwise.
    mutating func instance(for schema: GeneratedJSON, depth: Int = 0) -> GeneratedJSON {
        guard depth < 4, !chance(5), case .object(let members) = schema else { return any(depth: depth) }
        func member(_ key: String) -> GeneratedJSON? { members.first { $0.0 == key }?.1 }
        if let values = member("enum"), case .array(let list) = values, !list.isEmpty, chance(2) { return pick(list) }
        if let value = member("const"), chance(2) { return value }
        var type: String?
        switch member("type") {
        case .string(let t): type = t
        case .array(let ts): if case .string(let t) = pick(ts) { type = t }
        default: type = nil
        }
        switch type {
        case "string":
            if case .string(let p) = member("pattern"), let examples = Self.patterns.first(where: { $0.0 == p })?.1 {
                return .string(pick(examples))
            }
            return .string(pick(Self.words))
        case "integer": return .number(pick(["0", "3", "-2", "7", "3.0", "1e1", "100"]))
        case "number": return .number(pick(Self.numbers))
        case "boolean": return .bool(chance(2))
        case "null": return .null
        case "object":
            var out: [(String, GeneratedJSON)] = []
            let properties: [(String, GeneratedJSON)]
            if case .object(let p) = member("properties") { properties = p } else { properties = [] }
            var required: [String] = []
            if case .array(let r) = member("required") {
                required = r.compactMap { if case .string(let s) = $0 { s } else { nil } }
            }
            for key in Self.keys {
                let property = properties.first { $0.0 == key }?.1
                let wanted = required.contains(key) ? !chance(8) : property != nil ? chance(2) : chance(8)
                guard wanted else { continue }
                let sub = property ?? member("additionalProperties") ?? .object([])
                out.append((key, instance(for: sub, depth: depth + 1)))
            }
            return .object(out)
        case "array":
            let items = member("items") ?? .object([])
            return .array((0..<random.int(4)).map { _ in instance(for: items, depth: depth + 1) })
        default:
            return any(depth: depth)
        }
    }

    mutating func any(depth: Int) -> GeneratedJSON {
        switch depth < 3 ? random.int(7) : 0 {
        case 0...3: return scalar()
        case 4, 5:
            return .object(Self.keys.filter { _ in chance(3) }.map { ($0, any(depth: depth + 1)) })
        default:
            return .array((0..<random.int(3)).map { _ in any(depth: depth + 1) })
        }
    }
}

extension Array where Element == GeneratedJSON {
    /// Without a type named twice (a plan refuses that).
    var uniqued: [GeneratedJSON] {
        var seen: Set<String> = []
        return filter {
            guard case .string(let s) = $0 else { return true }
            return seen.insert(s).inserted
        }
    }
}
