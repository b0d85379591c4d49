import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendJournal

/// What whend says of itself while it runs, from the journal writer's heartbeat: the service
/// manager's watchdog ping and `STATUS=` line, the rate limit's summary in the log, and memory a
/// burst freed given back once ingest is quiet. The heartbeat comes from the writer's loop so
/// that a writer stuck in a write or a sync stops the pings.
final class StatusReporter: Sendable {
    private let writer: JournalWriter
    private let metrics: DaemonMetrics
    private let pipelines: PipelineService
    private let limiter: SenderRateLimiter
    private let notifier: ServiceNotifier
    private let live: LiveConfiguration
    private let logger: @Sendable () -> Logger
    /// The last five-second window: when it began, records stored then, and its rate.
    private let window = NIOLockedValueBox<(at: Date, stored: UInt64, rate: Double)>((Date(), 0, 0))
    /// Records stored at the last heartbeat, and when memory was last given back.
    private let memoryReturn = NIOLockedValueBox<(seen: UInt64, trimmedAt: UInt64)>((0, 0))
    private let lastRateReport = NIOLockedValueBox<Date>(Date())

    init(
        writer: JournalWriter, metrics: DaemonMetrics, pipelines: PipelineService, limiter: SenderRateLimiter,
        notifier: ServiceNotifier, live: LiveConfiguration, logger: @escaping @Sendable () -> Logger
    ) {
        self.writer = writer
        self.metrics = metrics
        self.pipelines = pipelines
        self.limiter = limiter
        self.notifier = notifier
        self.live = live
        self.logger = logger
    }

    /// Called from the writer's loop at least once per watchdog interval while it is healthy.
    func heartbeat() {
        notifier.watchdog()
        publishStatusIfDue()
        reportSuppressedIfDue()
        returnMemoryIfQuiet()
    }

    /// Events stored per second, over the last five-second window (or since the start).
    var eventsPerSecond: Double {
        let (at, stored, rate) = window.withLockedValue { $0 }
        let seconds = Date().timeIntervalSince(at)
        guard seconds >= 1 || rate == 0 else { return rate }
        return Double(writer.statistics.recordsStored &- stored) / max(0.001, seconds)
    }

    /// The live figures for `STATUS=`: connections, events stored per second, last `_seq`,
    /// pipeline lag.
    func statusLine() -> String {
        let stats = writer.statistics
        let failing = stats.failing.map { "; journal failing: \($0)" } ?? ""
        return
            "\(metrics.connections) clients, \(Int(eventsPerSecond)) events/s, last _seq \(stats.lastSeq), \(pipelines.lag.map { "pipeline lag \($0)" } ?? "no pipelines")\(failing)"
    }

    /// Updates STATUS= every five seconds.
    private func publishStatusIfDue() {
        let due = window.withLockedValue { Date().timeIntervalSince($0.at) >= 5 }
        guard due else { return }
        let stored = writer.statistics.recordsStored
        window.withLockedValue { last in
            let seconds = max(0.001, Date().timeIntervalSince(last.at))
            last = (Date(), stored, Double(stored &- last.stored) / seconds)
        }
        notifier.status(statusLine())
    }

    /// Gives the memory a burst freed back to the system once ingest has gone quiet (a heartbeat
    /// with nothing stored since the one before, and something since the last time): glibc
    /// keeps a freed allocation's pages in its thread's arena, and after 1M events whend held
    /// 18 MiB of PSS more than it used. Not while records come: the trim holds every arena's
    /// lock, and the writer's thread, for milliseconds.
    private func returnMemoryIfQuiet() {
        let stored = writer.statistics.recordsStored
        let due = memoryReturn.withLockedValue { state in
            defer { state.seen = stored }
            guard stored == state.seen, stored != state.trimmedAt else { return false }
            state.trimmedAt = stored
            return true
        }
        if due { _ = whend_malloc_trim(0) }
    }

    /// Sums up in the log what the rate limit suppressed, per sender, every
    /// `rate_limit_report_interval`: whether or not the sender speaks again.
    private func reportSuppressedIfDue() {
        let interval = live.current.rateLimitReportInterval
        let due = lastRateReport.withLockedValue { last in
            guard Date().timeIntervalSince(last) >= interval else { return false }
            last = Date()
            return true
        }
        guard due else { return }
        for entry in limiter.takeReport() {
            logger().warning(
                "rate limit: suppressed \(entry.count) event(s) from \(entry.sender) in the last \(Settings.number(interval)) s"
            )
        }
    }
}
