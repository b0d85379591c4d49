import Glibc

/// Descriptors 3 and 4, where a plugin finds /dev/null in the processes that run pipeline
/// plugins (whend_plugin.h): a library that takes them for free ones of its own and writes to,
/// reads from or closes them must reach nothing of the process's.
///
/// A plugin that closes them in a call leaves them free, and the next descriptor the process
/// opens takes the lowest free number: a journal segment a pipeline was reading, its inotify
/// watch, a cursor being saved, a pipeline's pipes to whend in the shared host — each then
/// closed or written to by the plugin's next call (records skipped as if retention had deleted
/// them, a pipeline stalled for good, a cursor file corrupted, a forged report). So what the
/// process keeps across plugin calls is `lift`ed off them, and /dev/null is put back on them
/// (`refill`) after each plugin call but `handle` (two system calls a record was too dear) and
/// every time a pipeline saves its cursor.
package enum PluginDescriptors {
    package static let null: [Int32] = [3, 4]

    /// `fd`, or a duplicate of it above 4 (close-on-exec) when it landed on 3 or 4; -1 (errno
    /// set) if it could not be moved. Costs nothing for a descriptor above them, as every one
    /// is while they hold /dev/null (or, in whend itself, the daemon's first descriptors).
    package static func lift(_ fd: Int32) -> Int32 {
        guard fd == 3 || fd == 4 else { return fd }
        let moved = fcntl(fd, F_DUPFD_CLOEXEC, 5)
        let saved = errno
        close(fd)
        errno = saved
        return moved
    }

    /// Puts /dev/null back on each of 3 and 4 that is free. Never over one that is open: in
    /// whend itself they are the daemon's, and another thread may have just taken one.
    package static func refill() {
        for fd in null where fcntl(fd, F_GETFD) == -1 {
            let opened = open("/dev/null", O_RDWR)
            // Another thread took `fd` meanwhile: what open gave is not ours to keep.
            if opened >= 0, opened != fd { close(opened) }
        }
    }
}
