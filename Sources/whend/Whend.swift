import ArgumentParser
import Foundation
import Logging
import WhendDaemon
import WhendJournal
import WhendWire

@main
struct Whend: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whend",
        abstract: "The local event daemon: apps emit on a Unix socket, whend journals every event.",
        discussion: """
            With no options whend runs on its embedded defaults: the event socket at \
            $WHEND_SOCKET, else $RUNTIME_DIRECTORY/events.sock, $XDG_RUNTIME_DIR/whend/events.sock \
            or /tmp/whend-$UID/events.sock; the journal in journal/ under $STATE_DIRECTORY, else \
            $XDG_STATE_HOME/whend or ~/.local/state/whend.
            """,
        version: WhendVersion.current
    )

    @Option(name: .long, help: "The event socket's path.")
    var socket: String?

    @Option(name: .long, help: "Permission bits of the event socket, in octal (default 0666).")
    var socketMode: String = "0666"

    @Option(name: .long, help: "The state directory; the journal is journal/ inside it.")
    var stateDir: String?

    @Option(name: .long, help: "When an ack is sent: fsync (on disk), write (survives a daemon crash), none.")
    var durability: String = "fsync"

    @Option(name: .long, help: "The longest event line in bytes (max_event_bytes).")
    var maxEventBytes: Int = 65536

    @Option(name: .long, help: "Rotate a segment at this many compressed bytes.")
    var segmentMaxBytes: Int64 = 32 << 20

    @Option(name: .long, help: "Rotate a segment after this many seconds.")
    var segmentMaxAge: Double = 3600

    @Option(
        name: .long, help: "Keep the journal under this many bytes, deleting the oldest sealed segments (0: no limit).")
    var retentionMaxBytes: Int64 = 1 << 30

    @Option(name: .long, help: "Delete sealed segments older than this many seconds (0: no limit).")
    var retentionMaxAge: Double = 0

    @Option(name: .long, help: "How many of the latest records resent events are de-duplicated against.")
    var dedupWindow: Int = 100_000

    @Option(name: .long, help: "Events per second one connection may send (0: unlimited).")
    var rateLimit: Double = 0

    @Option(name: .long, help: "Events one connection may send at once above the rate limit.")
    var rateBurst: Double = 1000

    @Option(
        name: .long, help: "Bytes all connections together may have waiting for the journal before whend stops reading."
    )
    var maxPendingBytes: Int = 16 << 20

    @Option(name: .long, help: "Seconds a graceful stop waits for connections to drain.")
    var shutdownTimeout: Double = 10

    @Option(name: .long, help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func validate() throws {
        guard Durability(rawValue: durability) != nil else {
            throw ValidationError("--durability must be fsync, write or none; got '\(durability)'")
        }
        guard mode_t(socketMode, radix: 8) != nil else {
            throw ValidationError("--socket-mode must be octal permission bits like 0666; got '\(socketMode)'")
        }
        guard (64...(16 << 20)).contains(maxEventBytes) else {
            throw ValidationError("--max-event-bytes must be between 64 and 16777216; got \(maxEventBytes)")
        }
        guard segmentMaxBytes >= 4096 else { throw ValidationError("--segment-max-bytes must be at least 4096") }
        guard dedupWindow >= 0 else { throw ValidationError("--dedup-window must be 0 or more") }
        guard maxPendingBytes >= 4096 else { throw ValidationError("--max-pending-bytes must be at least 4096") }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
    }

    func run() throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "whend")

        var configuration = DaemonConfiguration()
        if let socket { configuration.socketPath = socket }
        configuration.socketMode = mode_t(socketMode, radix: 8) ?? 0o666
        if let stateDir { configuration.setStateDirectory(stateDir) }
        configuration.maxEventBytes = maxEventBytes
        configuration.journal.durability = Durability(rawValue: durability) ?? .fsync
        configuration.journal.segmentMaxBytes = segmentMaxBytes
        configuration.journal.segmentMaxAge = segmentMaxAge
        configuration.journal.retentionMaxBytes = retentionMaxBytes
        configuration.journal.retentionMaxAge = retentionMaxAge
        configuration.journal.dedupWindow = dedupWindow
        configuration.rateLimit = rateLimit
        configuration.rateBurst = rateBurst
        configuration.shutdownTimeout = shutdownTimeout
        configuration.maxPendingBytes = maxPendingBytes

        do {
            let daemon = try Daemon(configuration: configuration, logger: logger)
            try daemon.start()
            daemon.run()
        } catch let error as DaemonStartError {
            logger.critical("\(error.description)")
            throw ExitCode(1)
        }
    }
}
