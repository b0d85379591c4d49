import ArgumentParser
import Foundation
import WhendWire

/// A failure of the work rather than of the command line: whenctl prints it as one line — what
/// failed, with which input, and what to do — and exits 1. Usage errors (`ValidationError`)
/// print the usage and exit 64.
struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Which of whend's sockets a command wanted, for saying how to name another one.
enum DaemonSocket {
    case events, control

    var howToNameAnother: String {
        switch self {
        case .events: return "--socket or $WHEND_SOCKET"
        case .control: return "--control or $WHEND_CONTROL_SOCKET (or the event socket it sits beside: --socket)"
        }
    }
}

/// The one message for "whend cannot be reached": the socket tried, why, and what to do.
func unreachable(_ socket: DaemonSocket, at path: String, _ error: Error) -> Failure {
    let failure = error as? BlockingSocket.Failure
    let reason = failure?.connectErrno.map { String(cString: strerror($0)) } ?? "\(error)"
    return Failure(
        "cannot reach whend at \(path) (\(reason))"
            + (failure?.nobodyListens == true
                ? "; start it (`make run` in a checkout, `systemctl start whend.socket` when installed), or name its socket with \(socket.howToNameAnother)"
                : "; name another socket with \(socket.howToNameAnother)"))
}

/// The message for a whend that took the connection and ended it without an answer: it was
/// reached, so naming another socket would not help; most often it is stopping.
func unanswered(at path: String, because error: Error?) -> Failure {
    Failure(
        "whend closed \(path) without answering\(error.map { " (\($0))" } ?? ""); if it was stopping, what was asked was not done: `whenctl status` says whether it runs, and its log (journalctl -u whend, or make run's terminal) says why"
    )
}

/// Refuses a socket in `/tmp/whend-$UID` that another user could have put there
/// (`SocketLocation.refusalToConnect`).
func refuseUnsafeSocketDirectory(_ path: String) throws {
    if let reason = SocketLocation.refusalToConnect(path) { throw Failure(reason) }
}

/// `text` from elsewhere (whend's answer, which may quote a client's input) as one line a
/// terminal shows as it is: control characters escaped, and at most `limit` characters.
func printable(_ text: String, limit: Int = 2000) -> String {
    var out = ""
    for scalar in text.unicodeScalars.prefix(limit) {
        if scalar.value < 0x20 || scalar.value == 0x7F || (0x80...0x9F).contains(scalar.value) {
            out += String(format: "\\x%02x", scalar.value)
        } else if [0x200E, 0x200F, 0x2028, 0x2029].contains(scalar.value) || (0x202A...0x202E).contains(scalar.value)
            || (0x2066...0x2069).contains(scalar.value)
        {
            // Marks that reorder or break what follows: a line would read other than it is.
            out += String(format: "\\u{%04x}", scalar.value)
        } else {
            out.unicodeScalars.append(scalar)
        }
    }
    return text.unicodeScalars.count > limit ? out + "…" : out
}
