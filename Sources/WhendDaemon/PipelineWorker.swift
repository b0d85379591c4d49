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

/// Records a deferred stage accepted and has not completed yet.
final class CompletionTracker: @unchecked Sendable {
    // Unchecked: guarded by `lock`; `complete` comes from the plugin's threads.
    private let lock = NSLock()
    private var pending: Set<UInt64> = []
    /// Completions that came before the worker marked the record accepted.
    private var early: Set<UInt64> = []

    func accept(_ seq: UInt64) {
        lock.withLock {
            if early.remove(seq) == nil { pending.insert(seq) }
        }
    }

    func complete(_ seq: UInt64) {
        lock.withLock {
            if pending.remove(seq) == nil {
                // Bounded: a plugin completing records it never accepted must not grow this.
                if early.count >= 1 << 16 { early.removeAll() }
                early.insert(seq)
            }
        }
    }

    /// The highest `_seq` up to which everything accepted is complete.
    func watermark(acceptedThrough cursor: UInt64) -> UInt64 {
        lock.withLock { pending.min().map { $0 - 1 } ?? cursor }
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
        var cursor = PipelineSpec.savedCursor(at: spec.cursorPath)
        var savedCursor = cursor
        var failures = 0
        var deadLetters = 0
        var lastSave = Date()
        var lastProgress = Date.distantPast

        // With a deferred stage, the cursor saved is below the oldest record still in its hands.
        func durableCursor() -> UInt64 { deferred ? completions.watermark(acceptedThrough: cursor) : cursor }
        func report(force: Bool = false) {
            let now = Date()
            let durable = durableCursor()
            if force || now.timeIntervalSince(lastSave) >= 0.1, durable != savedCursor {
                save(durable, to: spec.cursorPath)
                savedCursor = durable
                lastSave = now
            }
            if force || now.timeIntervalSince(lastProgress) >= 0.25 {
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
                    let outcome = chain.run(record.line, seq: seq)
                    if deferred, case .unchanged = outcome { completions.accept(seq) }
                    if deferred, case .changed = outcome { completions.accept(seq) }
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
