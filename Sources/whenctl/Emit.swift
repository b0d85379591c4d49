import ArgumentParser
import Foundation
import WhendWire

struct Emit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send events to whend and wait until each is stored or rejected.",
        discussion: """
            Events are JSON objects, one per argument, or one per line on standard input when \
            there are no arguments. Errors are printed as they come; the exit status is 1 if any \
            event was rejected, or if whend could not be reached or did not answer for every event \
            (the last line says which), 64 for a usage error.
            Example: whenctl emit '{"type":"when","name":"userTapsChangeEmailButton"}'
            """
    )

    @Option(name: .long, help: "The event socket (default: $WHEND_SOCKET, then the usual places).")
    var socket: String?

    @Option(name: .long, help: "Default app for events that carry none (the hello's app).")
    var app: String?

    @Option(name: .long, help: "Default session for events that carry none (the hello's session).")
    var session: String?

    @Flag(name: .shortAndLong, help: "Print nothing but errors.")
    var quiet = false

    @Argument(help: "Events as JSON objects; standard input when none.")
    var events: [String] = []

    func run() throws {
        let path = socket ?? SocketLocation.eventSocket()
        try refuseUnsafeSocketDirectory(path)
        let connection: BlockingSocket
        do { connection = try BlockingSocket(path: path) } catch { throw unreachable(.events, at: path, error) }
        var hello: [String: Any] = ["protocol": 1, "acks": true]
        if let app { hello["app"] = app }
        if let session { hello["session"] = session }
        let helloLine = try JSONSerialization.data(withJSONObject: ["hello": hello], options: [.sortedKeys])

        // Answers are read on a thread of their own, so that a long stream of events and a
        // long stream of errors never wait on each other.
        let answers = AnswerCollector()
        let reader = Thread {
            do { try connection.receiveLines { answers.take($0) } } catch { answers.fail("\(error)") }
            answers.finished.signal()
        }
        reader.start()

        var sent: UInt64 = 0
        do {
            try connection.send(Array(helloLine) + [0x0A])
            if events.isEmpty {
                while let line = readLine(strippingNewline: true) {
                    if line.allSatisfy(\.isWhitespace) { continue }
                    try connection.send(line + "\n")
                    sent += 1
                }
            } else {
                // One argument is one event, even if it was typed over several lines; all of
                // them in one write, so that whend reads them together and stores them as one
                // batch, with consecutive `_seq`s (one write each let a pipeline's derived
                // record land between them).
                let lines = events.map { $0.replacingOccurrences(of: "\n", with: " ") + "\n" }.joined()
                try connection.send(lines)
                sent = UInt64(events.count)
            }
        } catch {
            printError("whenctl emit: \(error)")
        }
        connection.finishSending()
        answers.finished.wait()

        let result = answers.result
        for (line, code, message) in result.errors {
            printError(line.map { "event \($0): \(code): \(message)" } ?? "\(code): \(message)")
        }
        if let failure = result.failure { printError("whenctl emit: \(failure)") }
        let rejected = result.errors.filter { $0.0 != nil }.count
        if !quiet {
            printError(
                "whenctl emit: \(sent) sent, \(min(result.acked, sent) - UInt64(min(UInt64(rejected), result.acked))) stored, \(rejected) rejected"
            )
        }
        if result.errors.contains(where: { $0.0 == nil }) || result.acked < sent || rejected > 0 { throw ExitCode(1) }
    }
}

/// Collects the daemon's answers: the highest ack, and each error.
final class AnswerCollector: @unchecked Sendable {
    // Unchecked: written by the reader thread only until it signals `finished`, read after.
    struct Result {
        var acked: UInt64 = 0
        var errors: [(UInt64?, String, String)] = []
        var failure: String?
    }

    let finished = DispatchSemaphore(value: 0)
    private(set) var result = Result()

    func take(_ line: String) {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return }
        if let ack = object["ack"] as? NSNumber {
            result.acked = max(result.acked, ack.uint64Value)
        } else if let error = object["error"] as? [String: Any] {
            result.errors.append(
                (
                    (error["event"] as? NSNumber)?.uint64Value, error["code"] as? String ?? "?",
                    error["message"] as? String ?? ""
                ))
        }
    }

    func fail(_ message: String) { result.failure = message }
}
