import WhendWire

/// A JSON value of a plan file, with where it begins, so that a plan refused for what a value
/// says is refused with that value's line.
///
/// Built once per plan (at load and reload), never on the event path.
struct PlanDocument {
    indirect enum Value {
        case object([(key: String, value: PlanDocument)])
        case array([PlanDocument])
        case string(String)
        /// The number's text as written: `enum`, `const` and the bounds need its exact value.
        case number(String)
        case bool(Bool)
        case null
    }

    var value: Value
    /// The byte offset of the value's first byte in the file.
    var offset: Int

    /// Parses a whole file; a syntax error names its byte offset.
    static func parse(_ bytes: [UInt8]) throws(PlanError) -> PlanDocument {
        try bytes.withUnsafeBufferPointer { buffer throws(PlanError) in
            var scanner = JSONScanner(buffer)
            do throws(WireError) {
                let document = try read(&scanner)
                scanner.skipWhitespace()
                guard scanner.atEnd else { throw scanner.syntaxError("unexpected data after the plan") }
                return document
            } catch {
                throw PlanError(offset: scanner.position, reason: error.message)
            }
        }
    }

    private static func read(_ s: inout JSONScanner, depth: Int = 0) throws(WireError) -> PlanDocument {
        s.skipWhitespace()
        let start = s.position
        guard depth < 64 else {
            throw WireError(.invalidJSON, "the plan nests deeper than 64 levels")
        }
        switch s.peek() {
        case UInt8(ascii: "{"):
            var members: [(key: String, value: PlanDocument)] = []
            s.position += 1
            s.skipWhitespace()
            if s.peek() == UInt8(ascii: "}") {
                s.position += 1
                return PlanDocument(value: .object(members), offset: start)
            }
            // Compared by their bytes, as whend compares names: two spellings Unicode deems
            // equivalent are two keys.
            var seen = Set<[UInt8]>()
            while true {
                s.skipWhitespace()
                let keyStart = s.position
                let (range, escaped) = try s.scanString()
                let key = try string(&s, range, escaped, at: keyStart)
                guard seen.insert(Array(key.utf8)).inserted else {
                    s.position = keyStart
                    throw WireError(
                        .invalidJSON,
                        "\"\(key)\" is a key twice in one object; JSON readers differ on which one counts, so a plan says each once"
                    )
                }
                try s.expect(UInt8(ascii: ":"), "':' after a key")
                members.append((key, try read(&s, depth: depth + 1)))
                s.skipWhitespace()
                guard let b = s.peek() else { throw s.syntaxError("the file ends inside an object") }
                s.position += 1
                if b == UInt8(ascii: "}") { break }
                guard b == UInt8(ascii: ",") else {
                    s.position -= 1
                    throw s.syntaxError("expected ',' or '}'")
                }
            }
            return PlanDocument(value: .object(members), offset: start)
        case UInt8(ascii: "["):
            var elements: [PlanDocument] = []
            s.position += 1
            s.skipWhitespace()
            if s.peek() == UInt8(ascii: "]") {
                s.position += 1
                return PlanDocument(value: .array(elements), offset: start)
            }
            while true {
                elements.append(try read(&s, depth: depth + 1))
                s.skipWhitespace()
                guard let b = s.peek() else { throw s.syntaxError("the file ends inside an array") }
                s.position += 1
                if b == UInt8(ascii: "]") { break }
                guard b == UInt8(ascii: ",") else {
                    s.position -= 1
                    throw s.syntaxError("expected ',' or ']'")
                }
            }
            return PlanDocument(value: .array(elements), offset: start)
        default:
            let (kind, range) = try s.scanValue()
            let text = UnsafeBufferPointer(rebasing: s.bytes[range])
            switch kind {
            case .string:
                let contents = (range.lowerBound + 1)..<(range.upperBound - 1)
                return PlanDocument(
                    value: .string(try string(&s, contents, s.lastValueHadEscapes, at: start)), offset: start)
            case .number: return PlanDocument(value: .number(String(decoding: text, as: UTF8.self)), offset: start)
            case .bool: return PlanDocument(value: .bool(text.first == UInt8(ascii: "t")), offset: start)
            default: return PlanDocument(value: .null, offset: start)
            }
        }
    }

    /// A string of the plan, decoded. Bytes that are not UTF-8, and a `\u` escape of half a
    /// surrogate pair, are refused where they are: they are no character, so a plan naming
    /// them would otherwise stand for U+FFFD, which an event may send as itself.
    private static func string(
        _ s: inout JSONScanner, _ range: Range<Int>, _ escaped: Bool, at start: Int
    ) throws(WireError) -> String {
        let raw = UnsafeBufferPointer(rebasing: s.bytes[range])
        let bytes = escaped ? decodeJSONString(raw, keepingLoneSurrogates: true) : Array(raw)
        guard let text = String(validating: bytes, as: UTF8.self) else {
            s.position = start
            throw WireError(
                .invalidJSON,
                "a string that is not UTF-8, or holds half a surrogate pair (a \\uD800–\\uDFFF escape without its other half); write the character itself"
            )
        }
        return text
    }

    /// What the value is, for messages: "an object", "the string \"x\"".
    var described: String {
        switch value {
        case .object: "an object"
        case .array: "an array"
        case .string(let s): "the string \"\(s)\""
        case .number(let n): "the number \(n)"
        case .bool(let b): b ? "true" : "false"
        case .null: "null"
        }
    }
}

/// Why a plan file was refused, and where: `line` (from 1) and the reason a person can act on.
public struct PlanError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The byte offset in the file, before the line is known.
    var offset: Int
    public var reason: String
    /// Set once the file's text is at hand (`TrackingPlan.parse`).
    public internal(set) var line = 0

    init(offset: Int, reason: String) {
        self.offset = offset
        self.reason = reason
    }

    public var description: String { "line \(line): \(reason)" }

    /// The error with its line, counted in `bytes`.
    func located(in bytes: [UInt8]) -> PlanError {
        var located = self
        located.line = 1 + bytes.prefix(min(offset, bytes.count)).reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
        return located
    }
}
