import NIOConcurrencyHelpers
import Prometheus
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendTrackingPlan
import WhendWire

/// Everything whend counts, kept twice over on purpose: as metrics of a Prometheus registry,
/// which renders them for `whenctl metrics` (each family with its `# HELP`, as `promtool check
/// metrics` asks), and as plain numbers that `whenctl status` and `STATUS=` read back.
///
/// Per-event paths touch it once per read or per commit, never once per event.
final class DaemonMetrics: Sendable {
    struct Snapshot: Sendable {
        var bytesIn = 0
        var eventsReceived = 0
        var rejected: [WireErrorCode: Int] = [:]
        var droppedReplies = 0
        var connections = 0
        var connectionsRefused = 0
    }

    let registry = PrometheusCollectorRegistry()
    /// The newest refused lines themselves, beside their counts.
    let recentRejections = RecentRejections()
    /// The tracking plan's violations, counted and the newest kept.
    let planViolations = PlanViolationLog()
    private let planViolationCounters = NIOLockedValueBox<[PlanViolationLog.Key: Counter]>([:])
    private let state = NIOLockedValueBox(Snapshot())

    private let bytesInCounter: Counter
    private let receivedCounter: Counter
    private let storedCounter: Counter
    private let storedBytesCounter: Counter
    private let rejectedCounters: [WireErrorCode: Counter]
    private let droppedRepliesCounter: Counter
    private let commitTimer: DurationHistogram
    private let connectionsGauge: Gauge
    private let connectionsRefusedCounter: Counter
    private let pendingGauge: Gauge
    private let lastSeqGauge: Gauge
    private let journalBytesGauge: Gauge
    private let journalSegmentsGauge: Gauge
    private let pipelineGauges = NIOLockedValueBox<[String: [Gauge]]>([:])
    private let lostCounters = NIOLockedValueBox<[String: Counter]>([:])
    private let pluginGauges = NIOLockedValueBox<[[String]: Gauge]>([:])

    /// Every family whend exposes, with the help text a scraper shows (docs/configuration.md's table says
    /// the same).
    enum Family: String, CaseIterable {
        case bytesReceived = "whend_bytes_received_total"
        case eventsReceived = "whend_events_received_total"
        case eventsStored = "whend_events_stored_total"
        case eventsRejected = "whend_events_rejected_total"
        case journalBytesWritten = "whend_journal_bytes_written_total"
        case repliesDropped = "whend_replies_dropped_total"
        case commitDuration = "whend_commit_duration_seconds"
        case connections = "whend_connections"
        case connectionsRefused = "whend_connections_refused_total"
        case pendingBytes = "whend_pending_bytes"
        case journalLastSeq = "whend_journal_last_seq"
        case journalBytes = "whend_journal_bytes"
        case journalSegments = "whend_journal_segments"
        case pipelineLag = "whend_pipeline_lag_records"
        case pipelineFailures = "whend_pipeline_failures"
        case pipelineDeadLetters = "whend_pipeline_dead_letters"
        case pipelineRestarts = "whend_pipeline_restarts"
        case pipelineLostToRetention = "whend_pipeline_records_lost_to_retention_total"
        case pluginCount = "whend_plugin_counts"
        case planViolations = "whend_plan_violations_total"

        var help: String {
            switch self {
            case .bytesReceived: return "Bytes read from event connections."
            case .eventsReceived: return "Valid events read from clients."
            case .eventsStored: return "Records committed to the journal, derived ones included."
            case .eventsRejected: return "Error replies to clients, by protocol error code."
            case .journalBytesWritten: return "Record bytes committed to the journal, before compression."
            case .repliesDropped:
                return "Error lines dropped for clients that asked for no acks and did not read them."
            case .commitDuration:
                return
                    "One group commit of the journal, from its write to its ack: with durability fsync, the fdatasync included."
            case .connections: return "Open event connections."
            case .connectionsRefused:
                return "Event connections refused because max_connections were open."
            case .pendingBytes: return "Record bytes read from clients and waiting for the journal."
            case .journalLastSeq: return "The last _seq stored."
            case .journalBytes: return "Bytes of the journal on disk."
            case .journalSegments: return "Segments of the journal on disk."
            case .pipelineLag: return "Records a pipeline has still to process."
            case .pipelineFailures: return "Failed attempts of a pipeline's plugins on a record, since whend started."
            case .pipelineDeadLetters: return "Records a pipeline wrote to its dead letters, since whend started."
            case .pipelineRestarts: return "Restarts of a pipeline's worker, since whend started."
            case .pipelineLostToRetention:
                return "Records retention deleted before a pipeline read them."
            case .planViolations:
                return
                    "Events that broke the tracking plan, by When name (empty for a name the plan does not list) and rule, stored or refused."
            case .pluginCount:
                return
                    "A plugin's own counter (host.count), since whend started; pipeline is empty for an ingest stage."
            }
        }

        var descriptor: MetricNameDescriptor {
            MetricNameDescriptor(metricName: rawValue, unitName: "", helpText: help)
        }
    }

    init() {
        let registry = self.registry
        func counter(_ family: Family, _ labels: [(String, String)] = []) -> Counter {
            registry.makeCounter(descriptor: family.descriptor, labels: labels)
        }
        func gauge(_ family: Family) -> Gauge { registry.makeGauge(descriptor: family.descriptor) }
        bytesInCounter = counter(.bytesReceived)
        receivedCounter = counter(.eventsReceived)
        storedCounter = counter(.eventsStored)
        storedBytesCounter = counter(.journalBytesWritten)
        var rejected: [WireErrorCode: Counter] = [:]
        for code in WireErrorCode.allCases { rejected[code] = counter(.eventsRejected, [("code", code.rawValue)]) }
        rejectedCounters = rejected
        droppedRepliesCounter = counter(.repliesDropped)
        // A commit is a write and, with durability fsync, an fdatasync: tens of µs to seconds.
        commitTimer = registry.makeDurationHistogram(
            descriptor: Family.commitDuration.descriptor,
            buckets: [
                .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
                .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
                .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5),
            ])
        connectionsGauge = gauge(.connections)
        connectionsRefusedCounter = counter(.connectionsRefused)
        pendingGauge = gauge(.pendingBytes)
        lastSeqGauge = gauge(.journalLastSeq)
        journalBytesGauge = gauge(.journalBytes)
        journalSegmentsGauge = gauge(.journalSegments)
    }

    func add(bytesIn: Int) {
        state.withLockedValue { $0.bytesIn += bytesIn }
        bytesInCounter.increment(by: Int64(bytesIn))
    }

    func received(_ n: Int) {
        state.withLockedValue { $0.eventsReceived += n }
        receivedCounter.increment(by: Int64(n))
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
        connectionsGauge.set(Int64(n))
    }

    /// Returns how many were refused since whend started.
    func connectionRefused() -> Int {
        connectionsRefusedCounter.increment()
        return state.withLockedValue {
            $0.connectionsRefused += 1
            return $0.connectionsRefused
        }
    }

    func connectionClosed() {
        let n = state.withLockedValue {
            $0.connections -= 1
            return $0.connections
        }
        connectionsGauge.set(Int64(n))
    }

    /// From the journal writer's thread, once per group commit.
    /// Retention deleted `records` records before `pipeline` read them.
    func lostToRetention(pipeline: String, records: UInt64) {
        lostCounter(pipeline).increment(by: Int64(records))
    }

    /// Made with the pipeline's gauges, at 0: a family that appears only once something is lost
    /// is one a dashboard cannot be built on.
    private func lostCounter(_ pipeline: String) -> Counter {
        lostCounters.withLockedValue { known in
            if let c = known[pipeline] { return c }
            let c = registry.makeCounter(
                descriptor: Family.pipelineLostToRetention.descriptor, labels: [("pipeline", pipeline)])
            known[pipeline] = c
            return c
        }
    }

    /// An event broke the tracking plan (from a connection's thread; never for an event that
    /// keeps to it).
    func planViolation(_ violation: PlanViolation, stored: Bool, line: UnsafeBufferPointer<UInt8>, app: [UInt8]?) {
        planViolations.add(violation, stored: stored, line: line, app: app)
        let key = PlanViolationLog.key(violation)
        let counter = planViolationCounters.withLockedValue { known in
            if let c = known[key] { return c }
            let c = registry.makeCounter(
                descriptor: Family.planViolations.descriptor, labels: [("event", key.event), ("rule", key.rule)])
            known[key] = c
            return c
        }
        counter.increment()
    }

    func committed(records: Int, bytes: Int, seconds: Double) {
        storedCounter.increment(by: Int64(records))
        storedBytesCounter.increment(by: Int64(bytes))
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

    /// A plugin's counters in one place it runs: an ingest stage (`pipeline` empty) or a stage
    /// of a pipeline.
    struct PluginCounters {
        var plugin: String
        var pipeline: String
        var values: [String: Int64]
    }

    func prometheusText(
        journal: JournalStatistics, pendingBytes: Int, directory: JournalDirectory, pipelines: [PipelineFigures],
        pluginCounters: [PluginCounters] = []
    ) -> String {
        for p in pluginCounters {
            for (name, value) in p.values {
                let labels = [p.plugin, p.pipeline, name]
                let gauge = pluginGauges.withLockedValue { known in
                    if let g = known[labels] { return g }
                    let g = registry.makeGauge(
                        descriptor: Family.pluginCount.descriptor,
                        labels: [("plugin", p.plugin), ("pipeline", p.pipeline), ("counter", name)])
                    known[labels] = g
                    return g
                }
                gauge.set(value)
            }
        }
        for p in pipelines {
            let gauges = pipelineGauges.withLockedValue { known in
                if let g = known[p.name] { return g }
                let g = [Family.pipelineLag, .pipelineFailures, .pipelineDeadLetters, .pipelineRestarts].map {
                    registry.makeGauge(descriptor: $0.descriptor, labels: [("pipeline", p.name)])
                }
                _ = lostCounter(p.name)
                known[p.name] = g
                return g
            }
            gauges[0].set(Int64(p.lag))
            gauges[1].set(Int64(p.failures))
            gauges[2].set(Int64(p.deadLetters))
            gauges[3].set(Int64(p.restarts))
        }
        pendingGauge.set(Int64(pendingBytes))
        lastSeqGauge.set(Int64(journal.lastSeq))
        let usage = directory.usage()
        journalSegmentsGauge.set(Int64(usage.segments))
        journalBytesGauge.set(usage.bytes)
        return registry.emitToString()
    }
}
