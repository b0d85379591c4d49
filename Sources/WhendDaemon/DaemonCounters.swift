import NIOConcurrencyHelpers
import WhendWire

/// Counters shared by all connections, for status and metrics.
final class DaemonCounters: Sendable {
    private struct State {
        var bytesIn = 0
        var eventsReceived = 0
        var rejected: [WireErrorCode: Int] = [:]
        var droppedReplies = 0
        var connections = 0
    }

    private let state = NIOLockedValueBox(State())

    func add(bytesIn: Int) { state.withLockedValue { $0.bytesIn += bytesIn } }
    func received(_ n: Int) { state.withLockedValue { $0.eventsReceived += n } }
    func rejected(_ code: WireErrorCode) { state.withLockedValue { $0.rejected[code, default: 0] += 1 } }
    func droppedReply() { state.withLockedValue { $0.droppedReplies += 1 } }
    func connectionOpened() { state.withLockedValue { $0.connections += 1 } }
    func connectionClosed() { state.withLockedValue { $0.connections -= 1 } }
    var connections: Int { state.withLockedValue { $0.connections } }
}
