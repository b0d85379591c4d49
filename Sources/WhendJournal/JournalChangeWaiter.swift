import Foundation
import WhendSystem

/// Waits for the journal directory to change (a commit written, a segment opened or sealed),
/// through inotify, so that a following reader wakes as soon as the writer commits rather
/// than at its next poll. Where inotify cannot be had, it waits the whole timeout.
final class JournalChangeWaiter {
    private let fd: Int32
    private var events = [UInt8](repeating: 0, count: 4096)

    init(directory: String) {
        // Kept open across the pipeline's plugin calls.
        var fd = PluginDescriptors.opened { inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC)) }
        if fd >= 0 {
            let mask = UInt32(IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE)
            if inotify_add_watch(fd, directory, mask) < 0 {
                close(fd)
                fd = -1
            }
        }
        self.fd = fd
    }

    deinit { if fd >= 0 { close(fd) } }

    /// Returns once something changed since the last call (at once if it already has), or
    /// after `timeout` seconds.
    func wait(timeout: TimeInterval) {
        guard fd >= 0 else {
            Thread.sleep(forTimeInterval: timeout)
            return
        }
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        _ = poll(&entry, 1, Int32(timeout * 1000))
        // Drain: what matters is that something changed, not what.
        while events.withUnsafeMutableBytes({ read(fd, $0.baseAddress, $0.count) }) > 0 {}
    }
}
