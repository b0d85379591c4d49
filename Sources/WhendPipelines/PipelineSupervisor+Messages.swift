import CLinux
import Foundation
import Logging
import NIOConcurrencyHelpers
import WhendConfiguration
import WhendJournal
import WhendPluginHost
import WhendWire

extension PipelineSupervisor {
    func readReports(from fd: Int32, generation: UInt64) {
        var frames = WorkerFrameReader()
        do {
            _ = try frames.pump(fd) { payload throws(WorkerFrame.DecodeError) in
                handle(try WorkerFrame.decodeWorkerMessage(payload), generation: generation)
                return true
            }
        } catch {
            // A worker that writes what is not a message is broken: stop it.
            logger.error("pipeline \(spec.name): the worker's message cannot be read (\(error)); killing it")
            killWorker(why: "its message cannot be read")
        }
    }

    func handle(_ message: WorkerMessage, generation: UInt64) {
        switch message {
        case .progress(let cursor, let failures, let deadLetters, let skipped):
            let passed: pid_t? = state.withLockedValue { s in
                guard host != nil, let seq = s.quarantine, cursor >= seq, s.generation == generation else { return nil }
                s.quarantine = nil
                s.excused = true
                return s.pid
            }
            if let pid = passed, pid > 0 {
                logger.notice("pipeline \(spec.name): past the record it had in hand; back to the shared pipeline host")
                kill(pid, SIGTERM)
            }
            state.withLockedValue {
                $0.lastReport = Date()
                $0.cursor = cursor
                // The worker's word: past what an Int holds is the most it holds, not a trap.
                $0.failures = $0.failuresBefore &+ Int(clamping: failures)
                $0.deadLetters = $0.deadLettersBefore &+ Int(clamping: deadLetters)
                $0.skipped = skipped
            }
        case .ended(let status):
            ended.withLockedValue { $0 = status }
        case .counters(let plugin, let values):
            // Only the pipeline's own stages: a worker's word names no other plugin.
            guard spec.stages.contains(where: { $0.plugin == plugin }) else { return }
            state.withLockedValue { if $0.generation == generation { $0.counters[plugin] = values } }
        case .derived(let batch, let records):
            // Each record's place as (its cause, its ordinal among that cause's): what was
            // appended before (by this daemon, or found in the journal at start) is not again.
            enum Take {
                /// A batch was not stored and the worker is being stopped: dropped, unanswered.
                case refused
                case fresh([DerivedRecord], through: (cause: UInt64, ordinal: Int))
            }
            // The worker's word, checked: each record's cause is one this worker can have
            // handled (in the journal, in order) and its origin one of the pipeline's stages. A
            // forged one (a plugin writing frames of its own) is not stored, and the worker that
            // sent it is killed: a cause believed past the journal's end would have every later
            // derived record taken for one already appended.
            // A worker reads a record as soon as it is written, maybe before its sync: the bound
            // is what the journal has written, so that a slow disk makes no worker a forger.
            let lastSeq = journalWrittenThrough()
            let forged = state.withLockedValue { s -> String? in
                var previous = s.runCause
                for r in records {
                    if r.cause == 0 || r.cause < previous {
                        return "_cause \(r.cause) after _cause \(previous)"
                    }
                    if r.cause > lastSeq {
                        return "_cause \(r.cause), past the journal's last _seq \(lastSeq)"
                    }
                    if let origins = spec.origins, !origins.contains(r.origin) {
                        return "_origin \(r.origin), not one of the pipeline's plugins \(origins)"
                    }
                    previous = r.cause
                }
                return nil
            }
            if let forged {
                logger.error(
                    "pipeline \(spec.name): its worker sent a derived record it cannot have derived (\(forged)); nothing of its batch is stored; killing it"
                )
                if state.withLockedValue({ $0.generation == generation }) {
                    killWorker(why: "it sent a derived record it cannot have derived")
                }
                return
            }
            let take = state.withLockedValue { s -> Take in
                s.lastReport = Date()
                // Its successor derives it all again, and it is appended then.
                guard s.failedGeneration == nil else { return .refused }
                let fresh = records.filter { r in
                    if r.cause != s.runCause {
                        s.runCause = r.cause
                        s.runOrdinal = 0
                    }
                    s.runOrdinal += 1
                    guard (r.cause, s.runOrdinal) > s.appendedThrough else { return false }
                    s.appendedThrough = (r.cause, s.runOrdinal)
                    return true
                }
                if !fresh.isEmpty { s.appending += 1 }
                return .fresh(fresh, through: s.appendedThrough)
            }
            guard case .fresh(let fresh, let through) = take else { return }
            if fresh.isEmpty {
                acknowledge(generation: generation, batch: batch)
                return
            }
            appendDerived(fresh) { [self] stored in
                // Answered in the order appended: what is known stored moves on only while
                // nothing before it failed.
                let stop = state.withLockedValue { s -> Bool in
                    s.appending -= 1
                    if stored {
                        if s.failedGeneration == nil, through > s.storedThrough { s.storedThrough = through }
                        return false
                    }
                    guard s.failedGeneration == nil else { return false }
                    // The worker running now (this batch's, or one started since, which passed
                    // these records as appended) stops; the next one starts from what is stored.
                    s.failedGeneration = s.generation
                    s.excused = true
                    return s.pid > 0
                }
                if stored {
                    acknowledge(generation: generation, batch: batch)
                } else if stop {
                    logger.error(
                        "pipeline \(spec.name): derived records were not stored; its worker restarts and derives them again"
                    )
                    killWorker(why: "derived records were not stored")
                }
            }
        }
    }
}
