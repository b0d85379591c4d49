import Foundation
import WhendWire

/// The rule an instance broke: a schema keyword, or one of the plan's own (`event`, `screen`).
package enum PlanRule: String, Sendable, CaseIterable {
    case type, required, additionalProperties, `enum`, const, pattern, minimum, maximum, minLength, maxLength
    /// The schema `false` (also where `additionalProperties: false` refuses a key, reported as
    /// `additionalProperties`).
    case falseSchema = "false"
    /// A `When` name the plan does not list.
    case event
    /// A screen name the plan does not list.
    case screen
}

/// Where in the event an instance failed, from the event's root, built only once it failed.
enum PathStep {
    case key([UInt8])
    case index(Int)
}

/// A failure inside a schema, its path collected innermost first on the way out.
struct SchemaFailure {
    var rule: PlanRule
    var detail: String
    var reversedPath: [PathStep] = []

    /// Half a surrogate pair, kept as its three bytes (as whend compares names), written as
    /// the `\\uXXXX` it was sent as: as bytes it is no text, and printed as three U+FFFD.
    static func escapingSurrogates(_ bytes: [UInt8]) -> [UInt8] {
        guard bytes.contains(0xED) else { return bytes }
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            if bytes[i] == 0xED, i + 2 < bytes.count, (0xA0...0xBF).contains(bytes[i + 1]), bytes[i + 2] & 0xC0 == 0x80
            {
                let scalar = 0xD000 | UInt32(bytes[i + 1] & 0x3F) << 6 | UInt32(bytes[i + 2] & 0x3F)
                out += Array("\\u\(String(scalar, radix: 16))".utf8)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return out
    }

    /// `$.params.cart[2].price`; keys that are not plain names as `["a b"]`.
    func path(from root: [PathStep]) -> String {
        var out = "$"
        for step in root + reversedPath.reversed() {
            switch step {
            case .index(let i): out += "[\(i)]"
            case .key(let k):
                let plain =
                    !k.isEmpty
                    && k.allSatisfy {
                        ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x5F
                    }
                    && !(k[0] >= 0x30 && k[0] <= 0x39)
                let name = String(decoding: k, as: UTF8.self)
                if plain {
                    out += ".\(name)"
                } else {
                    var quoted: [UInt8] = []
                    appendJSONString(k, to: &quoted)
                    out += "[\(String(decoding: Self.escapingSurrogates(quoted), as: UTF8.self))]"
                }
            }
        }
        return out
    }
}

/// The compiled schemas of one plan, and the check of a JSON value against one of them, read
/// straight from the line's bytes: no tree is built, and a value that passes costs no
/// allocation (a key or a string with escapes, rare, is decoded to be compared).
final class SchemaTable: @unchecked Sendable {
    // Unchecked: written once here, only read after. Every connection's thread reads these
    // nodes; held as raw storage, visiting one borrows it where it lies instead of copying it
    // (and counting references to its arrays on a cache line all threads share).
    private let nodes: UnsafeMutableBufferPointer<SchemaNode>

    init(_ nodes: [SchemaNode]) {
        self.nodes = .allocate(capacity: nodes.count)
        _ = self.nodes.initialize(from: nodes)
    }

    deinit {
        _ = nodes.deinitialize()
        nodes.deallocate()
    }

    /// Checks the value at `range` of `bytes` (already valid JSON: the event scanner read it).
    func check(_ node: Int, _ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> SchemaFailure? {
        var scanner = JSONScanner(UnsafeBufferPointer(rebasing: bytes[..<range.upperBound]))
        scanner.position = range.lowerBound
        do {
            return try check(node, &scanner)
        } catch {
            // Not reached for a line the event scanner passed; a value whend cannot read
            // breaks the plan rather than slipping through it.
            return SchemaFailure(rule: .type, detail: "the value is not JSON whend can read: \(error.message)")
        }
    }

    private func check(_ index: Int, _ s: inout JSONScanner) throws(WireError) -> SchemaFailure? {
        let node = UnsafePointer(nodes.baseAddress! + index)
        s.skipWhitespace()
        guard !node.pointee.never else { return SchemaFailure(rule: .falseSchema, detail: "no value is allowed here") }
        guard let first = s.peek() else { throw s.syntaxError("a value was expected") }
        switch first {
        case UInt8(ascii: "{"):
            if let failure = typeFailure(node, .object) { return failure }
            if let failure = valueFailure(node, "an object", { _ in false }) { return failure }
            guard node.pointee.readsMembers || node.pointee.requiredCount > 0 else {
                _ = try s.scanValue()
                return nil
            }
            return try checkObject(node, &s)
        case UInt8(ascii: "["):
            if let failure = typeFailure(node, .array) { return failure }
            if let failure = valueFailure(node, "an array", { _ in false }) { return failure }
            guard let items = node.pointee.items else {
                _ = try s.scanValue()
                return nil
            }
            return try checkArray(items, &s)
        case UInt8(ascii: "\""):
            let (range, escaped) = try s.scanString()
            if let failure = typeFailure(node, .string) { return failure }
            return checkString(node, UnsafeBufferPointer(rebasing: s.bytes[range]), escaped: escaped)
        case UInt8(ascii: "t"), UInt8(ascii: "f"):
            _ = try s.scanValue()
            if let failure = typeFailure(node, .boolean) { return failure }
            let value = Scalar.bool(first == UInt8(ascii: "t"))
            return valueFailure(node, value.described) { $0 == value }
        case UInt8(ascii: "n"):
            _ = try s.scanValue()
            if let failure = typeFailure(node, .null) { return failure }
            return valueFailure(node, "null") { $0 == .null }
        default:
            let (_, range) = try s.scanValue()
            return checkNumber(node, UnsafeBufferPointer(rebasing: s.bytes[range]))
        }
    }

    @inline(__always)
    private func typeFailure(_ node: UnsafePointer<SchemaNode>, _ type: TypeSet) -> SchemaFailure? {
        guard let types = node.pointee.types, !types.contains(type) else { return nil }
        return SchemaFailure(rule: .type, detail: "\(Self.article(type)) is not allowed; expected \(types.described)")
    }

    private static func article(_ type: TypeSet) -> String {
        switch type {
        case .object, .array, .integer: "an \(type.described)"
        case .null: "null"
        case .boolean: "a boolean"
        default: "a \(type.described)"
        }
    }

    /// What `enum` and `const` say of a value, `equals` telling whether it is a given scalar.
    @inline(__always)
    private func valueFailure(
        _ node: UnsafePointer<SchemaNode>, _ shown: @autoclosure () -> String, _ equals: (Scalar) -> Bool
    ) -> SchemaFailure? {
        if let allowed = node.pointee.allowed, !allowed.contains(where: equals) {
            let list = allowed.prefix(10).map(\.described).joined(separator: ", ") + (allowed.count > 10 ? ", …" : "")
            return SchemaFailure(rule: .enum, detail: "\(shown()) is not one of \(list)")
        }
        if let constant = node.pointee.constant, !equals(constant) {
            return SchemaFailure(rule: .const, detail: "\(shown()) is not \(constant.described)")
        }
        return nil
    }

    private func checkObject(_ node: UnsafePointer<SchemaNode>, _ s: inout JSONScanner) throws(WireError)
        -> SchemaFailure?
    {
        // Which required names were seen, a bit each.
        var seen: UInt64 = 0
        s.position += 1
        s.skipWhitespace()
        if s.peek() == UInt8(ascii: "}") {
            s.position += 1
        } else {
            while true {
                s.skipWhitespace()
                let (keyRange, escaped) = try s.scanString()
                try s.expect(UInt8(ascii: ":"), "':'")
                let raw = UnsafeBufferPointer(rebasing: s.bytes[keyRange])
                let key = escaped ? nil : raw
                let decoded = escaped ? decodeJSONString(raw, keepingLoneSurrogates: true) : nil
                let entry =
                    decoded.map { d in node.pointee.keys.firstIndex { $0.name == d } }
                    ?? find(key!, in: node.pointee.keys)
                var schema = node.pointee.additional
                if let entry {
                    if let r = node.pointee.keys[entry].required { seen |= 1 << UInt64(r) }
                    schema = node.pointee.keys[entry].schema
                    if schema == nil && node.pointee.keys[entry].required != nil { schema = node.pointee.additional }
                }
                if let schema {
                    if var failure = try check(schema, &s) {
                        if entry == nil || node.pointee.keys[entry!].schema == nil, nodes[schema].never {
                            failure.rule = .additionalProperties
                            failure.detail = "the key is not allowed here (additionalProperties)"
                        }
                        failure.reversedPath.append(.key(decoded ?? Array(raw)))
                        return failure
                    }
                } else {
                    _ = try s.scanValue()
                }
                s.skipWhitespace()
                guard let b = s.peek() else { throw s.syntaxError("the value ends inside an object") }
                s.position += 1
                if b == UInt8(ascii: "}") { break }
            }
        }
        // At most 64 required names (SchemaCompiler): one bit each.
        guard node.pointee.requiredCount > 0 else { return nil }
        let all: UInt64 = node.pointee.requiredCount == 64 ? .max : (1 << UInt64(node.pointee.requiredCount)) - 1
        if seen == all { return nil }
        for key in node.pointee.keys {
            guard let r = key.required, seen & (1 << UInt64(r)) == 0 else { continue }
            return SchemaFailure(
                rule: .required, detail: "\"\(String(decoding: key.name, as: UTF8.self))\" is required")
        }
        return nil
    }

    @inline(__always)
    private func find(_ key: UnsafeBufferPointer<UInt8>, in keys: [SchemaKey]) -> Int? {
        for i in keys.indices {
            let found = keys[i].name.withUnsafeBufferPointer { JSONBytes.equal($0, key) }
            if found { return i }
        }
        return nil
    }

    private func checkArray(_ items: Int, _ s: inout JSONScanner) throws(WireError) -> SchemaFailure? {
        s.position += 1
        s.skipWhitespace()
        if s.peek() == UInt8(ascii: "]") {
            s.position += 1
            return nil
        }
        var index = 0
        while true {
            if var failure = try check(items, &s) {
                failure.reversedPath.append(.index(index))
                return failure
            }
            index += 1
            s.skipWhitespace()
            guard let b = s.peek() else { throw s.syntaxError("the value ends inside an array") }
            s.position += 1
            if b == UInt8(ascii: "]") { return nil }
        }
    }

    private func checkString(_ node: UnsafePointer<SchemaNode>, _ raw: UnsafeBufferPointer<UInt8>, escaped: Bool)
        -> SchemaFailure?
    {
        if node.pointee.minLength != nil || node.pointee.maxLength != nil {
            let length = Self.codePoints(raw, escaped: escaped)
            if let min = node.pointee.minLength, length < min {
                return SchemaFailure(rule: .minLength, detail: "\(length) characters; at least \(min) are required")
            }
            if let max = node.pointee.maxLength, length > max {
                return SchemaFailure(rule: .maxLength, detail: "\(length) characters; at most \(max) are allowed")
            }
        }
        guard node.pointee.pattern != nil || node.pointee.allowed != nil || node.pointee.constant != nil else {
            return nil
        }
        if !escaped { return checkDecodedString(node, raw) }
        let decoded = decodeJSONString(raw, keepingLoneSurrogates: true)
        return decoded.withUnsafeBufferPointer { checkDecodedString(node, $0) }
    }

    private func checkDecodedString(_ node: UnsafePointer<SchemaNode>, _ text: UnsafeBufferPointer<UInt8>)
        -> SchemaFailure?
    {
        if let pattern = node.pointee.pattern, !pattern.matches(text) {
            return SchemaFailure(rule: .pattern, detail: "does not match \"\(pattern.source)\"")
        }
        return valueFailure(node, "\"\(String(decoding: text.prefix(64), as: UTF8.self))\"") { v in
            if case .string(let s) = v { return s.withUnsafeBufferPointer { JSONBytes.equal($0, text) } }
            return false
        }
    }

    /// A string's length as JSON Schema counts it: in Unicode code points (a surrogate pair
    /// written as two `\u` escapes is one), counted on the raw bytes without decoding.
    static func codePoints(_ raw: UnsafeBufferPointer<UInt8>, escaped: Bool) -> Int {
        var count = 0
        var i = 0
        let n = raw.count
        if !escaped {
            for b in raw where b & 0xC0 != 0x80 { count += 1 }
            return count
        }
        func hex4(_ at: Int) -> UInt32 {
            var v: UInt32 = 0
            for k in 0..<4 {
                let c = raw[at + k]
                let d: UInt32 =
                    c <= 0x39 ? UInt32(c - 0x30) : c <= 0x46 ? UInt32(c - 0x41 + 10) : UInt32(c - 0x61 + 10)
                v = v << 4 | d
            }
            return v
        }
        while i < n {
            let b = raw[i]
            if b == UInt8(ascii: "\\") {
                if raw[i + 1] == UInt8(ascii: "u") {
                    let v = hex4(i + 2)
                    i += 6
                    if v >= 0xD800 && v < 0xDC00, i + 6 <= n, raw[i] == UInt8(ascii: "\\"),
                        raw[i + 1] == UInt8(ascii: "u")
                    {
                        let low = hex4(i + 2)
                        if low >= 0xDC00 && low < 0xE000 { i += 6 }
                    }
                } else {
                    i += 2
                }
                count += 1
            } else {
                if b & 0xC0 != 0x80 { count += 1 }
                i += 1
            }
        }
        return count
    }

    private func checkNumber(_ node: UnsafePointer<SchemaNode>, _ text: UnsafeBufferPointer<UInt8>) -> SchemaFailure? {
        let plainInteger = !text.contains { $0 == UInt8(ascii: ".") || $0 | 0x20 == UInt8(ascii: "e") }
        var parsed: Double?
        func value() -> Double {
            if let parsed { return parsed }
            let v = JSONValue(raw: text).double ?? .nan
            parsed = v
            return v
        }
        if let types = node.pointee.types, !types.contains(.number) {
            let integral =
                plainInteger
                || {
                    let v = value(); return v.isFinite && v.rounded(.towardZero) == v
                }()
            guard types.contains(.integer), integral else {
                return SchemaFailure(
                    rule: .type,
                    detail: "\(integral ? "an integer" : "a number") is not allowed; expected \(types.described)")
            }
        }
        if let min = node.pointee.minimum, !(value() >= min) {
            return SchemaFailure(
                rule: .minimum, detail: "\(Self.shown(text)) is less than \(Scalar.number(min).described)")
        }
        if let max = node.pointee.maximum, !(value() <= max) {
            return SchemaFailure(
                rule: .maximum, detail: "\(Self.shown(text)) is more than \(Scalar.number(max).described)")
        }
        guard node.pointee.allowed != nil || node.pointee.constant != nil else { return nil }
        let v = value()
        return valueFailure(node, Self.shown(text)) { $0 == .number(v) }
    }

    private static func shown(_ text: UnsafeBufferPointer<UInt8>) -> String {
        String(decoding: text.prefix(40), as: UTF8.self)
    }
}
