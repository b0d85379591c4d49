import CSystemd
import Foundation
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendPluginHost

/// The service manager's notification protocol (sd_notify), through libsystemd. Without
/// `NOTIFY_SOCKET` every call is a no-op, so whend runs the same by hand and under systemd.
final class ServiceNotifier: Sendable {
    /// Half of `WATCHDOG_USEC` when the service manager asks for pings, else nil.
    let watchdogInterval: TimeInterval?
    private let lastWatchdog = NIOLockedValueBox<Date>(.distantPast)

    init() {
        var usec: UInt64 = 0
        watchdogInterval = sd_watchdog_enabled(0, &usec) > 0 && usec > 0 ? Double(usec) / 2e6 : nil
    }

    func ready(status: String) { send("READY=1\nSTATUS=\(status)") }
    func status(_ status: String) { send("STATUS=\(status)") }
    /// RELOADING=1 with the moment it began on CLOCK_MONOTONIC, as sd_notify(3) asks; READY=1
    /// follows once the reload is done.
    func reloading() {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let usec = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
        send("RELOADING=1\nMONOTONIC_USEC=\(usec)\nSTATUS=reloading the configuration")
    }

    func stopping() { send("STOPPING=1\nSTATUS=stopping: draining connections") }

    /// Sends WATCHDOG=1 if half the watchdog interval has passed since the last one.
    func watchdog() {
        guard let interval = watchdogInterval else { return }
        let now = Date()
        let due = lastWatchdog.withLockedValue { last in
            guard now.timeIntervalSince(last) >= interval * 0.9 else { return false }
            last = now
            return true
        }
        if due { send("WATCHDOG=1") }
    }

    private func send(_ state: String) {
        _ = sd_notify(0, state)
    }
}
