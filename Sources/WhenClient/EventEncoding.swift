import Foundation

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

    /// One event line: `type` first (easier to read in a journal), the other keys sorted.
    static func line(_ event: [String: Any]) throws -> [UInt8] {
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
        switch value {
        case let s as String: string(s, into: &out)
        // Values from JSONSerialization: their type code tells a bool from a number.
        case let n as NSNumber where type(of: value) is NSNumber.Type:
            switch String(cString: n.objCType) {
            case "c", "B": out += n.boolValue ? Array("true".utf8) : Array("false".utf8)
            case "f", "d": try encode(n.doubleValue, into: &out)
            default: out += Array(n.stringValue.utf8)
            }
        // Exact types first: a bridged NSNumber matches `as Bool` and `as Int` alike.
        case let b as Bool where type(of: value) == Bool.self: out += b ? Array("true".utf8) : Array("false".utf8)
        case let i as Int: out += Array(String(i).utf8)
        case let i as Int64: out += Array(String(i).utf8)
        case let i as Int32: out += Array(String(i).utf8)
        case let i as UInt: out += Array(String(i).utf8)
        case let i as UInt64: out += Array(String(i).utf8)
        case let d as Double:
            guard d.isFinite else { throw Unencodable(description: "\(d) has no JSON form") }
            out += Array((d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : "\(d)").utf8)
        case let f as Float: try encode(Double(f), into: &out)
        case let raw as RawJSON: out += raw.bytes

        case is NSNull: out += Array("null".utf8)
        case let object as [String: Any]:
            out.append(UInt8(ascii: "{"))
            var first = true
            for key in object.keys.sorted() { try member(key, object[key]!, into: &out, first: &first) }
            out.append(UInt8(ascii: "}"))
        case let array as [Any]:
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                try encode(element, into: &out)
            }
            out.append(UInt8(ascii: "]"))
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

    /// RFC 3339 in UTC with milliseconds, from the realtime clock (no formatter objects).
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ n: Int32, _ width: Int) -> String {
            let s = String(n)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2))."
            + "\(pad(Int32(now.tv_nsec / 1_000_000), 3))Z"
    }
}
