import Glibc
import Synchronization

/// Descriptors 3 and 4, where a plugin finds /dev/null in the processes that run pipeline
/// plugins (whend_plugin.h): a library that takes them for free ones of its own and writes to,
/// reads from or closes them must reach nothing of the process's.
///
/// A plugin that closes them in a call leaves them free, and the next descriptor opened takes
/// the lowest free number: a journal segment a pipeline was reading, its inotify watch, a cursor
/// being saved, a pipeline's pipes to whend in the shared host — each then closed or written to
/// by the plugin's next call (records skipped as if retention had deleted them, a pipeline
/// stalled for good, a cursor file corrupted, a forged report). So what whend opens there is
/// `opened` off them, and /dev/null goes back on them (`refill`) as each library loads and each
/// plugin is created, restored or destroyed: every library and instance finds it there.
///
/// Not after each `handle`, nor periodically: two system calls a record were too dear, and a
/// refill over a descriptor that another plugin of the process had opened there (and the
/// careless one closed) turned that plugin's failing writes into silent writes to /dev/null. A
/// plugin that closes descriptors it does not own can still break the other plugins of its
/// process, as it can by writing their memory: `isolation.<plugin> = process` keeps it alone.
package enum PluginDescriptors {
    package static let null: [Int32] = [3, 4]

    /// Set in the processes that run pipeline plugins (never in whend, where 3 and 4 are the
    /// daemon's first descriptors: /dev/null put over its event poll, closed by an ingest
    /// plugin, left it spinning rather than failing).
    package static let guarding = Atomic<Bool>(false)

    /// What `open` opens, moved above 4 (close-on-exec) when it landed on 3 or 4; -1 (errno set)
    /// if it could not be opened or moved. Costs nothing for a descriptor above them.
    /// - Parameter path: the file `open` opens, if it has one: what was moved is checked to be
    ///   it. In the shared host, a plugin on another thread could close the descriptor between
    ///   the open and the move, and another pipeline open its own file there: its cursor was
    ///   moved, written and renamed as this one's (an outside attack caught a cursor file left
    ///   empty for a save's length).
    package static func opened(path: String? = nil, _ open: () -> Int32) -> Int32 {
        for _ in 0..<8 {
            let fd = open()
            guard fd == 3 || fd == 4 else { return fd }
            let moved = fcntl(fd, F_DUPFD_CLOEXEC, 5)
            if moved >= 0 {
                if let path, !isFile(moved, at: path) {
                    // Not this thread's file any more: `fd` is another's now; open again.
                    close(moved)
                    continue
                }
                close(fd)
                return moved
            }
            // Closed under this thread (by a plugin's call on another): it is not this
            // thread's to close any more; open again.
            guard errno == EBADF else {
                let saved = errno
                close(fd)
                errno = saved
                return -1
            }
        }
        errno = EBADF
        return -1
    }

    private static func isFile(_ fd: Int32, at path: String) -> Bool {
        var opened = stat()
        var named = stat()
        return fstat(fd, &opened) == 0 && stat(path, &named) == 0 && opened.st_dev == named.st_dev
            && opened.st_ino == named.st_ino
    }

    /// Puts /dev/null back on each of 3 and 4 that is free, in a process that runs pipeline
    /// plugins. Never over one that is open: another thread may have just taken it.
    package static func refill() {
        guard guarding.load(ordering: .relaxed) else { return }
        for fd in null where fcntl(fd, F_GETFD) == -1 {
            let opened = open("/dev/null", O_RDWR)
            // Another thread took `fd` meanwhile: what open gave is not ours to keep.
            if opened >= 0, opened != fd { close(opened) }
        }
    }
}
