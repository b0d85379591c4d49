import CWhendPlugin
import Foundation
import Logging
import WhendJournal
import WhendWire

/// What a pipeline worker is told when it starts (as JSON on its command line).
public struct PipelineSpec: Codable, Sendable, Equatable {
    public struct Stage: Codable, Sendable, Equatable {
        public var plugin: String
        public var configuration: String
    }

    public var name: String
    public var stages: [Stage]
    public var journalDirectory: String
    /// The pipeline's own directory: its cursor and dead letters.
    public var directory: String
    /// Where each plugin keeps its state: `<pluginStateRoot>/<plugin>`.
    public var pluginStateRoot: String
    public var pluginDirectories: [String]
    /// Attempts at one record before it goes to the dead letters; 0: retry forever.
    public var retryLimit: Int

    var cursorPath: String { directory + "/cursor" }
    var deadLetterPath: String { directory + "/dead-letter.jsonl" }

    /// The last `_seq` the pipeline finished, as it was last saved.
    static func savedCursor(at path: String) -> UInt64 {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return 0 }
        return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }
}

/// Records handled but not finished yet: a deferred stage has not completed them, or whend
/// has not yet stored the records derived from them. The cursor saved stays below the oldest.
final class CompletionTracker: @unchecked Sendable {
    // Unchecked: guarded by `lock`; completions come from other threads.
    private let lock = NSCondition()
    /// What each record still waits for (completions and acknowledgements).
    private var pending: [UInt64: Int] = [:]
    /// Completions that came before the worker marked the record accepted.
    private var early: [UInt64: Int] = [:]

    /// Record `seq` is done once `count` completions for it have come.
    func accept(_ seq: UInt64, count: Int) {
        guard count > 0 else { return }
        lock.withLock {
            let left = count - (early.removeValue(forKey: seq) ?? 0)
            if left > 0 { pending[seq] = left }
        }
    }

    func complete(_ seq: UInt64) {
        lock.withLock {
            if let left = pending[seq] {
                pending[seq] = left > 1 ? left - 1 : nil
                if pending.isEmpty { lock.broadcast() }
            } else {
                // Bounded: completions of records never accepted must not grow this.
                if early.count >= 1 << 16 { early.removeAll() }
                early[seq, default: 0] += 1
            }
        }
    }

    /// The highest `_seq` up to which everything handled is finished.
    func watermark(acceptedThrough cursor: UInt64) -> UInt64 {
        lock.withLock { pending.keys.min().map { $0 - 1 } ?? cursor }
    }

    /// Waits until nothing is pending, at most `seconds`.
    func drain(seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        lock.withLock {
            while !pending.isEmpty && lock.wait(until: deadline) {}
        }
    }
}

/// Set by SIGTERM in a worker; read between records.
nonisolated(unsafe) private var workerStopRequested: sig_atomic_t = 0

/// A pipeline's worker process: it loads the pipeline's plugins, reads the journal itself from
/// the pipeline's cursor, in `_seq` order, and runs each record through the chain.
///
/// It talks to the daemon in JSON lines on standard output: `{"progress":…}` at least twice a
/// second (the daemon's watchdog for it) and `{"emit":…}` for each derived record. A record
/// whose chain fails is retried with backoff, and never skipped unless `retryLimit` says so;
/// then it goes to the dead letters. The cursor is saved every 100 ms and at exit, so that a
/// crash repeats at most the records of the last 100 ms: at least once, in order.
public enum PipelineWorker {
    public static func run(_ spec: PipelineSpec, logger: Logger) -> Never {
        signal(SIGPIPE, SIG_IGN)
        // SIGTERM (the daemon stopping the pipeline): finish the record in hand, save the
        // cursor, let the plugins close (destroy), exit 0. The daemon's blocked signals are
        // inherited across exec, so unblock it first.
        var terminate = sigset_t()
        sigemptyset(&terminate)
        sigaddset(&terminate, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &terminate, nil)
        signal(SIGTERM) { _ in workerStopRequested = 1 }
        let output = WorkerOutput()
        var chain: PluginChain
        let completions = CompletionTracker()
        var deferred = false
        do {
            try FileManager.default.createDirectory(atPath: spec.directory, withIntermediateDirectories: true)
            var instances: [PluginInstance] = []
            for (index, stage) in spec.stages.enumerated() {
                let library = try PluginLibrary.load(name: stage.plugin, directories: spec.pluginDirectories)
                if library.roles & WHEND_ROLE_DEFERRED != 0 {
                    guard index == spec.stages.count - 1 else {
                        throw PluginLoadError(
                            description:
                                "plugin \(stage.plugin) finishes records later, so it must be the last stage of pipeline \(spec.name)"
                        )
                    }
                    deferred = true
                }
                instances.append(
                    try PluginInstance(
                        library: library, configuration: stage.configuration,
                        stateDirectory: spec.pluginStateRoot + "/" + stage.plugin, logger: logger,
                        emit: { plugin, json in output.emit(json, origin: plugin) },
                        complete: { seq in completions.complete(seq) }))
            }
            chain = PluginChain(instances)
        } catch {
            logger.error("pipeline \(spec.name): \(error)")
            exit(3)
        }
        // whend acknowledges each derived record it stored with its cause, one line each, on
        // standard input; the end of it means whend is gone.
        Thread {
            var pending: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(0, &buffer, buffer.count)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { exit(4) }
                pending += buffer[0..<n]
                while let newline = pending.firstIndex(of: 0x0A) {
                    if let cause = UInt64(String(decoding: pending[..<newline], as: UTF8.self)) {
                        completions.complete(cause)
                    }
                    pending.removeSubrange(...newline)
                }
            }
        }.start()
        var cursor = PipelineSpec.savedCursor(at: spec.cursorPath)
        var savedCursor = cursor
        var failures = 0
        var deadLetters = 0
        var lastSave = Date()
        var lastProgress = Date.distantPast

        // Called after every record; the work is done at most every 0.1 s. The cursor saved is
        // below the oldest record not finished (a deferred stage's, or one whose derived
        // records whend has not stored yet).
        func report(force: Bool = false) {
            let now = Date()
            let saveDue = force || now.timeIntervalSince(lastSave) >= 0.1
            let progressDue = force || now.timeIntervalSince(lastProgress) >= 0.25
            guard saveDue || progressDue else { return }
            let durable = completions.watermark(acceptedThrough: cursor)
            if saveDue, durable != savedCursor {
                save(durable, to: spec.cursorPath)
                savedCursor = durable
                lastSave = now
            }
            if progressDue {
                output.progress(cursor: durable, failures: failures, deadLetters: deadLetters)
                lastProgress = now
            }
        }

        report(force: true)
        JournalReader(directory: JournalDirectory(path: spec.journalDirectory)).read(
            fromSeq: cursor + 1, follow: true,
            body: { record, _ in
                guard workerStopRequested == 0 else { return false }
                guard let seq = record.seq, seq > cursor else { return true }
                var attempt = 0
                while true {
                    output.cause = seq
                    output.emitted = 0
                    let outcome = chain.run(record.line, seq: seq)
                    // Finished once the deferred stage completes it (if it reached it) and whend
                    // has stored what it derived.
                    switch outcome {
                    case .unchanged, .changed: completions.accept(seq, count: output.emitted + (deferred ? 1 : 0))
                    case .dropped: completions.accept(seq, count: output.emitted)
                    case .rejected: break
                    }
                    if case .rejected(let why) = outcome {
                        attempt += 1
                        failures += 1
                        if spec.retryLimit > 0 && attempt >= spec.retryLimit {
                            deadLetter(record.line, seq: seq, why: why, to: spec.deadLetterPath)
                            deadLetters += 1
                            logger.error(
                                "pipeline \(spec.name): _seq \(seq) failed \(attempt) times (\(why)); written to \(spec.deadLetterPath)"
                            )
                            break
                        }
                        let delay = min(30, 0.05 * pow(2, Double(min(attempt, 20))))
                        if attempt == 1 || attempt % 10 == 0 {
                            logger.warning(
                                "pipeline \(spec.name): _seq \(seq) failed (\(why)); attempt \(attempt), retrying in \(String(format: "%.2f", delay)) s"
                            )
                        }
                        // Sleep in slices, reporting, so that the daemon sees the worker alive.
                        let until = Date().addingTimeInterval(delay)
                        while Date() < until && workerStopRequested == 0 {
                            report()
                            Thread.sleep(forTimeInterval: min(0.1, max(0, until.timeIntervalSinceNow)))
                        }
                        // Stopping: the record is not done, so the cursor stays before it.
                        if workerStopRequested != 0 { return false }
                        continue
                    }
                    break
                }
                cursor = seq
                report()
                return true
            },
            onCaughtUp: {
                report()
                return workerStopRequested == 0
            },
            onProblem: { problem in logger.warning("pipeline \(spec.name): \(problem)") })
        // The plugins close before the process ends (an analytics spool, a session index, a
        // deferred stage waiting for its last acknowledgements), then the cursor is saved.
        chain = PluginChain([])
        completions.drain(seconds: 1)
        report(force: true)
        exit(0)
    }

    /// Written beside, then renamed: a crash leaves the old cursor or the new one, never half.
    static func save(_ cursor: UInt64, to path: String) {
        let temporary = path + ".new"
        guard (try? "\(cursor)\n".write(toFile: temporary, atomically: false, encoding: .utf8)) != nil else { return }
        rename(temporary, path)
    }

    static func deadLetter(_ line: UnsafeBufferPointer<UInt8>, seq: UInt64, why: String, to path: String) {
        var entry = Array(#"{"_seq":\#(seq),"error":"#.utf8)
        appendJSONString(Array(why.utf8), to: &entry)
        entry += Array(#","record":"#.utf8)
        entry += line
        entry += Array("}\n".utf8)
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        _ = entry.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}

/// The worker's side of the pipe to the daemon.
final class WorkerOutput: @unchecked Sendable {
    // Unchecked: the worker is single-threaded; plugins call emit from inside handle.
    var cause: UInt64 = 0
    /// Derived records emitted for the current record.
    var emitted = 0

    func progress(cursor: UInt64, failures: Int, deadLetters: Int) {
        writeLine(#"{"progress":{"cursor":\#(cursor),"failures":\#(failures),"dead_letters":\#(deadLetters)}}"#)
    }

    /// A derived record, for the daemon to append with `_origin` and `_cause`.
    func emit(_ json: UnsafeBufferPointer<UInt8>, origin: String) -> Bool {
        var line = Array(#"{"emit":{"cause":\#(cause),"origin":"#.utf8)
        appendJSONString(Array(origin.utf8), to: &line)
        line += Array(#","record":"#.utf8)
        // One line per message: a record with a raw newline would split it.
        guard (try? StoredRecord.scan(json)) != nil, !json.contains(0x0A) else { return false }
        line += json
        line += Array("}}".utf8)
        emitted += 1
        return writeLine(String(decoding: line, as: UTF8.self))
    }

    @discardableResult
    private func writeLine(_ text: String) -> Bool {
        var bytes = Array(text.utf8)
        bytes.append(0x0A)
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { write(1, $0.baseAddress! + done, $0.count - done) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { exit(4) }  // the daemon is gone: nothing to report to
            done += n
        }
        return true
    }
}
