import CoreMetrics
import NIOConcurrencyHelpers
import Prometheus
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

/// Everything whend counts, kept twice over on purpose: as swift-metrics instruments, which a
/// Prometheus registry renders for `whenctl metrics`, and as plain numbers that `whenctl
/// status` and `STATUS=` read back (swift-metrics instruments cannot be read).
///
/// Per-event paths touch it once per read or per commit, never once per event.
final class DaemonMetrics: Sendable {
    struct Snapshot: Sendable {
        var bytesIn = 0
        var eventsReceived = 0
        var rejected: [WireErrorCode: Int] = [:]
        var droppedReplies = 0
        var connections = 0
    }

    let registry = PrometheusCollectorRegistry()
    private let state = NIOLockedValueBox(Snapshot())

    private let bytesInCounter: CoreMetrics.Counter
    private let receivedCounter: CoreMetrics.Counter
    private let storedCounter: CoreMetrics.Counter
    private let storedBytesCounter: CoreMetrics.Counter
    private let rejectedCounters: [WireErrorCode: CoreMetrics.Counter]
    private let droppedRepliesCounter: CoreMetrics.Counter
    private let commitTimer: CoreMetrics.Timer
    private let connectionsGauge: CoreMetrics.Gauge
    private let pendingGauge: CoreMetrics.Gauge
    private let lastSeqGauge: CoreMetrics.Gauge
    private let journalBytesGauge: CoreMetrics.Gauge
    private let journalSegmentsGauge: CoreMetrics.Gauge
    private let factory: PrometheusMetricsFactory
    private let pipelineGauges = NIOLockedValueBox<[String: [CoreMetrics.Gauge]]>([:])
    private let lostCounters = NIOLockedValueBox<[String: CoreMetrics.Counter]>([:])

    init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        // A commit is a write and, with durability fsync, an fdatasync: tens of µs to seconds.
        factory.durationHistogramBuckets["whend_commit_duration_seconds"] = [
            .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
            .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5),
        ]
        self.factory = factory
        bytesInCounter = CoreMetrics.Counter(label: "whend_bytes_received_total", factory: factory)
        receivedCounter = CoreMetrics.Counter(label: "whend_events_received_total", factory: factory)
        storedCounter = CoreMetrics.Counter(label: "whend_events_stored_total", factory: factory)
        storedBytesCounter = CoreMetrics.Counter(label: "whend_journal_bytes_written_total", factory: factory)
        var rejected: [WireErrorCode: CoreMetrics.Counter] = [:]
        for code in WireErrorCode.allCases {
            rejected[code] = CoreMetrics.Counter(
                label: "whend_events_rejected_total", dimensions: [("code", code.rawValue)], factory: factory)
        }
        rejectedCounters = rejected
        droppedRepliesCounter = CoreMetrics.Counter(label: "whend_replies_dropped_total", factory: factory)
        commitTimer = CoreMetrics.Timer(label: "whend_commit_duration_seconds", factory: factory)
        connectionsGauge = CoreMetrics.Gauge(label: "whend_connections", factory: factory)
        pendingGauge = CoreMetrics.Gauge(label: "whend_pending_bytes", factory: factory)
        lastSeqGauge = CoreMetrics.Gauge(label: "whend_journal_last_seq", factory: factory)
        journalBytesGauge = CoreMetrics.Gauge(label: "whend_journal_bytes", factory: factory)
        journalSegmentsGauge = CoreMetrics.Gauge(label: "whend_journal_segments", factory: factory)
    }

    func add(bytesIn: Int) {
        state.withLockedValue { $0.bytesIn += bytesIn }
        bytesInCounter.increment(by: bytesIn)
    }

    func received(_ n: Int) {
        state.withLockedValue { $0.eventsReceived += n }
        receivedCounter.increment(by: n)
    }

    func rejected(_ code: WireErrorCode) {
        state.withLockedValue { $0.rejected[code, default: 0] += 1 }
        rejectedCounters[code]?.increment()
    }

    func droppedReply() {
        state.withLockedValue { $0.droppedReplies += 1 }
        droppedRepliesCounter.increment()
    }

    func connectionOpened() {
        let n = state.withLockedValue {
            $0.connections += 1
            return $0.connections
        }
        connectionsGauge.record(n)
    }

    func connectionClosed() {
        let n = state.withLockedValue {
            $0.connections -= 1
            return $0.connections
        }
        connectionsGauge.record(n)
    }

    /// From the journal writer's thread, once per group commit.
    /// Retention deleted `records` records before `pipeline` read them.
    func lostToRetention(pipeline: String, records: UInt64) {
        let counter = lostCounters.withLockedValue { known in
            if let c = known[pipeline] { return c }
            let c = CoreMetrics.Counter(
                label: "whend_pipeline_records_lost_to_retention_total", dimensions: [("pipeline", pipeline)],
                factory: factory)
            known[pipeline] = c
            return c
        }
        counter.increment(by: Int64(records))
    }

    func committed(records: Int, bytes: Int, seconds: Double) {
        storedCounter.increment(by: records)
        storedBytesCounter.increment(by: bytes)
        commitTimer.recordNanoseconds(Int64(seconds * 1e9))
    }

    var snapshot: Snapshot { state.withLockedValue { $0 } }
    var connections: Int { state.withLockedValue { $0.connections } }

    /// The Prometheus text exposition of every metric, with the gauges read at this moment.
    /// One pipeline's figures at scrape time.
    struct PipelineFigures {
        var name: String
        var lag: UInt64
        var failures: Int
        var deadLetters: Int
        var restarts: Int
    }

    func prometheusText(
        journal: JournalStatistics, pendingBytes: Int, directory: JournalDirectory, pipelines: [PipelineFigures]
    ) -> String {
        for p in pipelines {
            let gauges = pipelineGauges.withLockedValue { known in
                if let g = known[p.name] { return g }
                let g = [
                    "whend_pipeline_lag_records", "whend_pipeline_failures", "whend_pipeline_dead_letters",
                    "whend_pipeline_restarts",
                ].map { CoreMetrics.Gauge(label: $0, dimensions: [("pipeline", p.name)], factory: factory) }
                known[p.name] = g
                return g
            }
            gauges[0].record(Int64(p.lag))
            gauges[1].record(p.failures)
            gauges[2].record(p.deadLetters)
            gauges[3].record(p.restarts)
        }
        pendingGauge.record(pendingBytes)
        lastSeqGauge.record(Int64(journal.lastSeq))
        let usage = directory.usage()
        journalSegmentsGauge.record(usage.segments)
        journalBytesGauge.record(usage.bytes)
        return registry.emitToString()
    }
}
