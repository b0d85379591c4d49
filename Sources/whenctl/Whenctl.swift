import ArgumentParser
import Foundation
import WhendJournal
import WhendSystem
import WhendWire

@main
struct Whenctl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whenctl",
        abstract:
            "whend's companion: emit events; read, follow and verify the journal; status, reload, metrics and plugins of the daemon; sessions and crash reports; replay, export and flow; a debugger page in the browser (ui).",
        discussion: """
            whenctl finds whend as every client does. The event socket: --socket, else \
            $WHEND_SOCKET, else events.sock in $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR/whend or \
            /tmp/whend-$UID where a whend made it, else the installed service's \
            /run/whend/events.sock. The control socket: --control, else $WHEND_CONTROL_SOCKET, \
            else control.sock beside the event socket. The journal: --journal, else journal/ in \
            --state-dir, $STATE_DIRECTORY, $XDG_STATE_HOME/whend or ~/.local/state/whend, else \
            the installed service's /var/lib/whend.

            Exit status: 0 when the command did its work; 1 when it failed (one line on \
            standard error says what failed, with which input, and what to do), when emit had \
            an event refused or not acknowledged, when verify found damage; 64 on a usage error \
            (the usage is printed).
            """,
        version: WhendVersion.current,
        subcommands: [
            Emit.self, Cat.self, Tail.self, Verify.self, Status.self, Reload.self, Metrics.self, Rejections.self,
            Plugins.self,
            Sessions.self, Crashes.self, Replay.self, Export.self, Flow.self, Plan.self, UI.self,
        ]
    )

    /// Exit statuses: 0 done; 1 the work failed (one line on standard error says what, with
    /// which input, and what to do; for `emit`, also an event refused or not acknowledged; for
    /// `verify`, a problem found); 64 a usage error (the usage is printed).
    static func main() {
        // `tail -f` and `replay` run until stopped: they must stop for whoever started them.
        TerminationSignals.unblock()
        // A reader gone (`whenctl cat | head`) is an EPIPE that `Output` ends on quietly (exit 0),
        // and a daemon gone mid-request is an error that says so, not a silent death.
        signal(SIGPIPE, SIG_IGN)
        var command: ParsableCommand
        do {
            command = try parseAsRoot()
        } catch {
            if let typed = CommandLine.arguments.dropFirst().first, let near = nearestCommand(to: typed) {
                printError(
                    "whenctl: there is no command '\(typed)'; did you mean '\(near)'? (whenctl --help lists them)")
                Foundation.exit(64)
            }
            exit(withError: error)
        }
        do {
            try command.run()
        } catch let failure as Failure {
            printError("whenctl \(type(of: command)._commandName): \(failure)")
            Foundation.exit(1)
        } catch let usage as ValidationError {
            // The subcommand's usage, not the root's.
            type(of: command).exit(withError: usage)
        } catch {
            // Exit codes, help asked for, and other errors (printed as "Error: …", exit 1).
            exit(withError: error)
        }
        Foundation.exit(0)
    }
}

/// The command `typed` was probably meant to be: one a letter or two away (a typo, two letters
/// swapped), or that it begins. Nil for an option, a command that exists, or nothing close.
func nearestCommand(to typed: String) -> String? {
    let names = Whenctl.configuration.subcommands.map { $0._commandName } + ["help"]
    guard !typed.hasPrefix("-"), !names.contains(typed) else { return nil }
    func distance(_ a: [Character], _ b: [Character]) -> Int {
        // Damerau–Levenshtein (optimal string alignment): a swap of two letters is one edit.
        var d = [[Int]](repeating: [Int](repeating: 0, count: b.count + 1), count: a.count + 1)
        for i in 0...a.count { d[i][0] = i }
        for j in 0...b.count { d[0][j] = j }
        for i in stride(from: 1, through: a.count, by: 1) {
            for j in stride(from: 1, through: b.count, by: 1) {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
                }
            }
        }
        return d[a.count][b.count]
    }
    let scored = names.map { (name: $0, edits: distance(Array(typed.lowercased()), Array($0))) }
    if let best = scored.min(by: { $0.edits < $1.edits }), best.edits <= min(2, max(1, typed.count / 3)) {
        return best.name
    }
    return typed.count >= 2 ? names.first { $0.hasPrefix(typed.lowercased()) } : nil
}

/// Where the journal is: `--journal`, else `journal/` in `--state-dir`, else in the state
/// directory the daemon uses by default (PROTOCOL.md §7).
struct JournalLocationOptions: ParsableArguments {
    @Option(name: .long, help: "The state directory whend uses (its journal is journal/ inside).")
    var stateDir: String?

    @Option(name: .long, help: "The journal directory itself.")
    var journal: String?

    var directory: JournalDirectory {
        if let journal { return JournalDirectory(path: journal) }
        return JournalDirectory(stateDirectory: stateDir ?? SocketLocation.readerStateDirectory())
    }

    /// Whether the journal exists and this user may read it.
    var isReadable: Bool { access(directory.path, R_OK | X_OK) == 0 }

    func existingDirectory() throws -> JournalDirectory {
        let directory = self.directory
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory), isDirectory.boolValue
        else {
            throw Failure(
                "no journal at \(directory.path): start whend first (`make run`), or name one with --state-dir or --journal"
            )
        }
        return directory
    }
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Buffered standard output: records are printed by the million.
final class Output {
    private var buffer: [UInt8] = []
    private let descriptor: Int32

    init(descriptor: Int32 = 1) {
        self.descriptor = descriptor
        buffer.reserveCapacity(1 << 16)
    }

    func write(_ bytes: UnsafeBufferPointer<UInt8>) {
        buffer.append(contentsOf: bytes)
        buffer.append(0x0A)
        if buffer.count >= 1 << 16 { flush() }
    }

    func write(_ text: String) {
        buffer.append(contentsOf: text.utf8)
        buffer.append(0x0A)
        if buffer.count >= 1 << 16 { flush() }
    }

    func flush() {
        var done = 0
        while done < buffer.count {
            let n = buffer.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress! + done, $0.count - done) }
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                Foundation.exit(errno == EPIPE ? 0 : 1)
            }
            done += n
        }
        buffer.removeAll(keepingCapacity: true)
    }
}
