/// A `pattern`, compiled once and searched for anywhere in a string's characters as JSON Schema
/// searches (unanchored: write `^…$` for the whole string), by whend's own automaton
/// (`PatternAutomaton`), in time linear in the string.
///
/// JSON Schema names ECMA-262 regular expressions; whend reads the part of them POSIX extended
/// expressions and Python's `re` read the same — literals, `.`, bracket expressions, `^`, `$`,
/// `|`, groups, `*`, `+`, `?`, `{m,n}` — and refuses the escapes and groups one would read
/// otherwise than another (`\d`, `\w`, `\s`, `\b` and their capitals, `(?…)` lookarounds), so
/// that a plan never means one thing to its author and another to whend. (It no longer asks
/// the C library's `regcomp` too: `^(((((a?)?)?)?)?){200}$` took it 28 s.) Matching is by characters (code points, as JSON Schema's validators
/// count them); `.` takes any character but a line terminator, as ECMA-262's does.
final class Pattern: Sendable {
    private let automaton: PatternAutomaton
    let source: String

    /// The most positions a pattern may have, its counted repetitions expanded: `x{m,n}` is written
    /// out as n copies of x, nested ones as the product, and a search costs the string's length
    /// times that (`PatternAutomaton.maxSteps` bounds what costs steps and no position). Real patterns (a UUID, an email, `[0-9]{1,255}`) stay far below.
    static let maxExpandedSize = 1000

    init(_ source: String) throws(PatternError) {
        if let unsupported = Self.unsupported(in: source) { throw PatternError(reason: unsupported) }
        let size = Self.expandedSize(of: source)
        guard size <= Self.maxExpandedSize else {
            throw PatternError(
                reason:
                    "it is \(size > 1_000_000 ? "over 1000000" : String(size)) positions long once its counted repetitions ({m,n}) are written out, over \(Self.maxExpandedSize) (each character or bracket is one, and a repetition copies its part; nested ones multiply): a search costs that much per character; use *, + or smaller bounds, maxLength for the length, and enum or screen names for long literal text"
            )
        }
        self.automaton = try PatternAutomaton(source)
        self.source = source
    }

    /// Whether the pattern occurs in `bytes` (UTF-8). Allocates nothing of its own: the
    /// search's lists are on the stack.
    func matches(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool { automaton.search(bytes).found }

    /// How many steps of its automaton a search of `bytes` takes: the cost bound's witness.
    func work(_ bytes: UnsafeBufferPointer<UInt8>) -> Int { automaton.search(bytes).work }

    /// The automaton's size: a search costs at most (characters + 1) × this, each way in.
    var size: Int { automaton.steps.count }

    /// Where the bracket expression opened at `start` ends (its ']', or the pattern's end): a
    /// ']' right after '[' or '[^' is a member.
    static func bracketEnd(_ bytes: [UInt8], _ start: Int) -> Int {
        var i = start + 1
        if i < bytes.count, bytes[i] == UInt8(ascii: "^") { i += 1 }
        if i < bytes.count, bytes[i] == UInt8(ascii: "]") { i += 1 }
        while i < bytes.count, bytes[i] != UInt8(ascii: "]") { i += 1 }
        return i
    }

    /// How many positions the pattern is once its counted repetitions are written out: each
    /// atom one, a group the sum of its contents, `x{m,n}` n times x (m + 1 times for `{m,}`).
    /// Capped, so that no nesting overflows.
    static func expandedSize(of source: String) -> Int {
        let cap = 1 << 40
        let bytes = Array(source.utf8)
        var stack: [Int] = [0]  // the size of each open group's contents so far
        var last = 0  // the size of the last atom, which a quantifier repeats
        var i = 0
        while i < bytes.count {
            let b = bytes[i]
            switch b {
            case UInt8(ascii: "\\"):
                i += 2
                last = 1
                stack[stack.count - 1] += 1
                continue
            case UInt8(ascii: "["):
                i = bracketEnd(bytes, i)
                last = 1
                stack[stack.count - 1] += 1
            case UInt8(ascii: "("):
                stack.append(0)
                last = 0
            case UInt8(ascii: ")"):
                let inner = stack.count > 1 ? stack.removeLast() : 0
                last = max(1, inner)
                stack[stack.count - 1] = min(cap, stack[stack.count - 1] + last)
            case UInt8(ascii: "{"):
                var j = i + 1
                var numbers: [Int] = [0]
                var sawComma = false
                while j < bytes.count, bytes[j] != UInt8(ascii: "}") {
                    if bytes[j] == UInt8(ascii: ",") {
                        sawComma = true
                        numbers.append(0)
                    } else if bytes[j] >= 0x30 && bytes[j] <= 0x39 {
                        numbers[numbers.count - 1] = min(cap, numbers[numbers.count - 1] * 10 + Int(bytes[j] - 0x30))
                    }
                    j += 1
                }
                let upper =
                    sawComma && numbers.count > 1 && j > i + 1 && bytes[j - 1] != UInt8(ascii: ",")
                    ? numbers[1] : numbers[0] + (sawComma ? 1 : 0)
                func times(_ a: Int, _ b: Int) -> Int {
                    let (product, overflow) = a.multipliedReportingOverflow(by: b)
                    return overflow ? cap : min(cap, product)
                }
                // The atom counted once already; written out `upper` times in all.
                stack[stack.count - 1] = min(cap, stack[stack.count - 1] + times(last, max(0, upper - 1)))
                last = times(last, max(1, upper))
                i = j
            case UInt8(ascii: "|"), UInt8(ascii: "^"), UInt8(ascii: "$"), UInt8(ascii: "*"), UInt8(ascii: "+"),
                UInt8(ascii: "?"):
                break
            default:
                last = 1
                stack[stack.count - 1] += 1
            }
            i += 1
        }
        return min(cap, stack.reduce(0, +))
    }

    /// What ERE would read otherwise than ECMA-262, if the pattern holds any.
    static func unsupported(in source: String) -> String? {
        let bytes = Array(source.utf8)
        var i = 0
        var inBracket = false
        var quantified = false  // the last thing read was a repetition (*, +, {m,n})
        var previous: UInt8 = 0  // the last byte read outside brackets, unescaped
        var depth = 0  // groups open
        while i < bytes.count {
            let b = bytes[i]
            if !inBracket, b == UInt8(ascii: "?"), previous == UInt8(ascii: "+") || previous == UInt8(ascii: "}") {
                return
                    "+? and {m,n}? are lazy repetitions to ECMA-262 and an optional repetition to the C library (it matches the empty string); write + or {m,n}"
            }
            if !inBracket, previous == UInt8(ascii: "?"),
                b == UInt8(ascii: "*") || b == UInt8(ascii: "+") || b == UInt8(ascii: "{")
            {
                return
                    "a repetition after ? is an error to ECMA-262, possessive to Python's re and a repetition of the group to the C library; group it: (a?)+"
            }
            if !inBracket, b == UInt8(ascii: "(") { depth += 1 }
            if !inBracket, b == UInt8(ascii: ")") {
                guard depth > 0 else {
                    return
                        "a ) with no ( before it is an error to ECMA-262 and a literal to the C library; escape it: \\)"
                }
                depth -= 1
            }
            if !inBracket { previous = b }
            if b == UInt8(ascii: "\\"), i + 1 < bytes.count {
                let next = bytes[i + 1]
                // Only punctuation is escaped alike: a letter or a digit after a backslash is
                // an escape, an anchor or an error to one dialect or the other (\A, \Z, \a, \z).
                if !inBracket, next < 0x80,
                    Character(Unicode.Scalar(next)).isLetter || Character(Unicode.Scalar(next)).isNumber
                {
                    return
                        "the escape \\\(Character(Unicode.Scalar(next))) means something else to ECMA-262, to Python's re and to the C library; only punctuation may follow a backslash (spell \\d as [0-9], \\s as [ \\t])"
                }
                if inBracket {
                    return
                        "a backslash inside [...] means itself to POSIX and an escape to ECMA-262; move it out of the brackets"
                }
                if !inBracket, "<>`'".utf8.contains(next) {
                    return
                        "\\\(Character(Unicode.Scalar(next))) is an anchor to the C library and the character itself to ECMA-262; write it without the backslash"
                }
                quantified = false
                previous = 0
                i += 2
                continue
            }
            if !inBracket {
                // A repetition of a repetition (a**, a{1}{2}) is an error to ECMA-262 (a*? is
                // its lazy form, which matches where a* does); {,n} is a repetition to the C
                // library and text to ECMA-262.
                if b == UInt8(ascii: "*") || b == UInt8(ascii: "+") || b == UInt8(ascii: "{") {
                    if quantified {
                        return "a repetition of a repetition is an error to ECMA-262; group it: (a*)*"
                    }
                    if b == UInt8(ascii: "{"), i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: ",") {
                        return "{,n} is a repetition to the C library and text to ECMA-262; write {0,n}"
                    }
                    quantified = true
                    if b == UInt8(ascii: "{") {
                        while i < bytes.count, bytes[i] != UInt8(ascii: "}") { i += 1 }
                        previous = UInt8(ascii: "}")
                    }
                    i += 1
                    continue
                } else if b != UInt8(ascii: "?") {
                    quantified = false
                }
            }
            if b == UInt8(ascii: "[") && !inBracket {
                inBracket = true
                // A ']' right after '[' or '[^' is a member, in both dialects.
                if i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "^") { i += 1 }
                if i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "]") {
                    return "[] and [^] are ECMA-262 classes POSIX reads otherwise; put ']' elsewhere"
                }
            } else if b == UInt8(ascii: "]") && inBracket {
                inBracket = false
            } else if b == UInt8(ascii: "(") && !inBracket && i + 1 < bytes.count && bytes[i + 1] == UInt8(ascii: "?") {
                return "(?…) groups (lookarounds, named or non-capturing groups) are ECMA-262's only"
            } else if b == UInt8(ascii: "[") && inBracket && i + 1 < bytes.count
                && ":.=".utf8.contains(bytes[i + 1])
            {
                return "[: :], [. .] and [= =] inside brackets are POSIX's only"
            }
            i += 1
        }
        return nil
    }
}

struct PatternError: Error {
    var reason: String
}
