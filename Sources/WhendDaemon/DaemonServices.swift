import Foundation
import Logging
import NIOConcurrencyHelpers
import ServiceLifecycle
import UnixSignals
import WhendConfiguration
import WhendPluginHost
import WhendSystem
import WhendWire

/// whend as a `ServiceGroup`: the journal, the plugins, the event socket and the control
/// socket, each a service whose steps are `Daemon`'s.
///
/// The order is declared once, in `steps`: each service starts when the one before it has
/// started (so nothing is accepted before the journal and the pipelines run), whend says it is
/// ready (`READY=1`) when the last has, and at SIGTERM or SIGINT the group stops them in the
/// reverse order, each after the one after it has stopped: the control socket closes, then
/// connections drain, then the pipelines stop, then the journal commits and seals. A step that fails
/// to start stops those already started, in the same order, and whend exits with its error.
package struct DaemonServices: Sendable {
    private let group: ServiceGroup

    /// `stopSignals`: what stops whend gracefully; a program that embeds the daemon (the tests)
    /// passes none and calls `stop()`.
    package init(_ daemon: Daemon, stopSignals: [UnixSignal] = [.sigterm, .sigint]) {
        // The threads a step starts (the writer, supervisors) block no signal; what blocks (the
        // plugin check, a pipeline's stop) runs on a thread of its own, not in `run()`.
        let steps: [(name: String, start: @Sendable () async throws -> Void, stop: @Sendable () async -> Void)] = [
            (
                "journal", { TerminationSignals.withNoneBlocked { daemon.startJournal() } },
                { await daemon.stopJournal() }
            ),
            (
                "plugins",
                {
                    try await onAThreadOfItsOwn {
                        try TerminationSignals.withNoneBlocked { try daemon.configurations.startPlugins() }
                    }
                },
                { await onAThreadOfItsOwn { daemon.pipelines.stopAll() } }
            ),
            ("events", { try await daemon.startEvents() }, { await daemon.stopEvents() }),
            ("control", { try await daemon.startControl() }, { await daemon.control.stop() }),
        ]
        let startup = StartupOrder(count: steps.count)
        var services = steps.enumerated().map { index, step in
            ServiceGroupConfiguration.ServiceConfiguration(
                service: Step(index: index, startup: startup, start: step.start, stop: step.stop),
                // A step that cannot start stops the others in order, as SIGTERM does.
                successTerminationBehavior: .gracefullyShutdownGroup,
                failureTerminationBehavior: .gracefullyShutdownGroup, serviceName: step.name)
        }
        services.append(
            .init(service: daemon.configurations, successTerminationBehavior: .ignore, serviceName: "reload"))
        // The group traps the stop signals before it runs a service: one that came earlier is
        // acted on now (`EarlySignals`).
        let started = NIOLockedValueBox<ServiceGroup?>(nil)
        let stop: @Sendable () async -> Void = { await started.withLockedValue { $0 }?.triggerGracefulShutdown() }
        services.append(
            .init(service: EarlyStop(stop: stop), successTerminationBehavior: .ignore, serviceName: "early-stop"))
        services.append(
            .init(
                service: Readiness(startup: startup, daemon: daemon, stop: stop), successTerminationBehavior: .ignore,
                serviceName: "readiness"))
        var configuration = ServiceGroupConfiguration(
            services: services, gracefulShutdownSignals: stopSignals, logger: Self.quiet(daemon.logger))
        // Each step bounds its own stop (connections drain within shutdown_timeout).
        configuration.maximumGracefulShutdownDuration = nil
        group = ServiceGroup(configuration: configuration)
        started.withLockedValue { $0 = group }
    }

    /// Runs until a stop signal (or `stop()`) has stopped every service; throws what kept one
    /// from starting.
    package func run() async throws {
        try await group.run()
    }

    /// Stops whend as SIGTERM does: the steps in reverse order, each after the one after it.
    package func stop() async {
        await group.triggerGracefulShutdown()
    }

    /// The group's own lines (a service started, stopped) only when whend logs at notice or
    /// above anyway: at info they would crowd whend's own.
    private static func quiet(_ logger: Logger) -> Logger {
        var logger = logger
        if logger.logLevel < .notice { logger.logLevel = .notice }
        return logger
    }
}

/// Which steps have started, for the next one to wait on.
actor StartupOrder {
    enum Outcome { case started, failed }
    private var outcomes: [Int: Outcome] = [:]
    private var waiting: [Int: [CheckedContinuation<Outcome, Never>]] = [:]
    let count: Int

    init(count: Int) { self.count = count }

    func settle(_ index: Int, _ outcome: Outcome) {
        outcomes[index] = outcome
        for continuation in waiting.removeValue(forKey: index) ?? [] { continuation.resume(returning: outcome) }
    }

    /// Until step `index` has started or failed; a step before it that failed fails it too.
    func outcome(of index: Int) async -> Outcome {
        if let known = outcomes[index] { return known }
        return await withCheckedContinuation { waiting[index, default: []].append($0) }
    }
}

/// One of whend's steps as a service: starts after the step before it, then waits for the
/// graceful shutdown (or cancellation) and stops.
private struct Step: Service {
    let index: Int
    let startup: StartupOrder
    let start: @Sendable () async throws -> Void
    let stop: @Sendable () async -> Void

    func run() async throws {
        if index > 0, await startup.outcome(of: index - 1) == .failed {
            // Not started, so nothing to stop: wait for the shutdown the failed step began (a
            // step that returned now would be a second, unexpected, end for the group to report).
            await startup.settle(index, .failed)
            await untilGracefulShutdown()
            return
        }
        do {
            try await start()
        } catch {
            await startup.settle(index, .failed)
            throw error
        }
        await startup.settle(index, .started)
        // A graceful shutdown and a cancellation (another step failed) end the same way.
        await untilGracefulShutdown()
        await stop()
    }
}

/// Says whend is ready once every step has started.
private struct Readiness: Service {
    let startup: StartupOrder
    let daemon: Daemon
    let stop: @Sendable () async -> Void

    func run() async throws {
        guard await startup.outcome(of: startup.count - 1) == .started else { return }
        daemon.announceReady()
        // A stop the early handler caught after `EarlyStop` looked is acted on now, not lost:
        // whether the group's handling of the signals is wholly in place by then is the
        // runtime's to say (a SIGTERM while whend started once left it running, in a loaded
        // run of `aSignalWhileWhendStartsIsActedOnOnceItRuns`).
        if EarlySignals.takeStop() {
            await stop()
            await untilGracefulShutdown()
            return
        }
        // A SIGHUP while whend started: the configuration it started with may already be old.
        if EarlySignals.takeReload() {
            let configurations = daemon.configurations
            await onAThreadOfItsOwn { _ = configurations.reload(trigger: "SIGHUP") }
        }
        await untilGracefulShutdown()
    }
}

/// Stops whend if SIGTERM or SIGINT came before the group trapped them.
private struct EarlyStop: Service {
    let stop: @Sendable () async -> Void

    func run() async throws {
        guard EarlySignals.takeStop() else { return }
        await stop()
        // Ended in its turn of the shutdown, not before: a service that ends while the group
        // stops the ones after it "finished unexpectedly", and whend exited 1 on a SIGTERM that
        // came while it started (seen in a CI run of the socket activation test).
        await untilGracefulShutdown()
    }
}

/// Runs `body`, which blocks (joins a thread, waits for processes), on a thread of its own: a
/// service's `run()` must not hold one of the few threads Swift's concurrency runs tasks on.
func onAThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { done in
        Thread { done.resume(with: Result { try body() }) }.start()
    }
}

func onAThreadOfItsOwn(_ body: @escaping @Sendable () -> Void) async {
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        Thread {
            body()
            done.resume()
        }.start()
    }
}

/// Runs `body` on a thread of its own; true once it returns, false if `seconds` pass first (the
/// thread is left to finish, or to end with the process).
func onAThreadOfItsOwn(within seconds: TimeInterval, _ body: @escaping @Sendable () -> Void) async -> Bool {
    let settled = NIOLockedValueBox(false)
    return await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
        @Sendable func settle(_ finished: Bool) {
            let first = settled.withLockedValue { was in
                defer { was = true }
                return !was
            }
            if first { done.resume(returning: finished) }
        }
        Thread {
            body()
            settle(true)
        }.start()
        DispatchQueue.global().asyncAfter(deadline: .now() + max(0, seconds)) { settle(false) }
    }
}

/// Returns once the group's graceful shutdown has begun, or the task is cancelled.
///
/// Not ServiceLifecycle's `gracefulShutdown()`: that resumes its waiter from an unstructured
/// task, which runs on Swift's shared threads whatever executor the service was given, so a
/// daemon embedded in a program that holds those threads (the tests, blocked on sockets) would
/// never stop. This one is resumed by the handler itself.
func untilGracefulShutdown() async {
    let signal = OneTimeSignal()
    await withTaskCancellationHandler {
        await withGracefulShutdownHandler {
            await signal.wait()
        } onGracefulShutdown: {
            signal.fire()
        }
    } onCancel: {
        signal.fire()
    }
}

/// Fired once; every wait before or after returns once it has been.
private final class OneTimeSignal: Sendable {
    private let state = NIOLockedValueBox<(fired: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func fire() {
        let waiting = state.withLockedValue { state in
            state.fired = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }

    func wait() async {
        await withCheckedContinuation { continuation in
            let fired = state.withLockedValue { state in
                if !state.fired { state.waiting.append(continuation) }
                return state.fired
            }
            if fired { continuation.resume() }
        }
    }
}
