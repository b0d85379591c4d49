import Foundation
import Glibc
import SeededRandom
import Testing

@testable import WhendTrackingPlan

/// whend's own pattern search against two readers it did not write — the C library's POSIX
/// expressions and Python's `re` (which the reference JSON Schema validator uses) — on
/// generated patterns and strings, and its cost against its bound on any of them.
@Suite struct PatternSearchTests {
    @Test(arguments: [UInt64(1), 2, 3, 4])
    func searchesAgreeWithTheCLibrary(seed: UInt64) throws {
        var generator = PatternGenerator(seed: seed)
        var compared = 0
        var refusedByWhendAlone: [String] = []
        var acceptedByWhendAlone: [String] = []
        for _ in 0..<400 {
            let source = generator.pattern()
            guard let reference = CLibraryPattern(source) else {
                if (try? Pattern(source)) != nil { acceptedByWhendAlone.append(source) }
                continue
            }
            let ours: Pattern
            do { ours = try Pattern(source) } catch {
                if Pattern.unsupported(in: source) == nil && Pattern.expandedSize(of: source) <= 1000 {
                    refusedByWhendAlone.append("\(source): \(error.reason)")
                }
                continue
            }
            for _ in 0..<25 {
                // The C library reads a `$` followed by more pattern as "before a newline" (`a$.`
                // finds "a\nc") and a `^` after some as "after a newline", which neither ECMA-262
                // nor Python does (whend did, when it searched with the C library): such patterns
                // meet newlines in the comparison with Python, below.
                var text = generator.text(lineTerminators: true)
                if source.contains("$") || source.contains("^") {
                    text = text.replacingOccurrences(of: "\n", with: "x")
                }
                let (mine, theirs) = Array(text.utf8).withUnsafeBufferPointer {
                    (ours.matches($0), reference.matches($0))
                }
                #expect(mine == theirs, "seed \(seed): \(source) over \(text.debugDescription)")
                compared += 1
            }
        }
        #expect(refusedByWhendAlone.isEmpty, "\(refusedByWhendAlone.prefix(5))")
        // The C library refuses a range to a character of more than one byte (`[x-😀]`), which
        // ECMA-262 and Python read as code points, and a '-' right after a range (`[a-z-.]`),
        // which they read as itself; so does whend: compared with Python below.
        #expect(
            acceptedByWhendAlone.allSatisfy {
                $0.contains("-é") || $0.contains("-😀") || $0.range(of: "-[^]]-", options: .regularExpression) != nil
            },
            "\(acceptedByWhendAlone.prefix(5))")
        #expect(compared > 4000)
    }

    @Test func searchesAgreeWithPython() throws {
        var generator = PatternGenerator(seed: 7)
        var cases: [(pattern: String, text: String, ours: Bool)] = []
        while cases.count < 6000 {
            let source = generator.pattern()
            guard let ours = try? Pattern(source) else { continue }
            for _ in 0..<20 {
                // Python's `.` takes \r, U+2028 and U+2029, and its `$` matches before a last
                // newline, where ECMA-262 does not: left out here, as in DifferentialTests.
                var text = generator.text(lineTerminators: false)
                if text.hasSuffix("\n") { text += "a" }
                cases.append((source, text, Array(text.utf8).withUnsafeBufferPointer { ours.matches($0) }))
            }
        }
        let lines = cases.map { c in
            String(
                decoding: try! JSONSerialization.data(
                    withJSONObject: [c.pattern, c.text], options: [.fragmentsAllowed]),
                as: UTF8.self)
        }
        let verdicts = try DifferentialTests.runPython(
            """
            import json, re, sys, warnings
            warnings.simplefilter("ignore")
            print("".join("1" if re.search(*json.loads(line)) else "0" for line in open(sys.argv[1], encoding="utf-8")))
            """, input: lines.joined(separator: "\n") + "\n")
        #expect(verdicts.count == cases.count)
        var differences: [String] = []
        for (c, verdict) in zip(cases, verdicts) where c.ours != verdict {
            differences.append("\(c.pattern) over \(c.text.debugDescription): whend \(c.ours), Python \(verdict)")
        }
        #expect(differences.isEmpty, "\(differences.count) of \(cases.count): \(differences.prefix(5))")
    }

    /// A search costs at most twice the automaton's size per character: the patterns that held
    /// a connection for seconds under the C library's search, and any generated one.
    @Test func aSearchCostsAtMostItsBound() throws {
        let long = Array(repeating: UInt8(ascii: "a"), count: 4 << 10)
        for source in ["(a|aa)*c", "(a*)*b", "(a|a)*$b", "^(a?){30}a{30}$", "(.*a){20}x", "((a+)+)+c"] {
            let pattern = try Pattern(source)
            let work = long.withUnsafeBufferPointer { pattern.work($0) }
            #expect(work <= 2 * pattern.size * (long.count + 1), "\(source): \(work)")
            #expect(long.withUnsafeBufferPointer { !pattern.matches($0) }, "\(source)")
        }
        var generator = PatternGenerator(seed: 11)
        for _ in 0..<300 {
            guard let pattern = try? Pattern(generator.pattern()) else { continue }
            let text = Array((0..<50).map { _ in generator.text(lineTerminators: true) }.joined().utf8)
            let work = text.withUnsafeBufferPointer { pattern.work($0) }
            #expect(work <= 2 * pattern.size * (text.count + 1), "\(pattern.source): \(work)")
        }
    }

    /// A byte that begins no character, or a lone surrogate's three bytes, is one character
    /// that only a negated set or `.` takes.
    @Test func bytesThatAreNoCharacterAreOneEach() throws {
        let dot = try Pattern("^.$")
        let notA = try Pattern("^[^a]$")
        let aToZ = try Pattern("^[a-z]$")
        for bytes: [UInt8] in [[0xFF], [0xC0], [0xED, 0xA0, 0x80], [0xE0, 0x80, 0x80]] {
            let each = bytes.count
            #expect(bytes.withUnsafeBufferPointer { aToZ.matches($0) } == false)
            if each == 1 {
                #expect(bytes.withUnsafeBufferPointer { dot.matches($0) && notA.matches($0) })
            }
        }
    }
}

/// The C library's reading of a pattern, as whend used it before it searched with its own
/// automaton: `regcomp` of the POSIX form in C.UTF-8, `regexec` over the string.
final class CLibraryPattern {
    private var regex = regex_t()
    nonisolated(unsafe) private static let utf8 = newlocale((1 << LC_CTYPE) | (1 << LC_COLLATE), "C.UTF-8", nil)

    init?(_ source: String) {
        let previous = uselocale(Self.utf8)
        defer { uselocale(previous) }
        guard regcomp(&regex, Self.posix(source), REG_EXTENDED | REG_NOSUB) == 0 else { return nil }
    }

    /// The pattern as POSIX reads it: each `.` outside a bracket expression written as "any
    /// character but the line terminators ECMA-262's `.` leaves out" (\n, \r, U+2028, U+2029).
    static func posix(_ source: String) -> String {
        let bytes = Array(source.utf8)
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            let b = bytes[i]
            switch b {
            case UInt8(ascii: "\\"):
                out.append(contentsOf: bytes[i..<min(i + 2, bytes.count)])
                i += 2
                continue
            case UInt8(ascii: "["):
                let start = i
                i = Pattern.bracketEnd(bytes, i)
                out.append(contentsOf: bytes[start..<min(i + 1, bytes.count)])
            case UInt8(ascii: "."):
                out.append(contentsOf: Array("[^\n\r\u{2028}\u{2029}]".utf8))
            default:
                out.append(b)
            }
            i += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    deinit { regfree(&regex) }

    func matches(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let previous = uselocale(Self.utf8)
        defer { uselocale(previous) }
        var match = regmatch_t(rm_so: 0, rm_eo: regoff_t(bytes.count))
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return regexec(&regex, "", 1, &match, 0) == 0 }
        return base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
            regexec(&regex, $0, 1, &match, REG_STARTEND) == 0
        }
    }
}

/// Patterns from the whole language a plan may use (and a little past it: forms either reader
/// may refuse), over characters of one to four bytes, and strings of those characters.
struct PatternGenerator {
    var random: SplitMix64
    static let characters = ["a", "b", "c", "é", "😀", "-", "x"]
    static let textCharacters = ["a", "b", "c", "é", "😀", "-", "x", "ab", ".", "\n", "\r", "\u{2028}", "ÿ", "{"]

    init(seed: UInt64) { random = SplitMix64(state: seed) }

    mutating func chance(_ n: Int) -> Bool { random.int(n) == 0 }
    mutating func pick<T>(_ list: [T]) -> T { list[random.int(list.count)] }

    mutating func pattern() -> String { alternatives(depth: 0) }

    mutating func text(lineTerminators: Bool) -> String {
        let pool =
            lineTerminators ? Self.textCharacters : Self.textCharacters.filter { !["\r", "\u{2028}"].contains($0) }
        return (0..<random.int(9)).map { _ in pick(pool) }.joined()
    }

    private mutating func alternatives(depth: Int) -> String {
        (0..<(chance(3) ? 2 + random.int(2) : 1)).map { _ in sequence(depth: depth) }.joined(separator: "|")
    }

    private mutating func sequence(depth: Int) -> String {
        (0..<random.int(depth == 0 ? 5 : 3)).map { _ in piece(depth: depth) }.joined()
    }

    private mutating func piece(depth: Int) -> String {
        switch random.int(12) {
        case 0: return "^"
        case 1: return "$"
        default: return atom(depth: depth) + (chance(3) ? repetition() : "")
        }
    }

    private mutating func repetition() -> String {
        let least = random.int(3)
        return pick(["*", "+", "?", "{\(least)}", "{\(least),}", "{\(least),\(least + random.int(3))}", "*?", "??"])
    }

    private mutating func atom(depth: Int) -> String {
        switch random.int(10) {
        case 0, 1, 2: return pick(Self.characters)
        case 3: return "."
        case 4: return pick(["\\.", "\\*", "\\-", "\\{", "\\|", "\\("])
        case 5, 6: return bracket()
        case 7 where depth < 3, 8 where depth < 3: return "(" + alternatives(depth: depth + 1) + ")"
        default: return pick(Self.characters)
        }
    }

    private mutating func bracket() -> String {
        var members = ""
        for _ in 0..<(1 + random.int(3)) {
            members += chance(3) ? pick(["a-c", "b-é", "é-😀", "a-z", "x-😀"]) : pick(Self.characters + ["."])
        }
        return "[" + (chance(3) ? "^" : "") + members + "]"
    }
}
