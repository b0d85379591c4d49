/// A `pattern` as whend searches it: a Thompson automaton run over a string's characters once,
/// every way through it at the same time (as RE2 and Go's regexp do), so that a search costs at
/// most the string's length times the automaton's size, whatever the pattern and the string.
///
/// The C library's `regexec`, which whend used before, tried the pattern afresh at every
/// position of the string: `(a|aa)*c` took 5 s over 64 KiB of `a`, with the connection's ingest
/// held. A plan's patterns are searched for a yes or a no, so ECMA-262's leftmost-first and
/// POSIX's leftmost-longest readings give the same answer, and no backtracking is needed.
struct PatternAutomaton: Sendable {
    enum Step: Sendable {
        case character(UInt32)
        case set(Int)  // an index into `sets`
        case split(Int, Int)
        case jump(Int)
        case atStart
        case atEnd
        case match
    }

    let steps: [Step]
    let sets: [CharacterClass]
    /// Every way through starts with `^`: no other start than the string's first is tried.
    let anchored: Bool

    /// The most steps a pattern's automaton may have: a search costs up to twice this per
    /// character. A pattern within `Pattern.maxExpandedSize` positions may still need more,
    /// with alternatives, optional groups nested in optional groups, or empty choices repeated
    /// (`(|||…){1000}`), each of which costs a step and no position.
    static let maxSteps = 4000

    init(_ source: String) throws(PatternError) {
        var parser = PatternParser(scalars: source.unicodeScalars.map(\.value))
        let node = try parser.parse()
        let size = Self.size(of: node)
        guard size <= Self.maxSteps else {
            throw PatternError(
                reason:
                    "its automaton would have \(size > 1_000_000 ? "over 1000000" : String(size)) steps, over \(Self.maxSteps) (each alternative, repetition and optional part is one, and counted repetitions copy them): a search costs that much per character; simplify it"
            )
        }
        var builder = Builder()
        builder.emit(node)
        builder.steps.append(.match)
        steps = builder.steps
        sets = builder.sets
        if case .atStart = steps[0] { anchored = true } else { anchored = false }
    }

    /// How many steps `Builder` writes for `node`, without writing them; capped, so that no
    /// nesting overflows.
    static func size(of node: PatternNode) -> Int {
        let cap = 1 << 40
        func add(_ a: Int, _ b: Int) -> Int { min(cap, a + b) }
        func times(_ a: Int, _ b: Int) -> Int {
            let (product, overflow) = a.multipliedReportingOverflow(by: b)
            return overflow ? cap : min(cap, product)
        }
        switch node {
        case .empty: return 0
        case .character, .set, .start, .end: return 1
        case .sequence(let parts): return parts.reduce(0) { add($0, size(of: $1)) }
        case .either(let choices):
            return add(choices.reduce(0) { add($0, size(of: $1)) }, times(2, choices.count - 1))
        case .repeated(let body, let least, let most):
            let one = size(of: body)
            guard let most else { return add(times(least, one), add(one, 2)) }
            return add(times(least, one), times(most - least, add(one, 1)))
        }
    }

    /// Whether the pattern occurs anywhere in `text` (UTF-8), and how many steps of the
    /// automaton the search took (its cost, at most `(characters + 1) × steps.count` each way).
    func search(_ text: UnsafeBufferPointer<UInt8>) -> (found: Bool, work: Int) {
        let size = steps.count
        // marks, the current and the next list of steps, and the stack of steps to visit.
        return withUnsafeTemporaryAllocation(of: Int32.self, capacity: 5 * size + 2) { scratch in
            var run = Run(
                automaton: self, marks: scratch.baseAddress!, current: scratch.baseAddress! + size,
                next: scratch.baseAddress! + 2 * size, stack: scratch.baseAddress! + 3 * size, end: text.count)
            run.marks.initialize(repeating: 0, count: size)
            return (run.search(text), run.work)
        }
    }

    /// One search's state, in memory the caller holds.
    private struct Run {
        let automaton: PatternAutomaton
        let marks: UnsafeMutablePointer<Int32>  // the generation that last listed each step
        var current: UnsafeMutablePointer<Int32>
        var next: UnsafeMutablePointer<Int32>
        let stack: UnsafeMutablePointer<Int32>
        let end: Int
        var currentCount = 0
        var nextCount = 0
        var generation: Int32 = 0
        var work = 0

        init(
            automaton: PatternAutomaton, marks: UnsafeMutablePointer<Int32>, current: UnsafeMutablePointer<Int32>,
            next: UnsafeMutablePointer<Int32>, stack: UnsafeMutablePointer<Int32>, end: Int
        ) {
            self.automaton = automaton
            self.marks = marks
            self.current = current
            self.next = next
            self.stack = stack
            self.end = end
        }

        mutating func search(_ text: UnsafeBufferPointer<UInt8>) -> Bool {
            generation = 1
            if add(0, at: 0) { return true }
            swap(&current, &next)
            currentCount = nextCount
            var position = 0
            while position < end {
                let (character, width) = Self.decode(text, position)
                let after = position + width
                generation += 1
                nextCount = 0
                for i in 0..<currentCount {
                    let step = Int(current[i])
                    work += 1
                    let taken: Bool
                    switch automaton.steps[step] {
                    case .character(let c): taken = c == character
                    case .set(let s): taken = automaton.sets[s].contains(character)
                    default: taken = false
                    }
                    if taken, add(step + 1, at: after) { return true }
                }
                if !automaton.anchored, add(0, at: after) { return true }
                if nextCount == 0 && automaton.anchored { return false }
                swap(&current, &next)
                currentCount = nextCount
                position = after
            }
            return false
        }

        /// Lists `first` and every step reached from it without reading a character, at byte
        /// `position`; true once the match is reached.
        mutating func add(_ first: Int, at position: Int) -> Bool {
            var depth = 1
            stack[0] = Int32(first)
            while depth > 0 {
                depth -= 1
                let step = Int(stack[depth])
                if marks[step] == generation { continue }
                marks[step] = generation
                work += 1
                switch automaton.steps[step] {
                case .character, .set:
                    next[nextCount] = Int32(step)
                    nextCount += 1
                case .split(let a, let b):
                    stack[depth] = Int32(b)
                    stack[depth + 1] = Int32(a)
                    depth += 2
                case .jump(let to):
                    stack[depth] = Int32(to)
                    depth += 1
                case .atStart:
                    if position == 0 {
                        stack[depth] = Int32(step + 1)
                        depth += 1
                    }
                case .atEnd:
                    if position == end {
                        stack[depth] = Int32(step + 1)
                        depth += 1
                    }
                case .match:
                    return true
                }
            }
            return false
        }

        /// The character at `i` and its width in bytes. A byte that begins no UTF-8 sequence is
        /// a character of its own that only a negated set takes (a lone surrogate, written as
        /// its three bytes, reads as itself).
        static func decode(_ text: UnsafeBufferPointer<UInt8>, _ i: Int) -> (UInt32, Int) {
            let lead = UInt32(text[i])
            if lead < 0x80 { return (lead, 1) }
            func continuation(_ k: Int) -> UInt32? {
                guard i + k < text.count, text[i + k] & 0xC0 == 0x80 else { return nil }
                return UInt32(text[i + k] & 0x3F)
            }
            let invalid = (0x11_0000 + lead, 1)
            switch lead {
            case 0xC2...0xDF:
                guard let b = continuation(1) else { return invalid }
                return ((lead & 0x1F) << 6 | b, 2)
            case 0xE0...0xEF:
                guard let b = continuation(1), let c = continuation(2) else { return invalid }
                let value = (lead & 0x0F) << 12 | b << 6 | c
                return value < 0x800 ? invalid : (value, 3)
            case 0xF0...0xF4:
                guard let b = continuation(1), let c = continuation(2), let d = continuation(3) else { return invalid }
                let value = (lead & 0x07) << 18 | b << 12 | c << 6 | d
                return value < 0x1_0000 || value > 0x10_FFFF ? invalid : (value, 4)
            default:
                return invalid
            }
        }
    }

    /// Writes a parsed pattern out as steps: `x{m,n}` as m copies of x, then n − m optional ones.
    private struct Builder {
        var steps: [Step] = []
        var sets: [CharacterClass] = []

        mutating func emit(_ node: PatternNode) {
            switch node {
            case .empty: break
            case .character(let c): steps.append(.character(c))
            case .set(let set):
                sets.append(set)
                steps.append(.set(sets.count - 1))
            case .start: steps.append(.atStart)
            case .end: steps.append(.atEnd)
            case .sequence(let parts): for part in parts { emit(part) }
            case .either(let choices):
                var jumps: [Int] = []
                for choice in choices.dropLast() {
                    let split = steps.count
                    steps.append(.split(split + 1, 0))
                    emit(choice)
                    jumps.append(steps.count)
                    steps.append(.jump(0))
                    steps[split] = .split(split + 1, steps.count)
                }
                emit(choices[choices.count - 1])
                for jump in jumps { steps[jump] = .jump(steps.count) }
            case .repeated(let body, let least, let most):
                for _ in 0..<least { emit(body) }
                guard let most else {
                    let loop = steps.count
                    steps.append(.split(loop + 1, 0))
                    emit(body)
                    steps.append(.jump(loop))
                    steps[loop] = .split(loop + 1, steps.count)
                    return
                }
                var splits: [Int] = []
                for _ in least..<max(least, most) {
                    splits.append(steps.count)
                    steps.append(.split(0, 0))
                    emit(body)
                }
                for split in splits { steps[split] = .split(split + 1, steps.count) }
            }
        }
    }
}

/// A bracket expression (or `.`): the ASCII characters it takes as a bitmap, the others as
/// sorted ranges.
struct CharacterClass: Sendable {
    var low: UInt64 = 0
    var high: UInt64 = 0
    var ranges: [ClosedRange<UInt32>] = []
    var negated = false

    init(ranges members: [ClosedRange<UInt32>], negated: Bool) {
        self.negated = negated
        for range in members {
            if range.lowerBound < 128 {
                for c in range.lowerBound...min(range.upperBound, 127) {
                    if c < 64 { low |= 1 << UInt64(c) } else { high |= 1 << UInt64(c - 64) }
                }
            }
            if range.upperBound >= 128 { ranges.append(max(range.lowerBound, 128)...range.upperBound) }
        }
        // Sorted and merged, so that the search below finds the one range that could hold a
        // character (`[éx-😀]` holds é inside x-😀: unmerged, ÿ was not found).
        var merged: [ClosedRange<UInt32>] = []
        for range in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) {
            if let last = merged.last, range.lowerBound <= last.upperBound &+ 1 {
                merged[merged.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        ranges = merged
    }

    func contains(_ c: UInt32) -> Bool {
        if c < 64 { return ((low >> UInt64(c)) & 1 == 1) != negated }
        if c < 128 { return ((high >> UInt64(c - 64)) & 1 == 1) != negated }
        var lo = 0
        var hi = ranges.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if ranges[mid].upperBound < c { lo = mid + 1 } else { hi = mid }
        }
        return (lo < ranges.count && ranges[lo].contains(c)) != negated
    }

    /// ECMA-262's `.`: any character but a line terminator.
    static let anyButLineTerminators = CharacterClass(
        ranges: [0x0A...0x0A, 0x0D...0x0D, 0x2028...0x2029], negated: true)
}

indirect enum PatternNode {
    case empty
    case character(UInt32)
    case set(CharacterClass)
    case start
    case end
    case sequence([PatternNode])
    case either([PatternNode])
    case repeated(PatternNode, least: Int, most: Int?)
}

/// Reads the pattern language of docs/tracking-plan.md (what `Pattern.unsupported` leaves).
struct PatternParser {
    let scalars: [UInt32]
    var i = 0
    /// Groups open; read by recursion, so bounded.
    private var depth = 0
    static let maxDepth = 100

    init(scalars: [UInt32]) { self.scalars = scalars }

    private func at(_ c: Character) -> Bool { i < scalars.count && scalars[i] == c.unicodeScalars.first!.value }

    mutating func parse() throws(PatternError) -> PatternNode {
        let node = try either()
        guard i == scalars.count else { throw PatternError(reason: "a ) with no ( before it") }
        return node
    }

    private mutating func either() throws(PatternError) -> PatternNode {
        var choices = [try sequence()]
        while at("|") {
            i += 1
            choices.append(try sequence())
        }
        return choices.count == 1 ? choices[0] : .either(choices)
    }

    private mutating func sequence() throws(PatternError) -> PatternNode {
        var parts: [PatternNode] = []
        while i < scalars.count, !at("|"), !at(")") {
            var atom = try self.atom()
            if let (least, most) = try repetition() {
                if case .start = atom { throw PatternError(reason: "a repetition of ^ repeats nothing") }
                if case .end = atom { throw PatternError(reason: "a repetition of $ repeats nothing") }
                atom = .repeated(atom, least: least, most: most)
                // `*?` and `??` are lazy forms, which find a match wherever the greedy ones do.
                if at("?") { i += 1 }
                // Anything more (`a???`, `a*??`) is an error to ECMA-262 and to Python's re.
                if try repetition() != nil {
                    throw PatternError(reason: "a repetition of a repetition is an error to ECMA-262; group it: (a?)?")
                }
            }
            parts.append(atom)
        }
        return parts.isEmpty ? .empty : parts.count == 1 ? parts[0] : .sequence(parts)
    }

    /// `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}` at `i`, read; nil if none is.
    private mutating func repetition() throws(PatternError) -> (Int, Int?)? {
        guard i < scalars.count else { return nil }
        switch Unicode.Scalar(scalars[i]) {
        case "*":
            i += 1
            return (0, nil)
        case "+":
            i += 1
            return (1, nil)
        case "?":
            i += 1
            return (0, 1)
        case "{":
            var j = i + 1
            func number() -> Int? {
                let start = j
                var value = 0
                while j < scalars.count, (0x30...0x39).contains(scalars[j]) {
                    value = min(value * 10 + Int(scalars[j] - 0x30), 1 << 30)
                    j += 1
                }
                return j > start ? value : nil
            }
            // Not a bound (`{`, `{x}`): the character itself, as ECMA-262 and Python read it.
            guard let least = number() else { return nil }
            var most: Int? = least
            if j < scalars.count, scalars[j] == 0x2C {
                j += 1
                most = number()
            }
            guard j < scalars.count, scalars[j] == 0x7D else { return nil }
            if let most, most < least { throw PatternError(reason: "{\(least),\(most)} counts down") }
            i = j + 1
            return (least, most)
        default:
            return nil
        }
    }

    private mutating func atom() throws(PatternError) -> PatternNode {
        let c = scalars[i]
        i += 1
        switch Unicode.Scalar(c) {
        case "(":
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maxDepth else {
                throw PatternError(reason: "it nests groups deeper than \(Self.maxDepth)")
            }
            let inner = try either()
            guard at(")") else { throw PatternError(reason: "a ( is not closed") }
            i += 1
            // A group may be repeated, whatever it holds: `(^)*` is a pattern, `^*` is not.
            return .sequence([inner])
        case "[": return .set(try bracket())
        case ".": return .set(.anyButLineTerminators)
        case "^": return .start
        case "$": return .end
        case "*", "+", "?": throw PatternError(reason: "\(Unicode.Scalar(c)!) repeats nothing")
        case "{" where i < scalars.count && (0x30...0x39).contains(scalars[i]):
            throw PatternError(
                reason:
                    "a { before a digit is read as a count ({m}, {m,} or {m,n}), and this one is not complete or repeats nothing; write \\{ for the character itself"
            )
        case "\\":
            guard i < scalars.count else { throw PatternError(reason: "it ends in a lone backslash") }
            i += 1
            return .character(scalars[i - 1])
        default: return .character(c)
        }
    }

    /// The members of a bracket expression opened just before `i`, through its `]`.
    private mutating func bracket() throws(PatternError) -> CharacterClass {
        let negated = at("^")
        if negated { i += 1 }
        var members: [ClosedRange<UInt32>] = []
        var first = true
        while i < scalars.count, first || !at("]") {
            first = false
            let lower = scalars[i]
            i += 1
            if at("-"), i + 1 < scalars.count, scalars[i + 1] != 0x5D {
                let upper = scalars[i + 1]
                guard lower <= upper else { throw PatternError(reason: "a range in [...] runs backwards") }
                members.append(lower...upper)
                i += 2
            } else {
                members.append(lower...lower)
            }
        }
        guard at("]") else { throw PatternError(reason: "a [ is not closed") }
        i += 1
        return CharacterClass(ranges: members, negated: negated)
    }
}
