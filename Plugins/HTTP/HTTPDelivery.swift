import CZlib
import Foundation
import WhendPluginSDK

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// One HTTP endpoint that a plugin POSTs batches to, with the built-in plugins' policy: a batch
/// is sent again after a failure the endpoint calls temporary (a status `retryable` accepts, or
/// no answer at all), after `Retry-After` or an exponential, jittered backoff up to
/// `maxBackoff`, until it is accepted, refused for good, or the plugin stops. Used by analytics
/// and otlp; blocking, from the plugin's own sender thread.
package final class HTTPDelivery: @unchecked Sendable {
    // Unchecked: configuration is immutable; `stopping` guards itself.
    package let endpoint: URL
    private let plugin: String
    private let host: PluginHost
    private let contentType: String
    private let headers: [String: String]
    private let gzip: Bool
    private let timeout: Double
    private let maxBackoff: Double
    private let retryable: @Sendable (Int) -> Bool
    private let stopping = StopSignal()

    /// What became of a batch.
    package enum Outcome {
        /// A 2xx, with the answer's body.
        case accepted(Data)
        /// A status that says the batch will never be taken: nothing more to do with it.
        case refused(Int)
        /// The plugin stopped first.
        case stopped
    }

    /// `endpoint` must be http:// or https://; `gzip` sends bodies with `Content-Encoding: gzip`.
    package init(
        plugin: String, host: PluginHost, endpoint text: String, contentType: String,
        headers: [String: String] = [:], gzip: Bool, timeout: Double, maxBackoff: Double,
        retryable: @escaping @Sendable (Int) -> Bool
    ) throws {
        guard let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else {
            throw PluginError.fail("\(plugin): endpoint must be an http:// or https:// URL, not \(text)")
        }
        endpoint = url
        self.plugin = plugin
        self.host = host
        self.contentType = contentType
        self.headers = headers
        self.gzip = gzip
        self.timeout = timeout
        self.maxBackoff = maxBackoff
        self.retryable = retryable
    }

    /// Ends every wait: a `deliver` under way returns `.stopped` at its next attempt.
    package func stop() { stopping.stop() }

    /// POSTs a batch until it is accepted or refused for good; `body` is asked again for each
    /// attempt (a body may stamp the moment it is sent). `what` names the batch in the log.
    package func deliver(_ what: String, body: () -> [UInt8]) -> Outcome {
        var backoff = 0.5
        var attempt = 0
        while !stopping.isStopped {
            attempt += 1
            let answer = post(body())
            if let status = answer.status, (200..<300).contains(status) { return .accepted(answer.body) }
            if let status = answer.status, !retryable(status) {
                host.log(.error, "\(plugin): \(endpoint.absoluteString) refused \(what) with HTTP \(status); dropped")
                return .refused(status)
            }
            let wait = answer.retryAfter ?? min(maxBackoff, backoff * Double.random(in: 0.5...1.5))
            host.log(
                .warning,
                "\(plugin): \(endpoint.absoluteString) answered \(answer.status.map(String.init) ?? answer.problem); attempt \(attempt), retrying in \(String(format: "%.1f", wait)) s"
            )
            host.count("retries")
            stopping.sleep(wait)
            backoff = min(maxBackoff, backoff * 2)
        }
        return .stopped
    }

    private func post(_ body: [UInt8]) -> Answer {
        var request = URLRequest(url: endpoint, timeoutInterval: timeout)
        request.httpMethod = "POST"
        if gzip, let compressed = Self.gzipped(body) {
            request.httpBody = Data(compressed)
            request.setValue("gzip", forHTTPHeaderField: "Content-Encoding")
        } else {
            request.httpBody = Data(body)
        }
        request.setValue(contentType, forHTTPHeaderField: "Content-Type")
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let result = Answer.Box()
        let finished = DispatchSemaphore(value: 0)
        URLSession.shared.dataTask(with: request) { data, response, error in
            let http = response as? HTTPURLResponse
            result.set(
                Answer(
                    status: http?.statusCode, body: data ?? Data(),
                    retryAfter: (http?.value(forHTTPHeaderField: "Retry-After")).flatMap(Double.init),
                    problem: error.map { "\($0.localizedDescription)" } ?? "no answer"))
            finished.signal()
        }.resume()
        finished.wait()
        return result.value
    }

    private struct Answer {
        var status: Int?
        var body: Data
        var retryAfter: Double?
        var problem: String

        final class Box: @unchecked Sendable {
            // Unchecked: written once by the completion handler before the semaphore is signalled.
            private let lock = NSLock()
            private var stored = Answer(status: nil, body: Data(), retryAfter: nil, problem: "")
            func set(_ answer: Answer) { lock.withLock { stored = answer } }
            var value: Answer { lock.withLock { stored } }
        }
    }

    /// `bytes` as one gzip member (zlib's deflate with the gzip wrapper); nil if zlib fails, and
    /// the body then goes uncompressed.
    package static func gzipped(_ bytes: [UInt8]) -> [UInt8]? {
        var stream = z_stream()
        // 15 window bits, + 16 for the gzip wrapper; memory level 8: zlib's defaults.
        guard
            deflateInit2_(
                &stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                Int32(MemoryLayout<z_stream>.size)) == Z_OK
        else { return nil }
        defer { deflateEnd(&stream) }
        var out = [UInt8](repeating: 0, count: Int(deflateBound(&stream, uLong(bytes.count))))
        let status: Int32 = bytes.withUnsafeBufferPointer { input in
            out.withUnsafeMutableBufferPointer { output in
                stream.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
                stream.avail_in = uInt(input.count)
                stream.next_out = output.baseAddress
                stream.avail_out = uInt(output.count)
                return deflate(&stream, Z_FINISH)
            }
        }
        guard status == Z_STREAM_END else { return nil }
        return Array(out.prefix(Int(stream.total_out)))
    }
}

/// A plugin's sender loop on a thread of its own, started at once; `join` waits for the loop
/// to return, at most `seconds` (a stopping plugin must not hang its worker).
package final class SenderThread: Sendable {
    private let done = DispatchSemaphore(value: 0)

    package init(name: String, _ loop: @escaping @Sendable () -> Void) {
        let thread = Thread { [done] in
            loop()
            done.signal()
        }
        thread.name = name
        thread.start()
    }

    package func join(waitingUpTo seconds: Double) { _ = done.wait(timeout: .now() + seconds) }
}

/// A sender's "stop": set once, read from its loop, and a sleep it cuts short.
package final class StopSignal: @unchecked Sendable {
    // Unchecked: `stopped` is guarded by `lock`.
    private let lock = NSLock()
    private var stopped = false

    package init() {}

    package func stop() { lock.withLock { stopped = true } }

    package var isStopped: Bool { lock.withLock { stopped } }

    /// Sleeps `seconds`, or less if `stop()` comes first.
    package func sleep(_ seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        while !isStopped, Date() < deadline { usleep(UInt32(min(0.05, max(0, deadline.timeIntervalSinceNow)) * 1e6)) }
    }
}
