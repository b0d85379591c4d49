import Foundation
import WhendWire

/// The fields whend and the seeds give records, found in one pass over the record's top level.
public enum RecordField: Int, CaseIterable, Sendable {
    case seq, receivedAt, origin, cause, pipeline
    case type, app, session, user, id, ts
    case screen, name, status, action, previous, params, message, stack, fatal
    case isBeingPresentedInitially, isBeingRemovedIndefinitely

    /// Whether whend sets it (its key begins with `_`).
    var isTrusted: Bool {
        switch self {
        case .seq, .receivedAt, .origin, .cause, .pipeline: return true
        default: return false
        }
    }

    /// The key as stored.
    public var key: StaticString {
        switch self {
        case .seq: return "_seq"
        case .receivedAt: return "_rt"
        case .origin: return "_origin"
        case .cause: return "_cause"
        case .pipeline: return "_pipeline"
        case .type: return "type"
        case .app: return "app"
        case .session: return "session"
        case .user: return "user"
        case .id: return "id"
        case .ts: return "ts"
        case .screen: return "screen"
        case .name: return "name"
        case .status: return "status"
        case .action: return "action"
        case .previous: return "previous"
        case .params: return "params"
        case .message: return "message"
        case .stack: return "stack"
        case .fatal: return "fatal"
        case .isBeingPresentedInitially: return "isBeingPresentedInitially"
        case .isBeingRemovedIndefinitely: return "isBeingRemovedIndefinitely"
        }
    }

    /// The field a key names, if it is one of these. A switch on the length, then one
    /// comparison or two: this runs for every key of every record, and allocates nothing.
    static func named(_ key: UnsafeBufferPointer<UInt8>) -> RecordField? {
        @inline(__always) func check(_ field: RecordField) -> RecordField? {
            let k = field.key
            return JSONBytes.equal(key, UnsafeBufferPointer(start: k.utf8Start, count: k.utf8CodeUnitCount))
                ? field : nil
        }
        guard let first = key.first else { return nil }
        switch key.count {
        case 2: return first == UInt8(ascii: "i") ? check(.id) : check(.ts)
        case 3: return first == UInt8(ascii: "a") ? check(.app) : check(.receivedAt)
        case 4:
            switch first {
            case UInt8(ascii: "_"): return check(.seq)
            case UInt8(ascii: "t"): return check(.type)
            case UInt8(ascii: "u"): return check(.user)
            default: return check(.name)
            }
        case 5: return first == UInt8(ascii: "s") ? check(.stack) : check(.fatal)
        case 6:
            switch first {
            case UInt8(ascii: "s"): return key[1] == UInt8(ascii: "c") ? check(.screen) : check(.status)
            case UInt8(ascii: "a"): return check(.action)
            case UInt8(ascii: "p"): return check(.params)
            default: return check(.cause)
            }
        case 7:
            switch first {
            case UInt8(ascii: "s"): return check(.session)
            case UInt8(ascii: "m"): return check(.message)
            default: return check(.origin)
            }
        case 8: return check(.previous)
        case 9: return check(.pipeline)
        case 25: return check(.isBeingPresentedInitially)
        case 26: return check(.isBeingRemovedIndefinitely)
        default: return nil
        }
    }
}

/// Where each `RecordField` is in one record: (start, end) of its value, found as far as they
/// are asked for. A record a plugin tells apart by its `type` (the first field whend stores
/// after `_seq`) is scanned no further than that.
struct RecordFieldIndex {
    private var spans: InlineArray<22, (Int32, Int32)> = .init(repeating: (0, 0))
    /// Where the scan goes on (just past a member's comma), once started.
    private var position = 0
    private var started = false
    private var finished = false
    /// The first trusted key after `_seq`, once the scan has passed it: whend stores a record's
    /// trusted fields after the app's, and `_origin` first among them in a derived record.
    private var firstTrusted: RecordField?
    private var passedTrusted = false

    /// Nothing scanned yet: fields are found when asked for.
    init() {}

    /// Every field found at once (for a record a plugin makes itself).
    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        _ = find(nil, in: bytes)
    }

    /// Forgets the last record: the next lookups scan the next one.
    mutating func reset() {
        spans = .init(repeating: (0, 0))
        position = 0
        started = false
        finished = false
        firstTrusted = nil
        passedTrusted = false
    }

    /// Whether the record carries `_origin`, read from whend's layout: the scan stops at the
    /// first trusted key after `_seq` (the app's own keys never begin with `_`), which is
    /// `_origin` exactly when a plugin derived the record.
    mutating func isDerived(in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        if let known = derivedByLayoutTail(bytes) { return known }
        while !passedTrusted && !finished { _ = scan(nil, in: bytes, stopAtTrusted: true) }
        return passedTrusted ? firstTrusted == .origin : stored(.origin) != nil
    }

    /// Where `field`'s value is, scanning on from where the last lookup stopped; with `nil`,
    /// scans to the end. The first occurrence of a key wins, as whend's own scanner reads a
    /// record; a key spelled with `\u` escapes is the same field as its plain spelling.
    ///
    /// With `storedLayout` (a record as whend stores it, whose trusted members come after all of
    /// the app's), an app's field not found before the first trusted key is not there: the scan
    /// stops at that key rather than crossing whend's members to the end.
    mutating func find(_ wanted: RecordField?, in bytes: UnsafeBufferPointer<UInt8>, storedLayout: Bool = false)
        -> Range<Int>?
    {
        if let wanted, let known = stored(wanted) { return known }
        guard storedLayout, let wanted, !wanted.isTrusted else {
            return scan(wanted, in: bytes, stopAtTrusted: false)
        }
        if passedTrusted { return nil }
        return scan(wanted, in: bytes, stopAtTrusted: true)
    }

    private mutating func scan(_ wanted: RecordField?, in bytes: UnsafeBufferPointer<UInt8>, stopAtTrusted: Bool)
        -> Range<Int>?
    {
        guard !finished else { return nil }
        var found: Range<Int>?
        let resume = forEachMember(of: bytes, from: started ? position : nil) { key, escaped, value in
            let field: RecordField?
            let decoded = escaped ? decodeJSONString(key) : nil
            if let decoded {
                field = decoded.withUnsafeBufferPointer { RecordField.named($0) }
            } else {
                field = RecordField.named(key)
            }
            let trusted = (decoded?.first ?? key.first) == UInt8(ascii: "_") && field != .seq
            var stop = false
            if trusted && !passedTrusted {
                passedTrusted = true
                firstTrusted = field
                stop = stopAtTrusted
            }
            guard let field, spans[field.rawValue].1 == 0 else { return !stop }
            spans[field.rawValue] = (Int32(value.lowerBound), Int32(value.upperBound))
            guard field == wanted else { return !stop }
            found = value
            return false
        }
        started = true
        if let resume { position = resume } else { finished = true }
        return found
    }

    func stored(_ field: RecordField) -> Range<Int>? {
        let (start, end) = spans[field.rawValue]
        return end > start ? Int(start)..<Int(end) : nil
    }
}

/// Calls `body` with each top-level member of the JSON object in `bytes`: the key's raw
/// contents, whether it has escapes, and the value's range; stops when `body` returns false,
/// and then returns where to go on (`from:` a later call), else nil once the object is done.
/// Not a validator: whend validated stored records, and for anything else this is a safe best
/// effort (`PluginRecord.object()` still reports what is wrong). Allocates nothing.
@discardableResult
func forEachMember(
    of bytes: UnsafeBufferPointer<UInt8>, from position: Int? = nil,
    _ body: (_ key: UnsafeBufferPointer<UInt8>, _ escaped: Bool, _ value: Range<Int>) -> Bool
) -> Int? {
    var i = position ?? 0
    let n = bytes.count
    func skipSpace() {
        while i < n, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }
    /// Past a string whose opening quote is at i; returns whether it had escapes.
    func skipString() -> Bool {
        i += 1
        guard let base = bytes.baseAddress else { return false }
        // Sixteen bytes at a time to the next quote or backslash: most of a record is strings.
        let (quote, escaped) = stringEnd(base, from: i, n)
        i = quote < n ? quote + 1 : quote
        return escaped
    }
    func skipValue() {
        guard i < n else { return }
        switch bytes[i] {
        case UInt8(ascii: "\""): _ = skipString()
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0
            while i < n {
                switch bytes[i] {
                case UInt8(ascii: "\""):
                    _ = skipString()
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 {
                        i += 1
                        return
                    }
                default: break
                }
                i += 1
            }
        default:
            while i < n, bytes[i] != UInt8(ascii: ","), bytes[i] != UInt8(ascii: "}"), bytes[i] > 0x20 { i += 1 }
        }
    }
    if position == nil {
        skipSpace()
        guard i < n, bytes[i] == UInt8(ascii: "{") else { return nil }
        i += 1
    }
    while i < n {
        skipSpace()
        guard i < n, bytes[i] == UInt8(ascii: "\"") else { return nil }
        let keyStart = i + 1
        let escaped = skipString()
        let keyEnd = min(i - 1, n)
        guard keyEnd >= keyStart else { return nil }
        skipSpace()
        guard i < n, bytes[i] == UInt8(ascii: ":") else { return nil }
        i += 1
        skipSpace()
        let valueStart = i
        skipValue()
        let valueEnd = min(i, n)
        guard valueEnd > valueStart else { return nil }
        // Only a member that is whole: followed by `,` or `}` (a cut record ends early).
        skipSpace()
        guard i < n, bytes[i] == UInt8(ascii: ",") || bytes[i] == UInt8(ascii: "}") else { return nil }
        let more = bytes[i] == UInt8(ascii: ",")
        if more { i += 1 }
        guard body(UnsafeBufferPointer(rebasing: bytes[keyStart..<keyEnd]), escaped, valueStart..<valueEnd) else {
            return more ? i : nil
        }
        guard more else { return nil }
    }
    return nil
}

extension JSONObjectWriter {
    /// The cause's `session`, unless it has none (or an empty one).
    public mutating func session(_ cause: PluginRecord) {
        if let session = cause[.session], session.stringContents?.isEmpty == false { value("session", session) }
    }
}

/// Whether a record as whend stores it was derived, read from its last bytes: whend writes the
/// trusted fields last, and a derived record ends `,"_cause":N,"_rt":"T"}` where an app's ends
/// `,"_comm":"C"}` or `,"_gid":N}`. These tails are the record's top level (the last members
/// before the closing brace, and a quote after a comma is never inside a string), so they are
/// read in a few dozen bytes instead of a scan of the whole record; `nil` for any other end.
func derivedByLayoutTail(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool? {
    var end = bytes.count
    while end > 0, bytes[end - 1] == 0x0A || bytes[end - 1] == 0x20 { end -= 1 }
    guard end > 2, bytes[end - 1] == UInt8(ascii: "}") else { return nil }
    end -= 1
    /// Where `literal` ends if the bytes just before `position` are it.
    func precededBy(_ literal: StaticString, at position: Int) -> Int? {
        let count = literal.utf8CodeUnitCount
        guard position >= count else { return nil }
        for i in 0..<count where bytes[position - count + i] != literal.utf8Start[i] { return nil }
        return position - count
    }
    func digitsBefore(_ position: Int) -> Int? {
        var p = position
        while p > 0, bytes[p - 1] >= UInt8(ascii: "0"), bytes[p - 1] <= UInt8(ascii: "9") { p -= 1 }
        return p < position ? p : nil
    }
    if let start = digitsBefore(end) {
        return precededBy(",\"_gid\":", at: start) != nil ? false : nil
    }
    guard bytes[end - 1] == UInt8(ascii: "\"") else { return nil }
    // `_rt`: a timestamp, no quote or backslash inside.
    var open = end - 2
    while open >= 0, bytes[open] != UInt8(ascii: "\""), bytes[open] != UInt8(ascii: "\\"), end - open < 48 { open -= 1 }
    if open >= 0, bytes[open] == UInt8(ascii: "\""), let key = precededBy(",\"_rt\":\"", at: open + 1) {
        guard let digits = digitsBefore(key), precededBy(",\"_cause\":", at: digits) != nil else { return nil }
        return true
    }
    // `_comm`: a process name (15 bytes at most, each escaped in six at most).
    var candidate = end - 1
    while candidate > 0, end - candidate < 128 {
        candidate -= 1
        guard bytes[candidate] == UInt8(ascii: "\""), precededBy(",\"_comm\":\"", at: candidate + 1) != nil else {
            continue
        }
        // The string that opens here must close exactly at the end.
        var p = candidate + 1
        while p < end, bytes[p] != UInt8(ascii: "\"") { p += bytes[p] == UInt8(ascii: "\\") ? 2 : 1 }
        return p == end - 1 ? false : nil
    }
    return nil
}
