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
public enum TerminationSignals {
    public static let stopping: [Int32] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT]

    public static func unblock(_ signals: [Int32] = stopping) {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }
}
