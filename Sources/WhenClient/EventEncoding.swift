import Foundation
import Synchronization

/// JSON text that is already encoded (a `Codable` value's form), spliced into an event as is.
public struct RawJSON: Sendable, Equatable {
    public let bytes: [UInt8]
    public init(_ bytes: [UInt8]) { self.bytes = bytes }
}

/// Encodes an event (`[String: Any]` of strings, numbers, bools, arrays, objects, `RawJSON`
/// and `NSNull`) as one line, on the caller's thread and without Foundation's serialiser:
/// `emit` must cost the app little and the same every time.
enum EventEncoding {
    struct Unencodable: Error, CustomStringConvertible {
        var description: String
    }

    /// One event line: `type` first (easier to read in a journal), the other keys sorted, then
    /// the `extra` string members the event does not have itself. (Extra members are written
    /// rather than added to the dictionary: that would copy the caller's dictionary.)
    static func line(_ event: [String: Any], extra: KeyValuePairs<String, String?> = [:]) throws -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        out.append(UInt8(ascii: "{"))
        var first = true
        if let type = event["type"] {
            try member("type", type, into: &out, first: &first)
        }
        for key in event.keys.sorted() where key != "type" {
            try member(key, event[key]!, into: &out, first: &first)
        }
        for (key, value) in extra where event[key] == nil {
            if let value { try member(key, value, into: &out, first: &first) }
        }
        out.append(UInt8(ascii: "}"))
        out.append(0x0A)
        return out
    }

    private static func member(_ key: String, _ value: Any, into out: inout [UInt8], first: inout Bool) throws {
        if !first { out.append(UInt8(ascii: ",")) }
        first = false
        string(key, into: &out)
        out.append(UInt8(ascii: ":"))
        try encode(value, into: &out)
    }

    static func encode(_ value: Any, into out: inout [UInt8]) throws {
        // Classes are told by their metatype first: a value cast to a class is bridged (a whole
        // dictionary turned into an NSDictionary), and an NSNumber would match `as Int` and
        // `as Bool` alike.
        let valueType = type(of: value)
        if valueType is NSNumber.Type, let n = value as? NSNumber {
            // Values from JSONSerialization: their type code tells a bool from a number.
            switch String(cString: n.objCType) {
            case "c", "B": out += n.boolValue ? Array("true".utf8) : Array("false".utf8)
            case "f", "d": try encode(n.doubleValue, into: &out)
            default: out += Array(n.stringValue.utf8)
            }
            return
        }
        if valueType is NSNull.Type {
            out += Array("null".utf8)
            return
        }
        switch value {
        case let s as String: string(s, into: &out)
        case let i as Int: out += Array(String(i).utf8)
        case let object as [String: Any]:
            out.append(UInt8(ascii: "{"))
            var first = true
            for key in object.keys.sorted() { try member(key, object[key]!, into: &out, first: &first) }
            out.append(UInt8(ascii: "}"))
        case let b as Bool: out += b ? Array("true".utf8) : Array("false".utf8)
        case let d as Double:
            guard d.isFinite else { throw Unencodable(description: "\(d) has no JSON form") }
            out += Array((d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : "\(d)").utf8)
        case let array as [Any]:
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                try encode(element, into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case let raw as RawJSON: out += raw.bytes
        case let i as Int64: out += Array(String(i).utf8)
        case let i as Int32: out += Array(String(i).utf8)
        case let i as UInt: out += Array(String(i).utf8)
        case let i as UInt64: out += Array(String(i).utf8)
        case let f as Float: try encode(Double(f), into: &out)
        default:
            throw Unencodable(description: "a value of type \(type(of: value)) has no JSON form")
        }
    }

    static func string(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += [0x5C, 0x22]
            case UInt8(ascii: "\\"): out += [0x5C, 0x5C]
            case 0x0A: out += [0x5C, UInt8(ascii: "n")]
            case 0x0D: out += [0x5C, UInt8(ascii: "r")]
            case 0x09: out += [0x5C, UInt8(ascii: "t")]
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out += [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 15)]]
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// RFC 3339 in UTC with milliseconds, from the realtime clock; the part up to the seconds
    /// is formatted once a second.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let prefix = secondsPrefix.withLock { cache -> [UInt8] in
            if cache.second != now.tv_sec {
                cache = (now.tv_sec, formatSeconds(now.tv_sec))
            }
            return cache.text
        }
        let millis = Int(now.tv_nsec / 1_000_000)
        return String(unsafeUninitializedCapacity: prefix.count + 5) { buffer in
            var i = 0
            for byte in prefix {
                buffer[i] = byte
                i += 1
            }
            buffer[i] = UInt8(ascii: ".")
            buffer[i + 1] = UInt8(48 + millis / 100)
            buffer[i + 2] = UInt8(48 + millis / 10 % 10)
            buffer[i + 3] = UInt8(48 + millis % 10)
            buffer[i + 4] = UInt8(ascii: "Z")
            return i + 5
        }
    }

    private static let secondsPrefix = Mutex<(second: Int, text: [UInt8])>((-1, []))

    private static func formatSeconds(_ second: Int) -> [UInt8] {
        var seconds = time_t(second)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func digits(_ n: Int32, _ width: Int) -> [UInt8] {
            var out = [UInt8](repeating: 48, count: width)
            var n = Int(n)
            for i in stride(from: width - 1, through: 0, by: -1) {
                out[i] = UInt8(48 + n % 10)
                n /= 10
            }
            return out
        }
        let dash = UInt8(ascii: "-")
        let colon = UInt8(ascii: ":")
        return digits(parts.tm_year + 1900, 4) + [dash] + digits(parts.tm_mon + 1, 2) + [dash]
            + digits(parts.tm_mday, 2) + [UInt8(ascii: "T")] + digits(parts.tm_hour, 2) + [colon]
            + digits(parts.tm_min, 2) + [colon] + digits(parts.tm_sec, 2)
    }
}
