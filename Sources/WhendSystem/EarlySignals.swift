#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Set by the handler `EarlySignals.catch()` installs: 1 for a stop (SIGTERM, SIGINT), 2 for a
/// reload (SIGHUP), or'ed.
nonisolated(unsafe) private var earlySignalsArrived: sig_atomic_t = 0

/// The signals that reach whend before its services watch for them.
///
/// Between exec and the moment the service group traps SIGTERM, SIGINT and SIGHUP (a tenth of a
/// second, more on a busy machine: the journal is opened and recovered first), each had its
/// default action — the process ended, exit 143, 130 or 129, with nothing logged — or, started
/// in the background of a script, SIGINT was ignored and whend ran on. whend catches them first
/// thing instead, and acts on them once its services run: a stop is a graceful stop, a SIGHUP a
/// reload.
package enum EarlySignals {
    private static let stop: sig_atomic_t = 1
    private static let reload: sig_atomic_t = 2

    /// Catches SIGTERM, SIGINT and SIGHUP until the services trap them (their handlers replace
    /// this one).
    package static func `catch`() {
        signal(SIGTERM) { _ in earlySignalsArrived |= EarlySignals.stop }
        signal(SIGINT) { _ in earlySignalsArrived |= EarlySignals.stop }
        signal(SIGHUP) { _ in earlySignalsArrived |= EarlySignals.reload }
    }

    /// Whether a stop was asked for before the services watched; asks once.
    package static func takeStop() -> Bool { take(stop) }

    /// Whether a reload was asked for before the services watched; asks once.
    package static func takeReload() -> Bool { take(reload) }

    // Called once the services trap the three signals: this handler no longer runs, and the
    // flag is read and cleared without a race.
    private static func take(_ bit: sig_atomic_t) -> Bool {
        let arrived = earlySignalsArrived & bit != 0
        earlySignalsArrived &= ~bit
        return arrived
    }
}
