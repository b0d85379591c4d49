import Foundation

/// What retention decides, from figures alone: whether the oldest sealed segment goes, why, and
/// which readers lose which records with it. No files and no clock: `JournalWriter` gathers the
/// figures (sizes, ages, free space, the readers' cursors), asks segment by segment, and acts.
///
/// The rules: a sealed segment goes while the journal is over `maxBytes` or the segment is older
/// than `maxAge`, but only once every reader has passed it (the oldest segment a reader still
/// needs stops retention). Past the hard limits (`hardMaxBytes`, or less than `minFreeBytes`
/// free on the file system) it goes even so, and each reader that had not read it loses its
/// records. Zero turns a limit off.
package struct RetentionPolicy: Sendable, Equatable {
    package var maxBytes: Int64
    package var maxAge: TimeInterval
    package var hardMaxBytes: Int64
    package var minFreeBytes: Int64

    /// Nothing to do, whatever the journal holds.
    package var isOff: Bool { maxBytes <= 0 && maxAge <= 0 && hardMaxBytes <= 0 && minFreeBytes <= 0 }

    /// A sealed segment as retention sees it.
    package struct Segment: Sendable, Equatable {
        package var firstSeq: UInt64
        /// Its last record's `_seq` (the next segment's first, less one).
        package var lastSeq: UInt64
        package var bytes: Int64
        /// Seconds since it was last written.
        package var age: TimeInterval
    }

    /// A reader retention waits for, at its durable cursor (the last `_seq` it has finished).
    package struct Reader: Sendable, Equatable {
        package var name: String
        package var cursor: UInt64
    }

    /// Why a segment goes.
    package enum Reason: Sendable, Equatable, CustomStringConvertible {
        case overHardMax(Int64)
        case underMinFree(Int64)
        case overMax(Int64)
        case tooOld(TimeInterval)

        /// Past a hard limit: readers do not hold the segment.
        package var isHard: Bool {
            switch self {
            case .overHardMax, .underMinFree: true
            case .overMax, .tooOld: false
            }
        }

        package var description: String {
            switch self {
            case .overHardMax(let bytes): "journal over retention_hard_max_bytes \(bytes)"
            case .underMinFree(let bytes): "file system under retention_min_free_bytes \(bytes)"
            case .overMax(let bytes): "journal over \(bytes) bytes"
            case .tooOld(let age): "older than \(Int(age)) s"
            }
        }
    }

    /// Records a reader loses with a segment: `first…last`.
    package struct Loss: Sendable, Equatable {
        package var reader: String
        package var first: UInt64
        package var last: UInt64
    }

    package enum Decision: Sendable, Equatable {
        /// Within every limit: nothing goes.
        case keep
        /// Over a limit, but these readers have not read the segment yet (the limit is soft).
        case keepForReaders([Reader])
        /// It goes, for this reason, and these readers lose these records.
        case delete(Reason, losses: [Loss])
    }

    /// The fate of `oldest`, the oldest sealed segment, when the journal holds `totalBytes` in
    /// all (active segment included) and the file system has `freeBytes` free (nil: unknown).
    package func decide(oldest: Segment, totalBytes: Int64, freeBytes: Int64?, readers: [Reader]) -> Decision {
        let reason: Reason
        if hardMaxBytes > 0 && totalBytes > hardMaxBytes {
            reason = .overHardMax(hardMaxBytes)
        } else if minFreeBytes > 0, let freeBytes, freeBytes < minFreeBytes {
            reason = .underMinFree(minFreeBytes)
        } else if maxBytes > 0 && totalBytes > maxBytes {
            reason = .overMax(maxBytes)
        } else if maxAge > 0 && oldest.age > maxAge {
            reason = .tooOld(maxAge)
        } else {
            return .keep
        }
        let behind = readers.filter { $0.cursor < oldest.lastSeq }
        if !behind.isEmpty && !reason.isHard { return .keepForReaders(behind) }
        return .delete(
            reason,
            losses: behind.map {
                Loss(reader: $0.name, first: max($0.cursor + 1, oldest.firstSeq), last: oldest.lastSeq)
            })
    }
}
