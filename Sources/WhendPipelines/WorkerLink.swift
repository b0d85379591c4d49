import CLinux
import CWhendPlugin
import Foundation
import Logging
import Synchronization
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendSystem
import WhendWire

/// Where a worker's frames go and come from once it moved them away from 3 and 4.
enum WorkerChannel {
    /// Above the descriptors a plugin would pick by hand.
    static let lowest: Int32 = 100
}

/// One pipeline run's ends of its pipes to the daemon, and whether it was asked to stop. A
/// worker process has one; the shared pipeline host one per pipeline it runs.
final class WorkerLink: @unchecked Sendable {
    // Unchecked: the descriptors are set once; `stopAsked` is an atomic.
    let report: Int32
    let command: Int32
    /// A worker process exits when the daemon is gone; in the shared host, only the pipeline
    /// ends (the host itself goes when its socket to the daemon closes).
    let exitsProcess: Bool
    private let stopAsked = Atomic<Bool>(false)
    /// The reader of the daemon's acknowledgements started: it closes `command` when the
    /// daemon closes its end (closing it under a blocked read would not wake the read).
    let readerStarted = Atomic<Bool>(false)

    init(report: Int32, command: Int32, exitsProcess: Bool) {
        self.report = report
        self.command = command
        self.exitsProcess = exitsProcess
    }

    /// Asked by the daemon (`stop`), by SIGTERM, or the daemon is gone.
    var stopRequested: Bool { workerStopRequested != 0 || stopAsked.load(ordering: .relaxed) }

    func requestStop() { stopAsked.store(true, ordering: .relaxed) }

    /// The daemon cannot be told anything more: gone (a worker process exits; the shared host
    /// exits within moments, when it sees its parent gone), or done with this pipeline.
    func daemonGone() {
        if exitsProcess { exit(4) }
        requestStop()
    }
}

/// The record a worker is handling, in `PipelineSpec.handlingPath`, mapped shared: one store
/// before and after each record, which whend reads once the worker is gone.
final class HandlingMarker: @unchecked Sendable {
    // Unchecked: written by the worker's thread only. Without a marker (it could not be mapped),
    // the worker runs as before (its deaths are not put down to a record).
    private let word: SharedWord?

    init(path: String) {
        word = SharedWord.create(path)
        word?.store(0)
    }

    func set(_ seq: UInt64) { word?.store(seq) }

    /// What a worker that is gone left in `path`: the record it was handling, or 0.
    static func read(_ path: String) -> UInt64 {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return 0 }
        defer { close(fd) }
        var value: UInt64 = 0
        return pread(fd, &value, 8, 0) == 8 ? value : 0
    }
}

/// Set by SIGTERM in a worker process or the shared host; read between records.
nonisolated(unsafe) var workerStopRequested: sig_atomic_t = 0
