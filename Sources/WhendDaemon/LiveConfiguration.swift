import NIOConcurrencyHelpers
import Synchronization
import WhendConfiguration
import WhendPluginHost
import WhendTrackingPlan

/// The configuration a running daemon works by, replaced whole on reload.
///
/// Connections keep a copy and look at `generation` — one atomic load — once per read, taking
/// up a new configuration when it has moved; they never hold the lock on the event path.
final class LiveConfiguration: Sendable {
    private let box: NIOLockedValueBox<(DaemonConfiguration, PluginChain, TrackingPlan?)>
    private let version = Atomic<Int>(0)

    init(_ configuration: DaemonConfiguration, ingest: PluginChain = PluginChain([]), plan: TrackingPlan? = nil) {
        box = NIOLockedValueBox((configuration, ingest, plan))
    }

    var current: DaemonConfiguration { box.withLockedValue { $0.0 } }
    var ingest: PluginChain { box.withLockedValue { $0.1 } }
    /// The tracking plan `current` names, compiled; nil for none.
    var plan: TrackingPlan? { box.withLockedValue { $0.2 } }

    /// All three as one replace left them.
    var snapshot: (configuration: DaemonConfiguration, ingest: PluginChain, plan: TrackingPlan?) {
        box.withLockedValue { $0 }
    }

    /// Moves each time the configuration is replaced.
    var generation: Int { version.load(ordering: .acquiring) }

    /// Replaces all three at once: a connection never sees a plan with another configuration's
    /// mode.
    func replace(_ configuration: DaemonConfiguration, ingest: PluginChain, plan: TrackingPlan?) {
        box.withLockedValue { $0 = (configuration, ingest, plan) }
        version.add(1, ordering: .releasing)
    }
}
