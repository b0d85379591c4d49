import Foundation

/// A blocking client connection to a Unix stream socket, for command-line tools and tests.
/// Apps use the non-blocking client library instead.
package final class BlockingSocket: @unchecked Sendable {
    // Unchecked: `fd` never changes after init; `close()` is the caller's to order.
    package let fd: Int32

    package struct Failure: Error, CustomStringConvertible {
        package var description: String
        /// connect(2)'s errno, when it was the connection that failed.
        package var connectErrno: Int32? = nil
        /// True when a receive timeout (SO_RCVTIMEO) passed with nothing to read.
        package var timedOut = false

        /// True when nothing listens there: no daemon, rather than a broken one.
        package var nobodyListens: Bool { connectErrno == ENOENT || connectErrno == ECONNREFUSED }
    }

    /// Connects to `path`.
    /// - Throws: `Failure` saying whether the daemon is missing or the path unreachable.
    package init(path: String) throws {
        #if canImport(Glibc)
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let fd = socket(AF_UNIX, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Failure(description: "socket(): \(String(cString: strerror(errno)))") }
        #if canImport(Darwin)
            // No MSG_NOSIGNAL there: a closed peer must not kill the app with SIGPIPE.
            var on: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size))
        #endif
        guard let result = withUnixSocketAddress(path, { connect(fd, $0, $1) }) else {
            close(fd)
            throw Failure(description: "socket path too long (\(path.utf8.count) bytes): \(path)")
        }
        guard result == 0 else {
            let e = errno
            close(fd)
            let hint =
                e == ENOENT || e == ECONNREFUSED
                ? "; is whend running? (`systemctl start whend.socket` for the installed one, `make run` in a checkout; WHEND_SOCKET names another socket)"
                : ""
            throw Failure(
                description: "cannot connect to \(path): \(String(cString: strerror(e)))\(hint)", connectErrno: e)
        }
        self.fd = fd
    }

    deinit { close(fd) }

    package func send(_ bytes: [UInt8]) throws {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes {
                #if canImport(Glibc)
                    Glibc.send(fd, $0.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL))
                #else
                    Darwin.send(fd, $0.baseAddress! + done, bytes.count - done, 0)
                #endif
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw Failure(description: "send: \(String(cString: strerror(errno)))")
            }
            done += n
        }
    }

    package func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Shuts down the writing side: the daemon answers what it got, then closes.
    package func finishSending() { shutdown(fd, Int32(SHUT_WR)) }

    /// Reads whatever is available (blocking for at least one byte); empty at end of stream.
    package func receive(max: Int = 65536) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: max)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, max, 0) }
            if n < 0 {
                let e = errno
                if e == EINTR { continue }
                throw Failure(
                    description: "recv: \(String(cString: strerror(e)))", timedOut: e == EAGAIN || e == EWOULDBLOCK)
            }
            return Array(buffer[0..<n])
        }
    }

    /// Waits until there is something to read (or the peer closed), at most `timeout` seconds.
    package func waitReadable(timeout: TimeInterval) -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(max(0, min(timeout, 3600)) * 1000)
        while true {
            let rc = poll(&pfd, 1, milliseconds)
            if rc < 0 && errno == EINTR { continue }
            return rc > 0
        }
    }

    /// Reads lines until the daemon closes, calling `body` for each.
    package func receiveLines(_ body: (String) -> Void) throws {
        var framer = LineFramer(maxLineBytes: Self.maxAnswerBytes)
        func line(_ piece: LineFramer.Piece) {
            if case .line(let bytes) = piece { body(String(decoding: bytes, as: UTF8.self)) }
        }
        while true {
            let chunk = try receive()
            if chunk.isEmpty { break }
            chunk.withUnsafeBufferPointer { framer.feed($0, line) }
        }
        framer.finish(line)
    }

    /// What `receiveFirstLine` found.
    package enum FirstLine: Equatable {
        /// The first line, without its newline (or all that came before the peer closed).
        case line([UInt8])
        /// The peer closed without sending anything.
        case closed
        /// More than `maxAnswerBytes` came without a newline.
        case tooLong
        /// The line was not complete within the time given.
        case timedOut
    }

    /// Reads the first line the peer sends, within `timeout` seconds in all: a peer that sends
    /// for ever, or answers and never closes, holds no reader longer than that.
    package func receiveFirstLine(timeout: TimeInterval) throws -> FirstLine {
        let deadline = Date().addingTimeInterval(timeout)
        var pending: [UInt8] = []
        while true {
            let left = deadline.timeIntervalSinceNow
            guard left > 0, waitReadable(timeout: left) else { return .timedOut }
            let chunk = try receive()
            if chunk.isEmpty { return pending.isEmpty ? .closed : .line(pending) }
            if let newline = chunk.firstIndex(of: 0x0A) {
                guard pending.count + newline <= Self.maxAnswerBytes else { return .tooLong }
                return .line(pending + chunk[..<newline])
            }
            pending += chunk
            guard pending.count <= Self.maxAnswerBytes else { return .tooLong }
        }
    }

    /// The longest line a daemon's answer may be; longer ones are skipped, never buffered.
    package static let maxAnswerBytes = 1 << 24
}
