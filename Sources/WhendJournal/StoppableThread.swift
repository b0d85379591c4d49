import Foundation

/// A thread of the journal's that waits on its owner's `NSCondition` for work, and how the owner
/// stops it: `stop(_:)` sets `isStopping` and wakes the thread under that lock, then waits until
/// the thread's loop has returned, having done what it still had to do (the writer commits what
/// is queued and seals; the sync thread acknowledges every group handed to it).
final class StoppableThread: @unchecked Sendable {
    // Unchecked: `isStopping` is guarded by the owner's condition; `ended` is a semaphore.
    /// Read only with the owner's condition locked.
    private(set) var isStopping = false
    private let ended = DispatchSemaphore(value: 0)

    /// Runs `loop` on a new thread called `name`; the loop returns once it has seen
    /// `isStopping` and finished.
    func start(name: String, _ loop: @escaping @Sendable () -> Void) {
        let thread = Thread { [ended] in
            loop()
            ended.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Asks the thread to stop, and returns once its loop has.
    func stop(_ condition: NSCondition) {
        condition.lock()
        isStopping = true
        condition.signal()
        condition.unlock()
        ended.wait()
    }
}
