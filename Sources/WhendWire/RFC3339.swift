/// RFC 3339 `date-time` — `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T`/`Z` in either case or a
/// space for the `T` — the one parser whend's validation, the journal's readers, whenctl and
/// the plugins share. Allocates nothing: plugins read the time of every record they handle.
package enum RFC3339 {
    /// A point in time, to the nanosecond (digits past the ninth are ignored).
    package struct Instant: Sendable, Equatable {
        package var seconds: Int64
        package var nanoseconds: Int32

        package var microseconds: Int64 { seconds * 1_000_000 + Int64(nanoseconds / 1000) }
        package var secondsSince1970: Double { Double(seconds) + Double(nanoseconds) / 1e9 }
    }

    /// The instant `text` names, or nil if it is not an RFC 3339 date-time.
    package static func parse<C: RandomAccessCollection<UInt8>>(_ text: C) -> Instant? where C.Index == Int {
        let base = text.startIndex
        let count = text.count
        func byte(_ at: Int) -> UInt8 { text[base + at] }
        func digits(_ at: Int, _ n: Int) -> Int? {
            guard at + n <= count else { return nil }
            var x = 0
            for i in at..<(at + n) {
                let b = byte(i)
                guard b >= 0x30 && b <= 0x39 else { return nil }
                x = x * 10 + Int(b - 0x30)
            }
            return x
        }
        guard count >= 20, let year = digits(0, 4), byte(4) == 0x2D, let month = digits(5, 2), byte(7) == 0x2D,
            let day = digits(8, 2), byte(10) == UInt8(ascii: "T") || byte(10) == UInt8(ascii: "t") || byte(10) == 0x20,
            let hour = digits(11, 2), byte(13) == 0x3A, let minute = digits(14, 2), byte(16) == 0x3A,
            let second = digits(17, 2), (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60,
            second <= 60
        else { return nil }
        var i = 19
        var nanoseconds = 0
        if i < count, byte(i) == 0x2E {
            i += 1
            let start = i
            var scale = 100_000_000
            while i < count, byte(i) >= 0x30 && byte(i) <= 0x39 {
                nanoseconds += Int(byte(i) - 0x30) * scale
                scale /= 10
                i += 1
            }
            guard i > start else { return nil }
        }
        guard i < count else { return nil }
        var offset = 0
        if byte(i) == UInt8(ascii: "Z") || byte(i) == UInt8(ascii: "z") {
            guard i + 1 == count else { return nil }
        } else {
            guard byte(i) == 0x2B || byte(i) == 0x2D, count == i + 6, let oh = digits(i + 1, 2), byte(i + 3) == 0x3A,
                let om = digits(i + 4, 2), oh < 24, om < 60
            else { return nil }
            offset = (byte(i) == 0x2D ? -1 : 1) * (oh * 3600 + om * 60)
        }
        // Days from the civil date (Howard Hinnant's algorithm): no calendar, no time zone.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146097 + doe - 719468
        return Instant(
            seconds: Int64(days * 86400 + hour * 3600 + minute * 60 + second - offset),
            nanoseconds: Int32(nanoseconds))
    }
}

/// Whether `v` is an RFC 3339 date-time naming a day the calendar has (RFC 3339 §5.7: no
/// 30 February, no 29 February outside leap years), as ingest checks a client's `ts`.
///
/// Only ingest is this strict: `RFC3339.parse` still reads 2024-02-30 as 1 March, as it always
/// has, so that records stored before the check are read as they were and replays of old
/// journals derive what they derived.
package func isRFC3339<C: RandomAccessCollection<UInt8>>(_ v: C) -> Bool where C.Index == Int {
    guard RFC3339.parse(v) != nil else { return false }
    let base = v.startIndex
    func number(_ at: Int, _ n: Int) -> Int { (at..<(at + n)).reduce(0) { $0 * 10 + Int(v[base + $1] - 0x30) } }
    return number(8, 2) <= RFC3339.daysIn(month: number(5, 2), of: number(0, 4))
}

extension RFC3339 {
    /// The days of `month` (1–12) in `year` of the proleptic Gregorian calendar.
    package static func daysIn(month: Int, of year: Int) -> Int {
        switch month {
        case 2: return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }
}
