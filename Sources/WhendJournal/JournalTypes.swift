import Foundation
import WhendRecord
import WhendWire

/// What an acknowledgement means (DESIGN.md "The journal writer").
package enum Durability: String, Sendable, CaseIterable {
    /// Acked once `fdatasync` returned: the record survives a power cut.
    case fsync
    /// Acked once `write` returned: the record survives a crash of the daemon, not of the machine.
    case write
    /// Acked once sequenced; written soon after. For benchmarks and throwaway rigs.
    case none
}

/// How the journal is written, rotated and pruned.
package struct JournalConfiguration: Sendable {
    package var directory: JournalDirectory
    package var durability: Durability = .fsync
    /// Rotate the active segment once it holds this many compressed bytes.
    package var segmentMaxBytes: Int64 = 32 << 20
    /// Rotate the active segment once it is this old (seconds), if it holds any record.
    package var segmentMaxAge: TimeInterval = 3600
    /// End a zstd frame after this many uncompressed bytes: the seek granularity.
    package var frameBytes: Int = 4 << 20
    /// Delete the oldest sealed segments while the journal is larger than this (0: no limit).
    package var retentionMaxBytes: Int64 = 1 << 30
    /// Delete sealed segments older than this many seconds (0: no limit).
    package var retentionMaxAge: TimeInterval = 0
    /// The limits above wait for readers (pipelines) to pass a segment; past this size the
    /// oldest segments go even so, and the readers that had not read them are told (0: none).
    package var retentionHardMaxBytes: Int64 = 4 << 30
    /// Likewise while the file system holding the journal has less free space than this (0:
    /// no floor; then a full file system makes whend answer `unavailable` instead).
    package var retentionMinFreeBytes: Int64 = 0
    /// How many of the latest records the de-duplication of resent events covers.
    package var dedupWindow: Int = 100_000
    package var compressionLevel: Int32 = ZstdCompressor.journalLevel

    package init(directory: JournalDirectory) {
        self.directory = directory
    }
}

/// Records of one connection, handed to the writer together: the unit of ordering and of
/// acknowledgement.
package struct JournalBatch: Sendable {
    /// Record bodies (everything after `{"_seq":N,`), back to back.
    package var bodies: [UInt8] = []
    /// Where each body ends in `bodies`.
    package var ends: [Int] = []
    /// The de-duplication keys of the bodies that carry an `id`, by body index, ascending.
    package var keys: [(index: Int, key: DedupKey)] = []
    /// The range of `_rt` stamped on these bodies, in µs, for the index.
    package var minReceivedMicros: Int64 = .max
    package var maxReceivedMicros: Int64 = .min

    package init() {}

    package var isEmpty: Bool { ends.isEmpty }
    package var count: Int { ends.count }
}

/// The fate of a batch.
package enum JournalCommit: Sendable, Equatable {
    /// Every record is stored (under the configured durability), or was a resend of one that is.
    case stored(lastSeq: UInt64)
    /// Nothing of the batch is acknowledged.
    case failed(CommitFailure)
}

/// Why nothing of a batch was stored. Every case is worth a retry later; its description says
/// so, for the client that sent the events (the protocol's `unavailable`).
package enum CommitFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// whend is stopping.
    case shuttingDown
    /// A write, the repair of an earlier failed write, or a sync failed: the cause, as the
    /// system gave it (a full disk, an I/O error).
    case cannotStore(String)
    /// The batch resends events whose first copies' sync failed: neither copy is durable.
    case resentCopiesNotDurable

    package var description: String {
        switch self {
        case .shuttingDown: "whend is shutting down; send again after it restarts"
        case .cannotStore(let cause):
            "the journal cannot store right now (\(cause)); nothing of this was stored; retry later"
        case .resentCopiesNotDurable:
            "the journal cannot store right now (the sync of events this resends failed); nothing of this was stored; retry later"
        }
    }
}

/// Live figures of the writer, for status and metrics.
package struct JournalStatistics: Sendable {
    package var lastSeq: UInt64
    /// The last `_seq` written to a segment, synced or not: what a reader of the files may have
    /// seen already (it can be ahead of `lastSeq`, whose records are acknowledged).
    package var writtenThrough: UInt64 = 0
    package var recordsStored: UInt64
    package var duplicatesSkipped: UInt64
    package var commits: UInt64
    package var bytesWritten: UInt64
    package var failing: String?

    /// A journal whose last record is `lastSeq`, before any commit.
    package init(lastSeq: UInt64) {
        self.lastSeq = lastSeq
        writtenThrough = lastSeq
        recordsStored = 0
        duplicatesSkipped = 0
        commits = 0
        bytesWritten = 0
    }
}

/// What the ingest and control paths ask of the journal: take a batch and say, once, whether it
/// is stored; how many bytes wait to be (the connections' back-pressure); and the figures for
/// status. `JournalWriter` is the journal; a test of those paths may give them one in memory.
package protocol EventJournal: AnyObject, Sendable {
    /// Queues `batch`; `completion` is called once, off the caller's thread, when it is stored
    /// or cannot be.
    func submit(_ batch: JournalBatch, completion: @escaping @Sendable (JournalCommit) -> Void)
    /// Bytes of record bodies submitted and not yet committed.
    var pendingBytes: Int { get }
    var statistics: JournalStatistics { get }
}
