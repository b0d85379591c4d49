import Foundation

/// Splits a byte stream into lines (PROTOCOL.md §2) with a bounded buffer.
///
/// A line is the bytes before a `\n`; a `\r` before the `\n` is not counted against the limit.
/// A line longer than `maxLineBytes` is never buffered: the framer reports it as `.tooLarge`
/// once its newline arrives, skipping its bytes meanwhile, so memory stays within the limit
/// whatever a client sends.
package struct LineFramer: Sendable {
    package enum Piece {
        /// A complete line, without its `\n`. Valid only during the callback.
        case line(UnsafeBufferPointer<UInt8>)
        /// A line over the limit; its length in bytes.
        case tooLarge(Int)
    }

    package let maxLineBytes: Int
    var partial: [UInt8] = []
    var skippedBytes: Int?

    package init(maxLineBytes: Int) {
        self.maxLineBytes = maxLineBytes
    }

    /// Bytes held for a line that has not ended yet.
    package var bufferedBytes: Int { partial.count }

    /// Feeds a chunk, calling `body` for each line it completes, in order.
    package mutating func feed(_ chunk: UnsafeBufferPointer<UInt8>, _ body: (Piece) throws -> Void) rethrows {
        var start = 0
        let count = chunk.count
        while start < count {
            guard let end = indexOfNewline(in: chunk, from: start) else {
                absorb(UnsafeBufferPointer(rebasing: chunk[start..<count]))
                return
            }
            if let skipped = skippedBytes {
                skippedBytes = nil
                try body(.tooLarge(skipped + (end - start)))
            } else if partial.isEmpty {
                try emit(UnsafeBufferPointer(rebasing: chunk[start..<end]), body)
            } else {
                absorb(UnsafeBufferPointer(rebasing: chunk[start..<end]))
                if let skipped = skippedBytes {
                    skippedBytes = nil
                    try body(.tooLarge(skipped))
                } else {
                    let line = partial
                    partial.removeAll(keepingCapacity: partial.count <= 4096)
                    try line.withUnsafeBufferPointer { try emit($0, body) }
                }
            }
            start = end + 1
        }
    }

    /// Ends the stream: bytes after the last `\n` count as a final line, so that a client
    /// which half-closes without a trailing newline still has its last event handled.
    package mutating func finish(_ body: (Piece) throws -> Void) rethrows {
        if let skipped = skippedBytes {
            skippedBytes = nil
            try body(.tooLarge(skipped))
        } else if !partial.isEmpty {
            let line = partial
            partial = []
            try line.withUnsafeBufferPointer { try emit($0, body) }
        }
    }

    func emit(_ line: UnsafeBufferPointer<UInt8>, _ body: (Piece) throws -> Void) rethrows {
        var length = line.count
        if length > 0, line[length - 1] == 0x0D { length -= 1 }
        if length > maxLineBytes {
            try body(.tooLarge(line.count))
        } else {
            try body(.line(line))
        }
    }

    mutating func absorb(_ bytes: UnsafeBufferPointer<UInt8>) {
        if let skipped = skippedBytes {
            skippedBytes = skipped + bytes.count
        } else if partial.count + bytes.count > maxLineBytes + 1 {
            // Over the limit (allowing for a `\r`): stop buffering, only count.
            skippedBytes = partial.count + bytes.count
            partial = []
        } else {
            partial.append(contentsOf: bytes)
        }
    }
}

/// The index of the first `\n` at or after `from`, found with `memchr` (vectorised by libc).
@inline(__always)
package func indexOfNewline(in buffer: UnsafeBufferPointer<UInt8>, from: Int) -> Int? {
    guard from < buffer.count, let base = buffer.baseAddress else { return nil }
    guard let hit = memchr(base + from, 0x0A, buffer.count - from) else { return nil }
    return base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
}
