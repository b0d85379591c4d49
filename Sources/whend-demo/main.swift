import Foundation
import SeededRandom
import WhenClient
import WhendSystem
import WhendWire

// whend-demo: app sessions simulated through WhenClient — the seeds' three journeys (a Marvel
// characters browser, an email-change screen, a GP onboarding flow) — at a given rate.

let usage = """
    usage: whend-demo [--rate EVENTS_PER_S] [--sessions N | --duration SECONDS] [--journey all|marvel|email|onboarding]
                      [--socket PATH] [--seed N] [--fatal-one-in N] [--quiet]
      --rate          events per second over all sessions (default 50; 0: as fast as the client takes them)
      --sessions      how many sessions to run (default 12), or
      --duration      run for this long instead
      --journey       which journeys to run (default all, in turn)
      --socket        whend's event socket (default: $WHEND_SOCKET, else the usual places)
      --seed          the same seed gives the same sessions (default 1)
      --fatal-one-in  one onboarding in N ends in a fatal error (default 20; 0: never)

    """

TerminationSignals.unblock()

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("whend-demo: \(message)\n".utf8))
    exit(2)
}

var options: [String: String] = [:]
var quiet = false
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let key = arguments.next() {
    switch key {
    case "-h", "--help":
        print(usage, terminator: "")
        exit(0)
    case "--quiet": quiet = true
    case "--rate", "--sessions", "--duration", "--journey", "--socket", "--seed", "--fatal-one-in":
        guard let value = arguments.next() else { fail("\(key) needs a value\n\(usage)") }
        options[String(key.dropFirst(2))] = value
    default: fail("unknown option \(key)\n\(usage)")
    }
}
@MainActor func number(_ key: String, _ fallback: Double) -> Double {
    guard let text = options[key] else { return fallback }
    guard let value = Double(text), value >= 0 else { fail("--\(key) must be a number ≥ 0, not \(text)") }
    return value
}
let rate = number("rate", 50)
let duration = options["duration"].map { _ in number("duration", 0) }
let sessionLimit = duration == nil ? Int(number("sessions", 12)) : Int.max
let fatalOneIn = UInt64(number("fatal-one-in", 20))
let journeys: [String] =
    switch options["journey"] ?? "all" {
    case "all": ["marvel", "email", "onboarding"]
    case let one where ["marvel", "email", "onboarding"].contains(one): [one]
    case let other: fail("--journey must be all, marvel, email or onboarding, not \(other)")
    }
var random = SplitMix64(state: UInt64(number("seed", 1)))

/// One run: the clients (one per app), the pace, and the progress shown.
final class DemoRun {
    let rate: Double
    let quiet: Bool
    var clients: [String: WhenClient] = [:]
    let start = Date()
    var lastReport = Date()
    var sessions = 0

    init(journeys: [String], socket: String?, rate: Double, quiet: Bool, random: inout SplitMix64) {
        self.rate = rate
        self.quiet = quiet
        let apps = ["marvel": "com.example.marvel", "email": "com.example.mail", "onboarding": "uk.nhs.gp-onboarding"]
        for journey in journeys {
            var configuration = WhenClient.Configuration(app: apps[journey]!, session: "", socketPath: socket)
            configuration.user = "demo-user-\(random.next() % 1000)"
            clients[journey] = WhenClient(configuration)
        }
    }

    func totals() -> WhenClient.Statistics {
        clients.values.reduce(into: WhenClient.Statistics()) {
            let s = $1.statistics
            $0.enqueued += s.enqueued
            $0.delivered += s.delivered
            $0.dropped += s.dropped
            $0.refused += s.refused
        }
    }

    /// Keeps the pace: after the n-th event, waits until n / rate seconds have passed.
    func pace() {
        let now = Date()
        let t = totals()
        let emitted = t.enqueued + t.dropped
        if !quiet && now.timeIntervalSince(lastReport) >= 1 {
            lastReport = now
            let perSecond = Int(Double(emitted) / now.timeIntervalSince(start))
            FileHandle.standardError.write(
                Data(
                    "\(sessions) sessions, \(emitted) events (\(perSecond)/s), delivered \(t.delivered), dropped \(t.dropped)\n"
                        .utf8))
        }
        guard rate > 0 else { return }
        let wait = start.addingTimeInterval(Double(emitted) / rate).timeIntervalSinceNow
        if wait > 0 { usleep(UInt32(min(wait, 10) * 1_000_000)) }
    }

    func run(journeys: [String], sessionLimit: Int, duration: Double?, fatalOneIn: UInt64, random: inout SplitMix64) {
        while sessions < sessionLimit {
            if let duration, Date().timeIntervalSince(start) >= duration { break }
            let journey = journeys[sessions % journeys.count]
            let client = clients[journey]!
            client.session = String(random.next(), radix: 16) + "-" + String(random.next() % 0xFFFF, radix: 16)
            let app = DemoApp(client: client, random: random, pace: pace)
            switch journey {
            case "marvel": marvelJourney(app)
            case "email": emailChangeJourney(app)
            default: onboardingJourney(app, fatalOneIn: fatalOneIn)
            }
            random = app.random
            sessions += 1
        }
    }
}

let demo = DemoRun(journeys: journeys, socket: options["socket"], rate: rate, quiet: quiet, random: &random)
demo.run(journeys: journeys, sessionLimit: sessionLimit, duration: duration, fatalOneIn: fatalOneIn, random: &random)
let clients = demo.clients
let sessions = demo.sessions
let start = demo.start
var delivered = true
for client in clients.values where !client.flush(timeout: 10) { delivered = false }
let t = demo.totals()
let seconds = Date().timeIntervalSince(start)
print(
    "\(sessions) sessions, \(t.enqueued + t.dropped) events in \(String(format: "%.1f", seconds)) s: delivered \(t.delivered), dropped \(t.dropped), refused \(t.refused)"
)
if !delivered {
    let problem = clients.values.compactMap(\.lastProblem).first ?? "the daemon did not acknowledge in time"
    FileHandle.standardError.write(Data("whend-demo: not everything was delivered within 10 s: \(problem)\n".utf8))
    exit(1)
}
