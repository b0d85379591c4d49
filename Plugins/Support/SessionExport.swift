import WhendSystem
import WhendWire

/// `sessions.json`, the export of a `SessionIndex`: what session-recorder writes every so
/// often and `whenctl sessions` reads.
///
/// `{"indexedThrough":N,"maxSessions":M,"sessions":[…],"sessionsBeyondMax":[…]}`: the sessions
/// listed (the `maxSessions` most recently active), most recent first, then those the index
/// keeps beyond them. Each session's members are in alphabetical order, as JSONEncoder wrote
/// them with sorted keys: `app`, `counts`, `digest` (only where the strings do not give the
/// session: an id with a surrogate without its partner, which a string holds as U+FFFD),
/// `firstSeq`, `firstTime`, `lastSeq`, `lastTime`, `session`. Earlier versions wrote neither
/// `maxSessions`, `sessionsBeyondMax` nor `digest`.
extension SessionIndex {
    /// The export as read.
    struct Snapshot {
        var indexedThrough: UInt64
        var maxSessions: Int?
        var sessions: [Exported]
        var sessionsBeyondMax: [Exported]?
    }

    /// One session as exported, and its digest.
    struct Exported {
        var entry: Entry
        var key: SessionDigest
    }

    /// Reads an export, as this version writes it or as JSONEncoder wrote it before (keys
    /// sorted, no limit): nil for anything else. With whend's own scanner rather than
    /// Foundation's decoder, which took two thirds of `whenctl sessions`' time for 53,000
    /// sessions, and kept an object's keys in a dictionary of strings, where two types whose
    /// bytes differ only as Unicode's equivalence allows ("é", "e\u{301}") were one.
    static func readExport(_ bytes: UnsafeBufferPointer<UInt8>) -> Snapshot? {
        var through: UInt64?
        var limit: Int??
        var listed: [Exported]?
        var beyond: [Exported]??
        var scanner = JSONScanner(bytes)
        do throws(WireError) {
            try scanner.scanObject { m throws(WireError) in
                let value = UnsafeBufferPointer(rebasing: bytes[m.value])
                switch try ExportField.key(m, in: bytes) {
                case "indexedThrough" where through == nil: through = try ExportField.unsigned(m, value)
                case "maxSessions" where limit == nil:
                    limit = m.kind == .null ? .some(nil) : try ExportField.count(m, value)
                case "sessions" where listed == nil: listed = try readSessions(value)
                case "sessionsBeyondMax" where beyond == nil:
                    beyond = m.kind == .null ? .some(nil) : try readSessions(value)
                default: break
                }
            }
            scanner.skipWhitespace()
            guard scanner.atEnd else { return nil }
        } catch {
            return nil
        }
        guard let through, let listed else { return nil }
        return Snapshot(
            indexedThrough: through, maxSessions: limit ?? nil, sessions: listed, sessionsBeyondMax: beyond ?? nil)
    }

    /// An array of exported sessions.
    private static func readSessions(_ bytes: UnsafeBufferPointer<UInt8>) throws(WireError) -> [Exported] {
        var sessions: [Exported] = []
        var scanner = JSONScanner(bytes)
        try scanner.scanArray { kind, range throws(WireError) in
            sessions.append(try readSession(UnsafeBufferPointer(rebasing: bytes[range])))
        }
        return sessions
    }

    /// One exported session: every member of an `Entry` (the first of each), and its digest
    /// where written, else the one its strings give.
    private static func readSession(_ bytes: UnsafeBufferPointer<UInt8>) throws(WireError) -> Exported {
        var strings: [String: String] = [:]
        var numbers: [String: UInt64] = [:]
        var counts: TypeCounts?
        var scanner = JSONScanner(bytes)
        try scanner.scanObject { m throws(WireError) in
            let value = UnsafeBufferPointer(rebasing: bytes[m.value])
            let key = try ExportField.key(m, in: bytes)
            switch key {
            case "app", "session", "firstTime", "lastTime", "digest":
                if strings[key] == nil { strings[key] = try ExportField.string(m, value) }
            case "firstSeq", "lastSeq":
                if numbers[key] == nil { numbers[key] = try ExportField.unsigned(m, value) }
            case "counts" where counts == nil:
                var read = TypeCounts()
                var inner = JSONScanner(value)
                try inner.scanObject { c throws(WireError) in
                    let type = try ExportField.key(c, in: value)
                    let n = try ExportField.count(c, UnsafeBufferPointer(rebasing: value[c.value]))
                    if read[type] == nil { read[type] = n }
                }
                counts = read
            default: break
            }
        }
        guard let app = strings["app"], let session = strings["session"], let firstTime = strings["firstTime"],
            let lastTime = strings["lastTime"], let firstSeq = numbers["firstSeq"], let lastSeq = numbers["lastSeq"],
            let counts
        else { throw WireError(.missingField, "an exported session lacks a member") }
        let entry = Entry(
            app: app, session: session, firstSeq: firstSeq, lastSeq: lastSeq, firstTime: firstTime,
            lastTime: lastTime, counts: counts)
        let key = strings["digest"].flatMap(SessionDigest.init(hex:)) ?? SessionDigest(app: app, session: session)
        return Exported(entry: entry, key: key)
    }

    /// The members of an export, read as Foundation's decoder read them.
    private enum ExportField {
        static func key(_ m: JSONScanner.Member, in bytes: UnsafeBufferPointer<UInt8>) throws(WireError) -> String {
            guard let key = decodedJSONString(UnsafeBufferPointer(rebasing: bytes[m.key]), hasEscapes: m.keyHasEscapes)
            else { throw WireError(.invalidField, "a key that is not a string of Unicode") }
            return key
        }

        static func string(_ m: JSONScanner.Member, _ value: UnsafeBufferPointer<UInt8>) throws(WireError) -> String {
            guard m.kind == .string, value.count >= 2,
                let text = decodedJSONString(
                    UnsafeBufferPointer(rebasing: value[1..<value.count - 1]), hasEscapes: m.valueHasEscapes)
            else { throw WireError(.invalidField, "a member that is not a string") }
            return text
        }

        /// A whole number written as digits.
        static func unsigned(_ m: JSONScanner.Member, _ value: UnsafeBufferPointer<UInt8>) throws(WireError) -> UInt64 {
            guard m.kind == .number, let n = UInt64(String(decoding: value, as: UTF8.self)) else {
                throw WireError(.invalidField, "a member that is not a whole number")
            }
            return n
        }

        /// A whole number that fits an `Int` (a damaged export's larger one trapped the reader).
        static func count(_ m: JSONScanner.Member, _ value: UnsafeBufferPointer<UInt8>) throws(WireError) -> Int {
            guard let n = Int(exactly: try unsigned(m, value)) else {
                throw WireError(.invalidField, "a member past the largest count")
            }
            return n
        }
    }

    /// The export, written directly and handed to `write` a piece at a time: JSONEncoder took a
    /// fifth of a replay's time for an index of 10,000 sessions; the whole export in one buffer,
    /// grown as it was written, held three times its size at its peak. A session is written
    /// from its compact form, each app's and type's name escaped once for the whole export
    /// (`compact`; else, and for a session with a spilled field, from its `Entry`, which built
    /// four strings and a table of counts each: a tenth of a replay's time).
    func writeSnapshotJSON(compact: Bool = true, _ write: ([UInt8]) throws(DurableFileError) -> Void)
        throws(DurableFileError)
    {
        let piece = 1 << 16
        var out: [UInt8] = []
        out.reserveCapacity(piece + 4096)
        out += #"{"indexedThrough":"#.utf8
        JSONBytes.appendDecimal(indexedThrough, to: &out)
        if let maxSessions {
            out += #","maxSessions":"#.utf8
            JSONBytes.appendDecimal(UInt64(maxSessions), to: &out)
        }
        out += #","sessions":["#.utf8
        let order = mostRecentFirst()
        let listed = min(order.count, maxSessions ?? order.count)
        var names = ExportNames(types: types.names)
        for (n, position) in order.enumerated() {
            if n == listed { out += #"],"sessionsBeyondMax":["#.utf8 }
            if n > 0 && n != listed { out.append(UInt8(ascii: ",")) }
            if !compact || !appendCompact(kept[position], to: &out, names: &names) {
                let (key, e) = entry(at: position)
                Self.appendJSON(e, key: key, to: &out)
            }
            if out.count >= piece {
                try write(out)
                out.removeAll(keepingCapacity: true)
            }
        }
        if maxSessions != nil && listed == order.count { out += #"],"sessionsBeyondMax":["#.utf8 }
        out += "]}".utf8
        try write(out)
    }

    /// Each app's and type's name as a JSON string, made once per export.
    private struct ExportNames {
        var types: [[UInt8]]
        /// By the name's bytes (Swift's `==` takes "é" and "e\u{301}" for one); nil for a name
        /// holding U+FFFD, whose session may need its digest written.
        var apps: [[UInt8]: [UInt8]?] = [:]

        init(types names: [String]) {
            types = names.map { name in
                var json: [UInt8] = []
                appendJSONString(name.utf8, to: &json)
                return json
            }
        }

        mutating func app(_ name: String) -> [UInt8]? {
            let bytes = Array(name.utf8)
            if let known = apps[bytes] { return known }
            var json: [UInt8]? = []
            if name.unicodeScalars.contains("\u{FFFD}") { json = nil } else { appendJSONString(name.utf8, to: &json!) }
            if apps.count < 4096 { apps[bytes] = json }
            return json
        }
    }

    /// Writes the session `k` as `append(_:key:to:)` writes its entry; false, having written
    /// nothing, when a field is spilled or its strings hold U+FFFD (then its digest may be due).
    private func appendCompact(_ k: Kept, to out: inout [UInt8], names: inout ExportNames) -> Bool {
        guard !k.counts.isSpilled, k.firstTime != .spilled, k.lastTime != .spilled, let app = names.app(k.app),
            k.session.withText({ !Self.holdsReplacementCharacter($0) }) == true
        else { return false }
        out += #"{"app":"#.utf8
        out += app
        out += #","counts":{"#.utf8
        var first = true
        k.counts.forEach { type, count in
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            out += names.types[Int(type)]
            out.append(UInt8(ascii: ":"))
            JSONBytes.appendDecimal(UInt64(count), to: &out)
        }
        out += #"},"firstSeq":"#.utf8
        JSONBytes.appendDecimal(k.firstSeq, to: &out)
        out += #","firstTime":"#.utf8
        _ = k.firstTime.withText { appendJSONString($0, to: &out) }
        out += #","lastSeq":"#.utf8
        JSONBytes.appendDecimal(k.lastSeq, to: &out)
        out += #","lastTime":"#.utf8
        _ = k.lastTime.withText { appendJSONString($0, to: &out) }
        out += #","session":"#.utf8
        _ = k.session.withText { appendJSONString($0, to: &out) }
        out.append(UInt8(ascii: "}"))
        return true
    }

    private static func holdsReplacementCharacter(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard bytes.count >= 3 else { return false }
        for i in 0..<bytes.count - 2 where bytes[i] == 0xEF && bytes[i + 1] == 0xBF && bytes[i + 2] == 0xBD {
            return true
        }
        return false
    }

    /// One session as exported, from its entry (its `digest` where its strings do not give
    /// `key`). `whenctl sessions --json` writes each session so too.
    package static func appendJSON(_ e: Entry, key: SessionDigest, to out: inout [UInt8]) {
        out += #"{"app":"#.utf8
        appendJSONString(e.app.utf8, to: &out)
        out += #","counts":{"#.utf8
        for (j, (type, count)) in e.counts.enumerated() {
            if j > 0 { out.append(UInt8(ascii: ",")) }
            appendJSONString(type.utf8, to: &out)
            out.append(UInt8(ascii: ":"))
            JSONBytes.appendDecimal(UInt64(count), to: &out)
        }
        out += "}".utf8
        // Only an id holding U+FFFD may be one its strings do not give.
        if e.app.unicodeScalars.contains("\u{FFFD}") || e.session.unicodeScalars.contains("\u{FFFD}"),
            SessionDigest(app: e.app, session: e.session) != key
        {
            out += #","digest":""#.utf8
            out += key.hex.utf8
            out += #"""#.utf8
        }
        out += #","firstSeq":"#.utf8
        JSONBytes.appendDecimal(e.firstSeq, to: &out)
        out += #","firstTime":"#.utf8
        appendJSONString(e.firstTime.utf8, to: &out)
        out += #","lastSeq":"#.utf8
        JSONBytes.appendDecimal(e.lastSeq, to: &out)
        out += #","lastTime":"#.utf8
        appendJSONString(e.lastTime.utf8, to: &out)
        out += #","session":"#.utf8
        appendJSONString(e.session.utf8, to: &out)
        out.append(UInt8(ascii: "}"))
    }
}

extension SessionDigest {
    /// 32 lower-case hex digits: the high word's, then the low word's.
    var hex: String {
        func digits(_ word: UInt64) -> String {
            let text = String(word, radix: 16)
            return String(repeating: "0", count: 16 - text.count) + text
        }
        return digits(high) + digits(low)
    }

    init?(hex: String) {
        let text = Array(hex.utf8)
        guard text.count == 32, let high = UInt64(hex.prefix(16), radix: 16),
            let low = UInt64(hex.suffix(16), radix: 16)
        else { return nil }
        self.init(low: low, high: high)
    }
}
