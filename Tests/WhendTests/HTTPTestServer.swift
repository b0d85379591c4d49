import Foundation

/// A real HTTP/1.1 server on a loopback port, answering POSTs from a script: each request gets
/// the next scripted answer (the last one repeats). Records every request body, and what it
/// answered each one. An answer may come late (`delay`) or not at all (`reset`: the connection
/// is reset once the request is read), or never end (`stream`: a chunked body sent until the
/// client closes the connection, as fast as it reads or a byte at a time).
final class HTTPTestServer: @unchecked Sendable {
    struct Answer {
        var status: Int
        var headers: [String: String] = [:]
        var body: [UInt8] = Array("{}".utf8)
        var delay: Double = 0
        var reset = false
        var stream: Stream?
        /// Kept open after the answer (no `Connection: close`), and 50 ms later an answer nobody
        /// asked for is written on it, as a confused server or proxy might: a client that sends
        /// its next request on this connection reads that as the answer. Such a request is
        /// recorded unanswered (status nil), and never answered.
        var strayAnswerAfter = false
    }

    enum Stream {
        /// 16 KiB chunks, as fast as the client reads them.
        case endless
        /// One byte every `interval` seconds.
        case trickle(interval: Double)
    }

    /// One request as received, and the status it was answered (nil: reset, or a trickle).
    struct Exchange {
        var head: String
        var body: Data
        var status: Int?
    }

    let port: UInt16
    private let fd: Int32
    private let lock = NSLock()
    private var script: [Answer]
    private var bodies: [Data] = []
    private var heads: [String] = []
    private var answered: [Exchange] = []
    private var stopped = false
    private var streams: [Int] = []

    init(answers: [Answer]) throws {
        script = answers
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.fd = fd
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 16) == 0 else { throw TestFailure(description: "cannot listen on loopback") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let port = UInt16(bigEndian: address.sin_port)
        self.port = port
        let thread = Thread { [self] in serve() }
        thread.start()
    }

    deinit { stop() }

    /// Once only: a second close could close a descriptor the number was reused for since.
    func stop() {
        let first = lock.withLock {
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    var requests: [Data] { lock.withLock { bodies } }

    /// Each request's line and headers, as sent.
    var requestHeads: [String] { lock.withLock { heads } }

    /// Each request, with how it was answered.
    var exchanges: [Exchange] { lock.withLock { answered } }

    /// The body bytes of each streamed answer the client closed, in the order they ended.
    var streamed: [Int] { lock.withLock { streams } }

    /// From the next request on, these answers (the last one repeats).
    func answer(_ answers: [Answer]) { lock.withLock { script = answers } }

    /// Each connection on a thread of its own: a streamed answer goes on until the client
    /// closes its end, and one whose client went quiet without closing (URLSession may keep a
    /// cancelled task's connection a while) held up every later request, so that a schedule
    /// stopped being played under load (21 answers of 24 heard in 164 s in a CI run). A stream
    /// the client stopped reading ends after 30 s (SO_SNDTIMEO).
    private func serve() {
        while !lock.withLock({ stopped }) {
            let client = accept(fd, nil, nil)
            guard client >= 0 else { return }
            var timeout = timeval(tv_sec: 30, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            Thread { [self] in
                handle(client)
                close(client)
            }.start()
        }
    }

    private func handle(_ client: Int32) {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        // Headers, then Content-Length bytes of body (one request per connection is enough:
        // the answer says Connection: close).
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return }
            received += buffer[0..<n]
            guard let end = find([13, 10, 13, 10], in: received) else { continue }
            let head = String(decoding: received[..<end], as: UTF8.self).lowercased()
            let length =
                head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
            if received.count >= end + 4 + length {
                let body = Data(received[(end + 4)..<(end + 4 + length)])
                let answer = lock.withLock {
                    bodies.append(body)
                    heads.append(String(decoding: received[..<end], as: UTF8.self))
                    let answer = script.count > 1 ? script.removeFirst() : script[0]
                    answered.append(
                        Exchange(
                            head: String(decoding: received[..<end], as: UTF8.self), body: body,
                            // A stream's status line goes first: the client has the status.
                            status: answer.reset ? nil : answer.status))
                    return answer
                }
                if answer.delay > 0 { usleep(UInt32(answer.delay * 1e6)) }
                if answer.reset {
                    // SO_LINGER of 0: close sends a reset, not a FIN.
                    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
                    setsockopt(client, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
                    return
                }
                if let stream = answer.stream {
                    let sent = self.stream(stream, status: answer.status, headers: answer.headers, to: client)
                    lock.withLock { streams.append(sent) }
                    return
                }
                var text =
                    "HTTP/1.1 \(answer.status) X\r\nContent-Length: \(answer.body.count)\r\n"
                    + (answer.strayAnswerAfter ? "" : "Connection: close\r\n")
                for (k, v) in answer.headers { text += "\(k): \(v)\r\n" }
                text += "\r\n"
                let reply = Array(text.utf8) + answer.body
                _ = reply.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                guard answer.strayAnswerAfter else { return }
                usleep(50_000)
                let stray = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}".utf8)
                _ = stray.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                holdUnanswered(client, after: Array(received[(end + 4 + length)...]))
                return
            }
        }
    }

    /// Records each request that comes on `client` as unanswered, until the client closes it.
    private func holdUnanswered(_ client: Int32, after: [UInt8]) {
        var received = after
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !lock.withLock({ stopped }) {
            if let end = find([13, 10, 13, 10], in: received) {
                let head = String(decoding: received[..<end], as: UTF8.self)
                lock.withLock { answered.append(Exchange(head: head, body: Data(received[(end + 4)...]), status: nil)) }
                received = []
            }
            let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return }
            received += buffer[0..<n]
        }
    }

    /// Sends a chunked body that never ends, until the client is gone (or the server stopped);
    /// returns how many body bytes were sent.
    private func stream(_ stream: Stream, status: Int, headers: [String: String], to client: Int32) -> Int {
        var text = "HTTP/1.1 \(status) X\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
        for (k, v) in headers { text += "\(k): \(v)\r\n" }
        text += "\r\n"
        func put(_ bytes: [UInt8]) -> Bool {
            bytes.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count
        }
        guard put(Array(text.utf8)) else { return 0 }
        var sent = 0
        let chunk: [UInt8]
        switch stream {
        case .endless: chunk = Array("4000\r\n".utf8) + [UInt8](repeating: 0x41, count: 0x4000) + [13, 10]
        case .trickle: chunk = Array("1\r\nA\r\n".utf8)
        }
        let size = stream.isEndless ? 0x4000 : 1
        while !lock.withLock({ stopped }) {
            if case .trickle(let interval) = stream { usleep(UInt32(interval * 1e6)) }
            guard put(chunk) else { break }
            sent += size
        }
        return sent
    }

    private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 0...(haystack.count - needle.count) where Array(haystack[i..<(i + needle.count)]) == needle {
            return i
        }
        return nil
    }
}

extension HTTPTestServer.Stream {
    var isEndless: Bool {
        if case .endless = self { return true }
        return false
    }
}
