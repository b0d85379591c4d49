/// The JSON types a schema's `type` names, as bits: a node checks an instance's type with one
/// AND.
struct TypeSet: OptionSet, Sendable {
    let rawValue: UInt8
    static let null = TypeSet(rawValue: 1)
    static let boolean = TypeSet(rawValue: 2)
    static let object = TypeSet(rawValue: 4)
    static let array = TypeSet(rawValue: 8)
    static let number = TypeSet(rawValue: 16)
    static let string = TypeSet(rawValue: 32)
    /// A number without a fractional part, 1.0 included (JSON Schema 2020-12).
    static let integer = TypeSet(rawValue: 64)

    static let names: [(String, TypeSet)] = [
        ("null", .null), ("boolean", .boolean), ("object", .object), ("array", .array), ("number", .number),
        ("string", .string), ("integer", .integer),
    ]

    var described: String {
        Self.names.filter { contains($0.1) }.map(\.0).joined(separator: " or ")
    }
}

/// A value `enum` or `const` may hold: whend compares scalars only (documented), so that
/// comparing one costs no allocation.
enum Scalar: Sendable, Equatable {
    case null
    case bool(Bool)
    /// Numbers compare by value, as JSON Schema says: 1 and 1.0 are equal.
    case number(Double)
    /// The decoded UTF-8 bytes.
    case string([UInt8])

    var described: String {
        switch self {
        case .null: "null"
        case .bool(let b): b ? "true" : "false"
        case .number(let n): n == n.rounded() && abs(n) < 1e15 ? String(Int(n)) : String(n)
        case .string(let s): "\"\(String(decoding: s, as: UTF8.self))\""
        }
    }
}

/// A name an object schema knows: a property with its schema, a required key, or both.
struct SchemaKey: Sendable {
    var name: [UInt8]
    /// Its schema under `properties`, if it has one.
    var schema: Int?
    /// Its place among the required names, if it is required.
    var required: Int?
}

/// One compiled schema: what its keywords ask, ready to be checked without a lookup by name.
/// Children are indices into the plan's node table.
struct SchemaNode: Sendable {
    /// The schema `false`: nothing is valid.
    var never = false
    /// Nil: any type.
    var types: TypeSet?
    var keys: [SchemaKey] = []
    var requiredCount = 0
    /// `additionalProperties`: nil allows any other key.
    var additional: Int?
    /// `enum`: the values allowed.
    var allowed: [Scalar]?
    /// `const`: the one value allowed (both may be there, and both then apply).
    var constant: Scalar?
    var pattern: Pattern?
    var minimum: Double?
    var maximum: Double?
    var minLength: Int?
    var maxLength: Int?
    var items: Int?

    /// Whether an object's members must be looked at one by one.
    var readsMembers: Bool { !keys.isEmpty || additional != nil }
}

/// Turns the schemas of a plan file into nodes, refusing what whend does not implement rather
/// than ignoring it: a keyword left out would let through what its author meant to refuse.
struct SchemaCompiler {
    private(set) var nodes: [SchemaNode] = []
    /// The positions every pattern of the plan compiled so far expands to (`Pattern`).
    private(set) var patternPositions = 0
    /// And the steps of their automatons (`PatternAutomaton.maxSteps` each at most).
    private(set) var patternSteps = 0
    /// The steps of the largest automaton: what a search may cost per character.
    private(set) var largestPatternSteps = 0

    /// What one plan may hold, whoever wrote it: each compiled pattern costs memory in
    /// proportion to its positions (about 100 bytes each); an enum is searched, and an object's
    /// properties are compiled, in time that grows with their count.
    static let maxPatternPositions = 100_000
    static let maxPatternSteps = 400_000
    static let maxEnum = 4096
    static let maxProperties = 4096

    /// Compiles a pattern, within the plan's budget of positions.
    mutating func pattern(_ source: String) throws(PatternError) -> Pattern {
        patternPositions += min(Pattern.expandedSize(of: source), Self.maxPatternPositions + 1)
        guard patternPositions <= Self.maxPatternPositions else {
            throw PatternError(
                reason:
                    "the plan's patterns expand to more than \(Self.maxPatternPositions) positions in all, which would cost whend hundreds of megabytes; list exact names, or use fewer and shorter patterns"
            )
        }
        let compiled = try Pattern(source)
        patternSteps += compiled.size
        largestPatternSteps = max(largestPatternSteps, compiled.size)
        guard patternSteps <= Self.maxPatternSteps else {
            throw PatternError(
                reason:
                    "the plan's patterns have more than \(Self.maxPatternSteps) automaton steps in all (alternatives, repetitions and optional parts count too); list exact names, or use fewer and simpler patterns"
            )
        }
        return compiled
    }

    /// Keywords that describe and never refuse: read and left aside.
    static let annotations: Set<String> = [
        "title", "description", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly",
    ]
    static let keywords: [String] = [
        "type", "properties", "required", "additionalProperties", "enum", "const", "pattern", "minimum", "maximum",
        "minLength", "maxLength", "items",
    ]

    /// Compiles one schema; returns its node's index.
    mutating func compile(_ document: PlanDocument) throws(PlanError) -> Int {
        let index = nodes.count
        nodes.append(SchemaNode())
        var node = SchemaNode()
        switch document.value {
        case .bool(let b):
            node.never = !b
            nodes[index] = node
            return index
        case .object(let members):
            // A key twice is refused as the file is read (`PlanDocument`).
            for (key, value) in members { try apply(key, value, to: &node) }
        default:
            throw PlanError(
                offset: document.offset, reason: "a schema is an object or true or false, not \(document.described)")
        }
        nodes[index] = node
        return index
    }

    private mutating func apply(_ key: String, _ value: PlanDocument, to node: inout SchemaNode) throws(PlanError) {
        func fail(_ reason: String) -> PlanError { PlanError(offset: value.offset, reason: "\(key): \(reason)") }
        switch key {
        case "type":
            node.types = try typeSet(value, fail)
        case "properties":
            guard case .object(let members) = value.value else { throw fail("must be an object of schemas") }
            guard members.count <= Self.maxProperties else {
                throw fail("names \(members.count) properties, over \(Self.maxProperties)")
            }
            for (name, schema) in members {
                let child = try compile(schema)
                let bytes = Array(name.utf8)
                if let at = node.keys.firstIndex(where: { $0.name == bytes }) {
                    node.keys[at].schema = child
                } else {
                    node.keys.append(SchemaKey(name: bytes, schema: child))
                }
            }
        case "required":
            guard case .array(let names) = value.value else { throw fail("must be an array of strings") }
            for name in names {
                guard case .string(let s) = name.value else { throw fail("must be an array of strings") }
                let bytes = Array(s.utf8)
                if let at = node.keys.firstIndex(where: { $0.name == bytes }) {
                    guard node.keys[at].required == nil else { throw fail("names \"\(s)\" twice") }
                    node.keys[at].required = node.requiredCount
                } else {
                    node.keys.append(SchemaKey(name: bytes, required: node.requiredCount))
                }
                node.requiredCount += 1
            }
            // The check keeps one bit per required name.
            guard node.requiredCount <= 64 else { throw fail("names more than 64 keys; split the object") }
        case "additionalProperties":
            node.additional = try compile(value)
        case "items":
            guard case .array = value.value else {
                node.items = try compile(value)
                return
            }
            throw fail("is one schema for every item (2020-12); tuples (prefixItems) are not supported")
        case "enum":
            guard case .array(let values) = value.value else { throw fail("must be an array") }
            guard values.count <= Self.maxEnum else {
                throw fail(
                    "lists \(values.count) values, over \(Self.maxEnum): each is compared in turn; use a pattern")
            }
            node.allowed = try values.map { v throws(PlanError) in try scalar(v, fail) }
        case "const":
            node.constant = try scalar(value, fail)
        case "pattern":
            guard case .string(let source) = value.value else { throw fail("must be a string") }
            do {
                node.pattern = try pattern(source)
            } catch {
                throw fail(error.reason)
            }
        case "minimum", "maximum":
            guard case .number(let text) = value.value, let n = Double(text) else { throw fail("must be a number") }
            // 1e400 reads as infinity, and is beyond the bound too.
            guard abs(n) < Self.exactLimit else { throw fail(Self.beyondExact(text)) }
            if key == "minimum" { node.minimum = n } else { node.maximum = n }
        case "minLength", "maxLength":
            // An integer is any number with no fraction, as JSON Schema counts them: 1.0 and 1e1 too.
            guard case .number(let text) = value.value, let d = Double(text), d >= 0, d == d.rounded(), d.isFinite
            else {
                throw fail("must be an integer, 0 or more, that a double holds (1e400 is none)")
            }
            // No string is 2^53 characters long: a larger bound means what 2^53 means.
            let n = Int(min(d, Self.exactLimit))
            if key == "minLength" { node.minLength = n } else { node.maxLength = n }
        default:
            guard Self.annotations.contains(key) else {
                throw PlanError(
                    offset: value.offset,
                    reason:
                        "\"\(key)\" is not a keyword whend checks; it checks \(Self.keywords.joined(separator: ", ")) (docs/tracking-plan.md)"
                )
            }
            // Of the type the plan's own JSON Schema gives it, so that what whend takes that schema takes.
            switch (key, value.value) {
            case ("title", .string), ("description", .string), ("$comment", .string), ("examples", .array),
                ("deprecated", .bool), ("readOnly", .bool), ("writeOnly", .bool), ("default", _):
                break
            case ("examples", _): throw fail("must be an array")
            case ("deprecated", _), ("readOnly", _), ("writeOnly", _): throw fail("must be true or false")
            default: throw fail("must be a string")
            }
        }
    }

    private func typeSet(_ value: PlanDocument, _ fail: (String) -> PlanError) throws(PlanError) -> TypeSet {
        func one(_ v: PlanDocument) throws(PlanError) -> TypeSet {
            guard case .string(let name) = v.value, let t = TypeSet.names.first(where: { $0.0 == name })?.1 else {
                throw fail(
                    "\(v.described) is not a type; the types are \(TypeSet.names.map(\.0).joined(separator: ", "))")
            }
            return t
        }
        guard case .array(let names) = value.value else { return try one(value) }
        guard !names.isEmpty else { throw fail("an empty list of types allows nothing; name at least one") }
        var set: TypeSet = []
        for name in names {
            let t = try one(name)
            guard !set.contains(t) else { throw fail("names a type twice") }
            set.insert(t)
        }
        return set
    }

    /// 2^53: below it every integer is a double, so that comparing an event's number with the
    /// plan's as doubles says what comparing them exactly says (a validator compares integers
    /// exactly: 9007199254740993 is more than 9007199254740992, which as doubles it is not).
    static let exactLimit: Double = 9_007_199_254_740_992

    static func beyondExact(_ text: String) -> String {
        "\(text.prefix(40)) is not strictly within ±2^53 (9007199254740992; 2^53 + 1 reads as 2^53 itself, so whend cannot compare numbers exactly from there on); use a bound of magnitude below it"
    }

    private func scalar(_ value: PlanDocument, _ fail: (String) -> PlanError) throws(PlanError) -> Scalar {
        switch value.value {
        case .null: return .null
        case .bool(let b): return .bool(b)
        case .string(let s): return .string(Array(s.utf8))
        case .number(let text):
            guard let n = Double(text), n.isFinite else { throw fail("\(text) is not a number whend can compare") }
            guard abs(n) < Self.exactLimit else { throw fail(Self.beyondExact(text)) }
            return .number(n)
        case .object, .array:
            throw fail("whend compares strings, numbers, booleans and null; \(value.described) is not one")
        }
    }
}
