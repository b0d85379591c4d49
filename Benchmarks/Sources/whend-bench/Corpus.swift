import BenchSupport
import Foundation
import SeededRandom

/// Generates event lines as app sessions produce them: the seeds' three journeys (a Marvel
/// characters browser, an email change, a GP onboarding), with navigation, lifecycle, `when`,
/// screen and error events, each with app, session, id, ts and user.
struct CorpusGenerator {
    var rng = SplitMix64(state: 20_261_121)
    var clockMicros: Int64 = 1_795_000_000_000_000
    var sessionCount = 0

    struct Session {
        var app: String
        var id: String
        var user: String
        var lines: [String] = []
    }

    mutating func hex(_ n: Int) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(n)
        for _ in 0..<n { bytes.append(digits[Int(rng.next() & 15)]) }
        return String(decoding: bytes, as: UTF8.self)
    }

    mutating func timestamp() -> String {
        clockMicros += Int64(rng.next() % 900_000) + 50_000
        let seconds = clockMicros / 1_000_000
        let millis = (clockMicros % 1_000_000) / 1000
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), Int(millis))
    }

    mutating func emit(_ s: inout Session, _ body: String) {
        let line =
            #"{"type":\#(body),"app":"\#(s.app)","session":"\#(s.id)","id":"\#(hex(16))","ts":"\#(timestamp())","user":"\#(s.user)"}"#
        s.lines.append(line)
    }

    mutating func appear(_ s: inout Session, _ screen: String, initially: Bool) {
        let flag = initially ? #","isBeingPresentedInitially":true"# : ""
        emit(&s, #""lifecycle","screen":"\#(screen)","status":"willAppear"\#(flag)"#)
        emit(&s, #""lifecycle","screen":"\#(screen)","status":"didAppear"\#(flag)"#)
    }

    mutating func disappear(_ s: inout Session, _ screen: String, removed: Bool) {
        let flag = removed ? #","isBeingRemovedIndefinitely":true"# : ""
        emit(&s, #""lifecycle","screen":"\#(screen)","status":"willDisappear"\#(flag)"#)
        emit(&s, #""lifecycle","screen":"\#(screen)","status":"didDisappear"\#(flag)"#)
    }

    mutating func marvel(_ s: inout Session) {
        emit(&s, #""navigation","action":"root","screen":"CharacterList""#)
        appear(&s, "CharacterList", initially: true)
        emit(&s, #""screen","name":"CharacterList""#)
        for _ in 0..<(1 + Int(rng.next() % 3)) {
            emit(&s, #""when","name":"userScrollsCharacterList","params":{"offset":\#(rng.next() % 400)}"#)
            let id = 1_009_000 + rng.next() % 1000
            emit(&s, #""when","name":"userTapsCharacter","params":{"characterId":\#(id)}"#)
            emit(&s, #""navigation","action":"push","screen":"CharacterDetail","params":{"characterId":\#(id)}"#)
            disappear(&s, "CharacterList", removed: false)
            appear(&s, "CharacterDetail", initially: true)
            if rng.next() % 2 == 0 {
                emit(&s, #""when","name":"userTapsFavourite","params":{"characterId":\#(id),"on":true}"#)
            }
            if rng.next() % 25 == 0 {
                emit(
                    &s,
                    #""error","message":"comics request failed: HTTP 503","name":"loadComics","screen":"CharacterDetail","stack":["CharacterDetailViewModel.loadComics()","APIClient.get(_:)"]"#
                )
            }
            emit(&s, #""navigation","action":"pop""#)
            disappear(&s, "CharacterDetail", removed: true)
            appear(&s, "CharacterList", initially: false)
        }
    }

    mutating func emailChange(_ s: inout Session) {
        emit(&s, #""navigation","action":"present","screen":"ChangeEmail""#)
        appear(&s, "ChangeEmail", initially: true)
        emit(&s, #""when","name":"userTypesNewEmail","params":{"userEmail":"user\#(rng.next() % 100000)@example.com"}"#)
        emit(&s, #""when","name":"userTapsChangeEmailButton","params":{}"#)
        if rng.next() % 10 == 0 {
            emit(
                &s,
                #""error","message":"the address is already in use","name":"userTapsChangeEmailButton","screen":"ChangeEmail""#
            )
        }
        emit(&s, #""navigation","action":"dismiss""#)
        disappear(&s, "ChangeEmail", removed: true)
    }

    mutating func gpOnboarding(_ s: inout Session) {
        for (i, screen) in ["Welcome", "Consent", "PersonalDetails", "ChoosePractice"].enumerated() {
            emit(
                &s,
                i == 0
                    ? #""navigation","action":"root","screen":"\#(screen)""#
                    : #""navigation","action":"push","screen":"\#(screen)""#)
            appear(&s, screen, initially: true)
            switch screen {
            case "Consent": emit(&s, #""when","name":"userAcceptsTerms","params":{"version":"2026-03"}"#)
            case "PersonalDetails":
                emit(
                    &s,
                    #""when","name":"userEntersPostcode","params":{"postcode":"SW\#(rng.next() % 20) \#(rng.next() % 9)AA"}"#
                )
            case "ChoosePractice":
                emit(
                    &s,
                    #""when","name":"userSelectsPractice","params":{"practiceId":"P\#(rng.next() % 90000)","distanceKm":\#(rng.next() % 30)}"#
                )
            default: emit(&s, #""when","name":"userTapsGetStarted","params":{}"#)
            }
        }
        emit(&s, #""navigation","action":"replace","screen":"Done""#)
        appear(&s, "Done", initially: true)
    }

    /// At least `count` events, grouped in sessions.
    mutating func sessions(count: Int) -> [Session] {
        var result: [Session] = []
        var total = 0
        let apps = ["com.example.marvel", "com.example.mail", "uk.nhs.gp-onboarding"]
        while total < count {
            let kind = Int(rng.next() % 3)
            var s = Session(app: apps[kind], id: hex(8) + "-" + hex(4) + "-" + hex(12), user: "u" + hex(10))
            switch kind {
            case 0: marvel(&s)
            case 1: emailChange(&s)
            default: gpOnboarding(&s)
            }
            total += s.lines.count
            result.append(s)
        }
        return result
    }
}
