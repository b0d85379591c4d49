import Foundation

/// How long a pipeline's supervisor waits before it starts a worker again: `first`, doubling
/// up to `longest` while workers die in a loop, and `first` again after a worker whose end was
/// no crash loop — it ran a good while, moved its cursor on, was asked to end, or died with the
/// shared host (not its doing, as far as it knows). It decides from what it is told alone, so
/// it is tested without processes or time (`RestartBackoffTests`).
package struct RestartBackoff: Sendable {
    package static let first: TimeInterval = 0.1
    package static let longest: TimeInterval = 10
    /// A worker that ran this long is no crash loop.
    package static let goodRun: TimeInterval = 60

    /// How a worker ended.
    package struct WorkerEnd: Sendable {
        package var ranFor: TimeInterval
        package var movedOn: Bool
        package var asked: Bool
        package var withTheHost: Bool

        package init(ranFor: TimeInterval, movedOn: Bool, asked: Bool, withTheHost: Bool) {
            self.ranFor = ranFor
            self.movedOn = movedOn
            self.asked = asked
            self.withTheHost = withTheHost
        }

        var isCrashLoop: Bool { ranFor <= RestartBackoff.goodRun && !movedOn && !asked && !withTheHost }
    }

    private var next = first

    package init() {}

    /// The wait before the next worker, after `end`.
    package mutating func wait(after end: WorkerEnd) -> TimeInterval {
        if !end.isCrashLoop { next = Self.first }
        let wait = next
        next = min(Self.longest, next * 2)
        return wait
    }
}
