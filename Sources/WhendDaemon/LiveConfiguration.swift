import NIOConcurrencyHelpers
import Synchronization
import WhendConfiguration
import WhendPluginHost

/// The configuration a running daemon works by, replaced whole on reload.
///
/// Connections keep a copy and look at `generation` — one atomic load — once per read, taking
/// up a new configuration when it has moved; they never hold the lock on the event path.
final class LiveConfiguration: Sendable {
    private let box: NIOLockedValueBox<(DaemonConfiguration, PluginChain)>
    private let version = Atomic<Int>(0)

    init(_ configuration: DaemonConfiguration, ingest: PluginChain = PluginChain([])) {
        box = NIOLockedValueBox((configuration, ingest))
    }

    var current: DaemonConfiguration { box.withLockedValue { $0.0 } }
    var ingest: PluginChain { box.withLockedValue { $0.1 } }

    /// Moves each time the configuration is replaced.
    var generation: Int { version.load(ordering: .acquiring) }

    func replace(_ configuration: DaemonConfiguration, ingest: PluginChain) {
        box.withLockedValue { $0 = (configuration, ingest) }
        version.add(1, ordering: .releasing)
    }
}
