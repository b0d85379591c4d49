/// Seconds since 1970 of `2026-11-21T13:44:59.546458Z` or with an offset; nil if malformed.
/// Allocates nothing: plugins read the time of every record they handle.
public func rfc3339Seconds(_ b: UnsafeBufferPointer<UInt8>) -> Double? {
    guard b.count >= 20, b[4] == 0x2D, b[7] == 0x2D, b[10] == 0x54 || b[10] == 0x74, b[13] == 0x3A, b[16] == 0x3A
    else { return nil }
    func number(_ range: Range<Int>) -> Int? {
        var n = 0
        for i in range {
            guard (0x30...0x39).contains(b[i]) else { return nil }
            n = n * 10 + Int(b[i] - 0x30)
        }
        return n
    }
    guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10),
        let hour = number(11..<13), let minute = number(14..<16), let second = number(17..<19),
        (1...12).contains(month), (1...31).contains(day)
    else { return nil }
    var i = 19
    var fraction = 0.0
    if i < b.count, b[i] == 0x2E {
        var scale = 0.1
        i += 1
        while i < b.count, (0x30...0x39).contains(b[i]) {
            fraction += Double(b[i] - 0x30) * scale
            scale /= 10
            i += 1
        }
    }
    var offset = 0
    if i < b.count, b[i] == 0x2B || b[i] == 0x2D, i + 6 <= b.count, let h = number((i + 1)..<(i + 3)),
        let m = number((i + 4)..<(i + 6))
    {
        offset = (b[i] == 0x2D ? -1 : 1) * (h * 3600 + m * 60)
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = month <= 2 ? year - 1 : year
    let era = (y >= 0 ? y : y - 399) / 400
    let yoe = y - era * 400
    let mp = (month + 9) % 12
    let doy = (153 * mp + 2) / 5 + day - 1
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
    let days = era * 146097 + doe - 719468
    return Double(days * 86400 + hour * 3600 + minute * 60 + second - offset) + fraction
}
