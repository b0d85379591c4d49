import Foundation
import Testing

/// Lines a process writes, read on a thread of their own and taken with a deadline.
final class LineReader: @unchecked Sendable {
    // Unchecked: `lines` and `ended` are guarded by `condition`.
    private let condition = NSCondition()
    private var lines: [String] = []
    private var ended = false

    init(_ handle: FileHandle) {
        Thread { [self] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: 0x0A) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    condition.withLock {
                        lines.append(line)
                        condition.signal()
                    }
                }
            }
            condition.withLock {
                ended = true
                condition.broadcast()
            }
        }.start()
    }

    /// The next line, or nil if none came within `timeout` (or the process closed its end).
    func next(timeout: TimeInterval) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        return condition.withLock {
            while lines.isEmpty && !ended {
                if !condition.wait(until: deadline) { break }
            }
            return lines.isEmpty ? nil : lines.removeFirst()
        }
    }
}

/// `whenctl ui` as a user runs it, against a test's whend.
final class UIProcess {
    let process = Process()
    let url: String
    /// The host name of this run the address names (`whenctl-<hex>.localhost`).
    let host: String
    let port: Int
    let token: String
    private let errors = Pipe()

    /// `as`: a command line to run it under (`setpriv --reuid=…`), for another user.
    init(_ daemon: TestDaemon, as user: [String] = [], arguments: [String] = []) throws {
        let command =
            user + [
                executable("whenctl"), "ui", "--socket", daemon.socketPath, "--control", daemon.controlPath,
                "--state-dir", daemon.stateDirectory,
            ] + arguments
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        let out = Pipe()
        process.standardOutput = out
        process.standardError = errors
        try process.run()
        guard let first = LineReader(out.fileHandleForReading).next(timeout: 20) else {
            process.terminate()
            throw TestFailure(description: "whenctl ui printed no address within 20 s")
        }
        url = first
        guard let components = URLComponents(string: first), let port = components.port, let host = components.host,
            let token = components.fragment.flatMap({ $0.hasPrefix("token=") ? String($0.dropFirst(6)) : nil })
        else { throw TestFailure(description: "whenctl ui's first line is not its address: \(first)") }
        self.host = host
        self.port = port
        self.token = token
    }

    /// The page's origin, as printed.
    var base: String { "http://\(host):\(port)" }

    deinit { process.end() }
}

/// A headless Chromium driven through Selenium (`Tests/Fixtures/ui_browser.py`, in the tests'
/// Python environment), one command at a time.
final class UIBrowser {
    private let process = Process()
    private let input = Pipe()
    private let answers: LineReader
    private let errors = Pipe()
    let version: String

    init() throws {
        process.executableURL = URL(fileURLWithPath: testPython)
        process.arguments = [repositoryRoot + "/Tests/Fixtures/ui_browser.py"]
        let out = Pipe()
        process.standardInput = input
        process.standardOutput = out
        process.standardError = errors
        try process.run()
        answers = LineReader(out.fileHandleForReading)
        guard let line = answers.next(timeout: 60), let first = Self.decode(line), first["ok"] as? Bool == true else {
            process.end(within: 5)
            let why = String(decoding: errors.fileHandleForReading.availableData, as: UTF8.self)
            throw TestFailure(
                description:
                    "no browser (chromium, chromium-driver and selenium come with `make test-deps`): \(why.suffix(2000))"
            )
        }
        version = first["value"] as? String ?? "?"
    }

    private static func decode(_ line: String) -> [String: Any]? {
        try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
    }

    /// Runs one command; its value, or a failure saying what the browser said.
    @discardableResult
    func send(_ command: [String: Any], timeout: TimeInterval = 30) throws -> Any? {
        let line = try JSONSerialization.data(withJSONObject: command) + Data([0x0A])
        input.fileHandleForWriting.write(line)
        guard let answer = answers.next(timeout: timeout), let object = Self.decode(answer) else {
            throw TestFailure(description: "the browser did not answer \(command["op"] ?? "?") within \(timeout) s")
        }
        guard object["ok"] as? Bool == true else {
            throw TestFailure(description: "browser: \(object["error"] ?? "failed") (for \(command))")
        }
        return object["value"] is NSNull ? nil : object["value"]
    }

    func get(_ url: String) throws { try send(["op": "get", "url": url]) }

    /// Opens `url` in a new tab that no page opened, and goes on in it.
    func newTab(_ url: String) throws { try send(["op": "new_tab", "url": url]) }

    @discardableResult
    func js(_ script: String, _ args: [Any] = []) throws -> Any? {
        try send(["op": "js", "script": script, "args": args])
    }

    /// Runs `script` until it returns something truthy, at most `timeout` seconds.
    @discardableResult
    func wait(_ script: String, _ args: [Any] = [], timeout: TimeInterval = 10) throws -> Any? {
        try send(["op": "wait_js", "script": script, "args": args, "timeout": timeout], timeout: timeout + 30)
    }

    func click(_ css: String) throws { try send(["op": "click", "css": css]) }

    func type(_ css: String, _ text: String) throws { try send(["op": "type", "css": css, "text": text]) }

    /// The console's messages since the last call, each "LEVEL text".
    func consoleLog() throws -> [String] { try send(["op": "log"]) as? [String] ?? [] }

    /// The texts of the elements `css` selects, in document order.
    func texts(_ css: String) throws -> [String] {
        try js("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", [css]) as? [String] ?? []
    }

    /// A picture for a person to look at: `.build/ui-screenshots/NAME.png`.
    func screenshot(_ name: String) {
        let path = repositoryRoot + "/.build/ui-screenshots/\(name).png"
        do { try send(["op": "screenshot", "path": path]) } catch { Issue.record("screenshot \(name): \(error)") }
    }

    deinit {
        _ = try? send(["op": "quit"], timeout: 10)
        process.end()
    }
}

/// One HTTP/1.1 request over TCP to 127.0.0.1:`port`, with the Host and headers given as they
/// are: what a page of another site, or a program on the machine, could send.
func rawHTTP(port: Int, path: String, host: String, headers: [String] = []) throws -> (
    status: Int, head: String, body: String
) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw TestFailure(description: "socket: \(errno)") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard connected == 0 else { throw TestFailure(description: "connect to 127.0.0.1:\(port): \(errno)") }
    var timeout = timeval(tv_sec: 10, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    let request = (["GET \(path) HTTP/1.1", "Host: \(host)", "Connection: close"] + headers + ["", ""]).joined(
        separator: "\r\n")
    _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var response: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { break }
        response += buffer[0..<n]
    }
    let text = String(decoding: response, as: UTF8.self)
    let status = Int(text.split(separator: " ", maxSplits: 2).dropFirst().first ?? "") ?? 0
    let end = text.range(of: "\r\n\r\n")
    let head = end.map { String(text[..<$0.lowerBound]) } ?? text
    let body = end.map { String(text[$0.upperBound...]) } ?? ""
    return (status, head, body)
}

/// Another web server on 127.0.0.1, as a user's machine may run: it answers a path `pages`
/// names with its content (with `cacheControl`, if given), any other with a small page, and
/// keeps what each request said (its line and headers).
final class HeaderRecorder: @unchecked Sendable {
    // Unchecked: `seen` is guarded by `lock`; the rest is set before the threads start.
    let port: Int
    private let listener: Int32
    private let pages: [String: (type: String, body: String)]
    private let cacheControl: String?
    private let lock = NSLock()
    private var seen: [String] = []
    private var stopped = false

    init(pages: [String: (type: String, body: String)] = [:], cacheControl: String? = nil) throws {
        self.pages = pages
        self.cacheControl = cacheControl
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listener = listener
        guard listener >= 0 else { throw TestFailure(description: "socket: \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        // As web servers do: so that another may listen on the port as soon as this one stops.
        var one: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, length) == 0 && listen(listener, 16) == 0 && getsockname(listener, $0, &length) == 0
            }
        }
        guard bound else { throw TestFailure(description: "cannot listen on 127.0.0.1: \(errno)") }
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread { [self] in serve() }.start()
    }

    func requests() -> [String] { lock.withLock { seen } }

    private func serve() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 { return }
            // A browser also opens connections it never uses: each is waited on by itself.
            Thread { [self] in answer(fd) }.start()
        }
    }

    private func answer(_ fd: Int32) {
        defer { close(fd) }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var request: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16384)
        while !request.suffix(4).elementsEqual([13, 10, 13, 10]) {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            request += buffer[0..<n]
        }
        guard !request.isEmpty else { return }
        let text = String(decoding: request, as: UTF8.self)
        lock.withLock { seen.append(text) }
        let path = text.split(separator: " ", maxSplits: 2).dropFirst().first.map(String.init) ?? "/"
        let (type, page) =
            pages[path] ?? ("text/html", "<!doctype html><title>another server</title><p>another server")
        let cache = cacheControl.map { "Cache-Control: \($0)\r\n" } ?? ""
        let answer =
            "HTTP/1.1 200 OK\r\nContent-Type: \(type)\r\n\(cache)Content-Length: \(page.utf8.count)\r\nConnection: close\r\n\r\n\(page)"
        _ = Array(answer.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    /// Stops listening: the port is free for another server.
    func stop() {
        guard
            lock.withLock({ () -> Bool in
                defer { stopped = true }; return !stopped
            })
        else { return }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    deinit { stop() }
}
