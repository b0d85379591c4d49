import Foundation
import WhendWire

/// The daemon-written fields of PROTOCOL.md §7 for one connection's sender.
package struct PeerCredentials: Sendable, Equatable {
    package var pid: Int32
    package var uid: UInt32
    package var gid: UInt32
    /// The sender's process name (`/proc/<pid>/comm`).
    package var comm: String

    package init(pid: Int32, uid: UInt32, gid: UInt32, comm: String) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.comm = comm
    }
}

/// The identity of an event for de-duplication: (`app`, `session`, `id`), kept as a 128-bit
/// digest rather than the strings themselves.
///
/// Each part is the string's contents as the journal stores them: in canonical form
/// (`appendCanonicalString`), escapes and all. So two spellings of one JSON string (`"A"`,
/// `"\u0041"`) are one part, and two strings the stored records tell apart are two, even where
/// decoding would not (a surrogate without its partner has no UTF-8 bytes: decoded, every one of
/// them is U+FFFD, and `"\ud800"`, `"\udfff"` and `"\ufffd"` would be one event).
///
/// The digest is SipHash-1-3 with a 128-bit output, under a key drawn at random per process,
/// over the length-prefixed parts: one pass (two 64-bit `Hasher`s cost twice the rounds, and
/// were a tenth of an event loop's samples). For distinct keys an accidental collision within a
/// window of 100,000 has a probability near 1e-29, and the random key keeps clients from
/// aiming for one. Sixteen bytes a key keep the window small (PROTOCOL.md §4), and
/// hashing straight from the line allocates nothing per event.
package struct DedupKey: Hashable, Sendable {
    package let low: UInt64
    package let high: UInt64

    /// - Parameters: the contents of the strings (between their quotes) in canonical form, as a
    ///   stored record holds them.
    package init(app: [UInt8], session: [UInt8]?, id: [UInt8]) {
        var builder = Builder()
        app.withUnsafeBufferPointer { builder.add($0) }
        (session ?? []).withUnsafeBufferPointer { builder.add($0) }
        id.withUnsafeBufferPointer { builder.add($0) }
        self = builder.finish(hasSession: session != nil)
    }

    init(low: UInt64, high: UInt64) {
        self.low = low
        self.high = high
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(low)
    }

    /// The SipHash key of this process's digests, drawn at random once: clients cannot aim for
    /// a collision, and digests are never kept across processes (the journal's window is
    /// rebuilt from the records at start-up).
    static let processKey: (UInt64, UInt64) = {
        var random = SystemRandomNumberGenerator()
        return (random.next(), random.next())
    }()

    /// Feeds the parts in order, each after its length; the same parts give the same key
    /// however they are stored.
    struct Builder {
        var hash = SipHash128(key: DedupKey.processKey)

        mutating func add(_ part: UnsafeBufferPointer<UInt8>) {
            withUnsafeBytes(of: UInt32(part.count).littleEndian) { hash.write($0) }
            hash.write(UnsafeRawBufferPointer(part))
        }

        /// Feeds the contents of a validated JSON string (between its quotes, as written) in
        /// canonical form: as they are when they hold no escape, which is then the canonical
        /// form already.
        mutating func add(string raw: UnsafeBufferPointer<UInt8>, escaped: Bool) {
            guard escaped else { return add(raw) }
            var canonical: [UInt8] = []
            canonical.reserveCapacity(raw.count + 2)
            appendCanonicalString(raw, to: &canonical)
            canonical.withUnsafeBufferPointer { add(UnsafeBufferPointer(rebasing: $0.dropFirst().dropLast())) }
        }

        func finish(hasSession: Bool) -> DedupKey {
            var last = hash
            withUnsafeBytes(of: hasSession ? UInt8(1) : UInt8(0)) { last.write($0) }
            let (low, high) = last.finalize()
            return DedupKey(low: low, high: high)
        }
    }
}

/// Turns validated events of one connection into stored records (PROTOCOL.md §7).
///
/// A record is written as a *body*: everything after `{"_seq":N,`, which the journal writer
/// prepends once it has given the record its place. The body holds the event's fields as they
/// came, in canonical form (`appendCanonicalJSON`: without whitespace, escapes written one way;
/// the `when` Codable form rewritten to `name` + `params`), the hello's defaults, and the
/// trusted fields, in that order.
package struct RecordEncoder: Sendable {
    package private(set) var hello: Hello
    let credentials: PeerCredentials
    /// `,"_pid":…,"_uid":…,"_gid":…,"_comm":"…"}`: the same for every record of the connection.
    let trustedSuffix: [UInt8]
    let helloAppField: [UInt8]?
    let helloSessionField: [UInt8]?
    let commAppField: [UInt8]
    /// The `app` an event without its own gets, as bytes (computed once).
    let defaultAppBytes: [UInt8]
    /// The contents of the `app` and `session` strings an event without its own is stored with,
    /// escaped as stored: what its de-duplication key is made of.
    let defaultAppKeyPart: [UInt8]
    let defaultSessionKeyPart: [UInt8]
    var clock = RFC3339Clock()
    /// `,"_rt":"…"`: the time of the read being encoded, set by `stampReceived()`.
    var receivedField: [UInt8] = []

    package init(credentials: PeerCredentials, hello: Hello = Hello()) {
        self.credentials = credentials
        self.hello = hello
        var suffix: [UInt8] = []
        suffix.append(
            contentsOf: Array(
                ",\"_pid\":\(credentials.pid),\"_uid\":\(credentials.uid),\"_gid\":\(credentials.gid),\"_comm\":".utf8))
        appendJSONString(credentials.comm.utf8, to: &suffix)
        suffix.append(UInt8(ascii: "}"))
        self.trustedSuffix = suffix
        func field(_ name: String, _ value: [UInt8]?, stored: [UInt8]? = nil) -> [UInt8]? {
            guard let value else { return nil }
            var out = Array(",\"\(name)\":".utf8)
            if let stored { out += stored } else { appendJSONString(value, to: &out) }
            return out
        }
        // The hello's as stored from its line, as an event's own app and session are.
        self.helloAppField = field("app", hello.app, stored: hello.storedApp)
        self.helloSessionField = field("session", hello.session, stored: hello.storedSession)
        // The process name can be empty in theory; an empty app is not an app.
        self.commAppField = field(
            "app", credentials.comm.isEmpty ? Array("unknown".utf8) : Array(credentials.comm.utf8))!
        self.defaultAppBytes =
            hello.app ?? (credentials.comm.isEmpty ? Array("unknown".utf8) : Array(credentials.comm.utf8))
        // `,"app":"` … `"`
        let appField = helloAppField ?? commAppField
        self.defaultAppKeyPart = Array(appField[8..<(appField.count - 1)])
        // `,"session":"` … `"`
        self.defaultSessionKeyPart = helloSessionField.map { Array($0[12..<($0.count - 1)]) } ?? []
    }

    /// The encoder for the rest of the connection once a hello has arrived.
    package func with(hello: Hello) -> RecordEncoder {
        RecordEncoder(credentials: credentials, hello: hello)
    }

    /// The `app` an event without its own gets: the hello's, else the sender's process name.
    package var defaultApp: [UInt8] { defaultAppBytes }

    /// Takes the current time as `_rt` for the records encoded next: the daemon stamps once per
    /// read, since everything in one read arrived at the same moment.
    /// - Returns: that time in microseconds since 1970.
    @discardableResult
    package mutating func stampReceived() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        receivedField.removeAll(keepingCapacity: true)
        receivedField.append(contentsOf: Self.receivedKey)
        clock.append(seconds: Int(ts.tv_sec), micros: Int(ts.tv_nsec) / 1000, to: &receivedField)
        receivedField.append(UInt8(ascii: "\""))
        return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
    }

    static let receivedKey: [UInt8] = Array(",\"_rt\":\"".utf8)
    static let nameKey: [UInt8] = Array("\"name\":\"".utf8)
    static let paramsKey: [UInt8] = Array("\",\"params\":".utf8)
    static let emptyParams: [UInt8] = Array(",\"params\":{}".utf8)

    /// Appends the record body for `event` (scanned from `line`) to `out`, stamped with the
    /// time of the last `stampReceived()`.
    ///
    /// - Returns: the de-duplication key when the event carries an `id`.
    package mutating func appendBody(
        of event: ScannedEvent, line: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]
    ) -> DedupKey? {
        if receivedField.isEmpty { stampReceived() }
        var first = true
        for (i, m) in event.members.enumerated() {
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            if let w = event.codableWhen, w.member == i {
                out.append(contentsOf: Self.nameKey)
                out.append(contentsOf: UnsafeBufferPointer(rebasing: line[w.name]))
                out.append(contentsOf: Self.paramsKey)
                let params = UnsafeBufferPointer(rebasing: line[w.params])
                if m.canonical { out.append(contentsOf: params) } else { appendCanonicalJSON(params, to: &out) }
            } else if m.canonical {
                // Key and value as they came: already the stored form.
                out.append(
                    contentsOf: UnsafeBufferPointer(rebasing: line[m.keyRange.lowerBound..<m.valueRange.upperBound]))
            } else {
                // Spaces or escapes written otherwise: stored canonical, so that a plugin or a
                // reader matching `"app":"x"` cannot be escaped by `"app": "x"` or `"\u0078"`.
                appendCanonicalJSON(UnsafeBufferPointer(rebasing: line[m.keyRange]), to: &out)
                out.append(UInt8(ascii: ":"))
                appendCanonicalJSON(UnsafeBufferPointer(rebasing: line[m.valueRange]), to: &out)
            }
        }
        if event.needsEmptyParams { out.append(contentsOf: Self.emptyParams) }
        if !event.hasApp { out.append(contentsOf: helloAppField ?? commAppField) }
        if !event.hasSession, let s = helloSessionField { out.append(contentsOf: s) }
        out.append(contentsOf: receivedField)
        out.append(contentsOf: trustedSuffix)
        guard let id = event.id else { return nil }
        // The key is hashed straight from the line where the values are not escaped; escaped
        // ones in the form they are stored in, so that a key rebuilt from the journal at start-up
        // is the same.
        var builder = DedupKey.Builder()
        func add(_ value: StringValue) {
            builder.add(string: UnsafeBufferPointer(rebasing: line[value.contents]), escaped: value.escaped)
        }
        if let app = event.app { add(app) } else { defaultAppKeyPart.withUnsafeBufferPointer { builder.add($0) } }
        if let session = event.session {
            add(session)
        } else {
            defaultSessionKeyPart.withUnsafeBufferPointer { builder.add($0) }
        }
        add(id)
        return builder.finish(hasSession: event.session != nil || hello.session != nil)
    }
}

/// Formats the wall clock as RFC 3339 UTC with microseconds, e.g. `2026-11-21T13:35:00.123456Z`.
///
/// The date part is computed once a second; the rest is digit arithmetic.
package struct RFC3339Clock: Sendable {
    var cachedSecond: Int = -1
    var cachedPrefix: [UInt8] = []

    package init() {}

    package mutating func appendNow(to out: inout [UInt8]) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        append(seconds: Int(ts.tv_sec), micros: Int(ts.tv_nsec) / 1000, to: &out)
    }

    package mutating func append(seconds: Int, micros: Int, to out: inout [UInt8]) {
        if seconds != cachedSecond {
            var t = time_t(seconds)
            var parts = tm()
            gmtime_r(&t, &parts)
            cachedPrefix = Array(
                String(
                    format: "%04d-%02d-%02dT%02d:%02d:%02d.", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                    Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec)
                ).utf8
            )
            cachedSecond = seconds
        }
        out.append(contentsOf: cachedPrefix)
        var divisor = 100_000
        var rest = micros
        while divisor > 0 {
            out.append(UInt8(0x30 + rest / divisor))
            rest %= divisor
            divisor /= 10
        }
        out.append(UInt8(ascii: "Z"))
    }
}
