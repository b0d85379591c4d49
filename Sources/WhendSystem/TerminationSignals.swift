#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A process inherits the signal mask of the thread that started it. Threads of libdispatch (and
/// so of Swift concurrency, and a Foundation `Process` run from a task) block SIGTERM, SIGINT and
/// SIGHUP; a tool started from one would never stop when asked, and `whenctl tail -f` or
/// `whend-demo` would outlive whatever started them. Tools that stop by those signals' default
/// action unblock them first. Dispositions are left alone: a parent that chose to ignore one
/// (`nohup`) still has its way.
package enum TerminationSignals {
    package static let stopping: [Int32] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT]

    package static func unblock(_ signals: [Int32] = stopping) {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// Runs `body` with no signal blocked on this thread, so that the threads it starts block
    /// none either (a thread inherits its creator's mask). whend starts its event loops and its
    /// writer from Swift concurrency's threads, which block SIGABRT among others: a stopped whend
    /// killed by systemd's watchdog (SIGABRT, then SIGCONT) then had an event loop thread run on
    /// and accept a connection waiting in the kernel before the signal ended the process, and
    /// that client was reset instead of being served by the next whend.
    package static func withNoneBlocked<T>(_ body: () throws -> T) rethrows -> T {
        var none = sigset_t()
        sigemptyset(&none)
        var previous = sigset_t()
        pthread_sigmask(SIG_SETMASK, &none, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        return try body()
    }
}
