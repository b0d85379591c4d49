import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

extension PipelineSupervisor {
    package struct State {
        package var pid: pid_t = 0
        package var cursor: UInt64 = 0
        /// Failed attempts and dead letters since whend started (each worker counts its own).
        package var failures = 0
        package var deadLetters = 0
        var failuresBefore = 0
        var deadLettersBefore = 0
        /// Deaths of the shared host in a row while this pipeline ran there, and until when the
        /// pipeline runs in a process of its own for them.
        var hostDeaths = 0
        var ownProcessUntil: Date?
        /// Records the worker found gone from the journal (retention) and skipped.
        package var skipped: UInt64 = 0
        package var restarts = 0
        package var running = false
        package var stopping = false
        package var lastReport = Date()
        package var lastExit: String?
        /// The last derived record appended, as (its cause, its ordinal among that cause's).
        /// A restarted worker handles again the records after its saved cursor, and derives
        /// again what was derived from them: those are not appended twice.
        package var appendedThrough: (cause: UInt64, ordinal: Int) = (0, 0)
        /// How far derived records are known stored, in the same terms: `appendedThrough`
        /// runs ahead of it while batches are in the journal's hands.
        package var storedThrough: (cause: UInt64, ordinal: Int) = (0, 0)
        /// Batches handed to the journal and not yet answered.
        package var appending = 0
        /// A batch was not stored: the generation whose worker is stopped for it, so that the
        /// next one derives its records again and they are appended then.
        package var failedGeneration: UInt64?
        /// The current worker's position in the same terms.
        package var runCause: UInt64 = 0
        package var runOrdinal = 0
        /// The current worker's generation: acknowledgements carry it, and one meant for an
        /// earlier worker is never counted for a later one.
        package var generation: UInt64 = 0
        /// The record workers last died on, and how many times in a row.
        package var deaths: (seq: UInt64, count: Int) = (0, 0)
        /// The record the next workers write to the dead letters rather than handle, and why.
        package var poison: (seq: UInt64, why: String)?
        /// The worker was stopped for no fault of the record in hand (a failed store, a restart
        /// asked for): its death is not counted against that record.
        package var excused = false
        /// A restart asked for before the worker could be told (its pipe not yet open).
        var restartAsked = false
        /// The record this pipeline had in hand when the shared host died: whose plugin crashed
        /// it is not known, so the pipeline handles that record again in a process of its own,
        /// where a crash is its own, and goes back to the host once past it.
        package var quarantine: UInt64?
        /// Each stage's counters as the current worker last reported them, and the sum of what
        /// earlier workers reported: together, the counts since whend started.
        package var counters: [String: [String: Int64]] = [:]
        package var countersBefore: [String: [String: Int64]] = [:]

        /// Each stage's counters since whend started (a record handled again after a worker's
        /// restart counts again).
        package var countersSinceStart: [String: [String: Int64]] {
            countersBefore.merging(counters) { before, now in
                before.merging(now) { a, b in
                    let (sum, overflow) = a.addingReportingOverflow(b)
                    return overflow ? (b > 0 ? .max : .min) : sum
                }
            }
        }
    }
}
