import Foundation
import WhendSystem

/// What the writer tells others of its progress: its figures, and (to the pipeline processes)
/// the last `_seq` it stored.
extension JournalWriter {
    package var statistics: JournalStatistics {
        condition.lock()
        defer { condition.unlock() }
        return stats
    }

    /// Tells `word` the last `_seq` stored, now and after each commit: the pipelines read a
    /// record as soon as it is written, and handle none past the word (a power cut may still
    /// take what is written and not synced, and a cursor saved past it would skip the record
    /// that takes its `_seq` next).
    package func share(storedThrough word: SharedWord) {
        condition.lock()
        storedThrough = word
        word.store(stats.lastSeq)
        condition.unlock()
    }
}
