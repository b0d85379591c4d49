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
    struct Snapshot: Decodable {
        var indexedThrough: UInt64
        var maxSessions: Int?
        var sessions: [Exported]
        var sessionsBeyondMax: [Exported]?
    }

    /// One session as exported, and its digest.
    struct Exported: Decodable {
        var entry: Entry
        var key: SessionDigest

        private enum Keys: String, CodingKey { case digest }

        init(from decoder: any Decoder) throws {
            entry = try Entry(from: decoder)
            let digest = try decoder.container(keyedBy: Keys.self).decodeIfPresent(String.self, forKey: .digest)
            key = digest.flatMap(SessionDigest.init(hex:)) ?? SessionDigest(app: entry.app, session: entry.session)
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
                Self.append(e, key: key, to: &out)
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

    /// One session as exported, from its entry.
    private static func append(_ e: Entry, key: SessionDigest, to out: inout [UInt8]) {
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
