import Foundation
import PropertyBased
import SeededRandom
import Testing
import WhendWire

/// A client's `ts` names a day the calendar has: ingest agrees with Foundation's Gregorian
/// calendar, an implementation of its own, on every date it is given.
@Suite struct TimestampCalendarTests {
    static let gregorian: Calendar = {
        var c = Calendar(identifier: .gregorian)
        c.timeZone = TimeZone(identifier: "UTC")!
        return c
    }()

    /// Whether the event scanner accepts an event with this date in its `ts`, and whether
    /// Foundation's calendar has the day.
    static func verdicts(year: Int, month: Int, day: Int) -> (scanner: Bool, calendar: Bool) {
        let ts = String(format: "%04d-%02d-%02dT23:59:59.5+01:00", year, month, day)
        let accepted = code(#"{"type":"when","name":"opens","ts":"\#(ts)"}"#) == nil
        let known = DateComponents(calendar: gregorian, year: year, month: month, day: day).isValidDate(in: gregorian)
        return (accepted, known)
    }

    /// New seeds each run (PropertyBased reports the failing one): years 1–9999, days 1–31.
    @Test func anyDateIsAcceptedExactlyWhenTheCalendarHasIt() async {
        await propertyCheck(count: 3000, input: Gen.uint64()) { seed in
            var rng = SplitMix64(state: seed)
            let year = rng.int(9999) + 1
            let month = rng.int(12) + 1
            let day = rng.int(31) + 1
            let v = Self.verdicts(year: year, month: month, day: day)
            #expect(v.scanner == v.calendar, "\(year)-\(month)-\(day): scanner \(v.scanner), calendar \(v.calendar)")
        }
    }

    /// The ends of every month of the years where leap rules differ (the 100th and 400th).
    @Test func theLastDaysOfEveryMonthInTheYearsLeapRulesSplit() {
        for year in [1900, 2000, 2023, 2024, 2100, 2400] {
            for month in 1...12 {
                for day in 28...31 {
                    let v = Self.verdicts(year: year, month: month, day: day)
                    #expect(v.scanner == v.calendar, "\(year)-\(month)-\(day): scanner \(v.scanner)")
                }
            }
        }
        #expect(code(#"{"type":"when","name":"opens","ts":"2024-02-30T00:00:00Z"}"#) == .invalidField)
    }

    /// Readers are not stricter than before: a record stored before the check reads as it did.
    @Test func storedImpossibleDatesStillRead() {
        #expect(RFC3339.parse(Array("2024-02-30T00:00:00Z".utf8)) == RFC3339.parse(Array("2024-03-01T00:00:00Z".utf8)))
    }
}
