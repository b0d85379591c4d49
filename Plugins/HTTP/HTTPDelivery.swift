import CHTTP
import CZlib
import Foundation
import WhendPluginSDK

/// One HTTP endpoint that a plugin POSTs batches to, with the built-in plugins' policy: a batch
/// is sent again after a failure the endpoint calls temporary (a status `retryable` accepts, a
/// redirect not followed, or no answer at all), after `Retry-After` or an exponential, jittered
/// backoff, either at most `maxBackoff`, until it is accepted, refused for good, or the plugin
/// stops. Used by analytics and otlp; blocking, from the plugin's own sender thread.
///
/// Redirects: the headers carry credentials (a write key, a token), so a request never leaves
/// the endpoint's origin (scheme, host and port). A `307` or `308` to the same origin is
/// followed, the same POST with the same body and headers (at most `maxRedirects` hops); any
/// other redirect — to another origin, or one that would turn the POST into a GET — is not:
/// it is logged, counted (`redirects_refused`) and the batch retried at the endpoint later, as
/// after a `503`, so that nothing is lost while the endpoint is misconfigured.
///
/// An endpoint is not trusted to answer sensibly either: `timeout` is a deadline for the whole
/// exchange, not only for a silence (a peer trickling a byte at a time cannot hold a batch);
/// at most `maxBody` bytes of an answer's body are kept, and the rest is not read (an endless
/// body cannot grow the worker); a `Retry-After` can lengthen the wait before the next attempt
/// but never shorten it below the backoff (a `0` cannot make the sender hammer the endpoint).
///
/// The exchange is libcurl's, on the sender's own thread (CHTTP): the deadline, the cut and a
/// stop take effect inside its calls. With URLSession a cancel took effect only once its own
/// queue turned to it, and on a loaded machine an endless answer was read for more than the
/// deadline (gigabytes, and the batch sent twice).
package final class HTTPDelivery: @unchecked Sendable {
    // Unchecked: configuration is immutable; `stopping` guards itself; `client` is used by
    // `deliver` alone, which one sender thread calls.
    package let endpoint: URL
    private let origin: Origin
    private let plugin: String
    private let host: PluginHost
    private let contentType: String
    private let headers: [String: String]
    private let gzip: Bool
    private let timeout: Double
    private let maxBackoff: Double
    private let retryable: @Sendable (Int) -> Bool
    private let stopping = StopSignal()
    /// Its connections are kept for the next batch; it keeps no cookie, credential or cache.
    private let client: OpaquePointer?
    static let maxRedirects = 5
    /// The most of an answer's body kept: far more than otlp's partial-success message, the
    /// only body a sender reads.
    static let maxBody = 64 * 1024
    /// The shortest backoff step, whatever `max_backoff` says: even 0 cannot make a busy loop.
    static let minBackoff = 0.1
    /// How often a batch's retries are logged past its first: a warning per attempt would be
    /// several a second with a short backoff.
    static let retryLogInterval = 10.0

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
        guard let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), let origin = Origin(url)
        else {
            throw PluginError.fail("\(plugin): endpoint must be an http:// or https:// URL, not \(text)")
        }
        for (name, value) in headers where (name + value).contains(where: \.isNewline) || name.isEmpty {
            // Sent without it, the request would be refused (a token file with a CR at its end
            // made every batch a 401, dropped); sent with it, it would add a line of its own.
            throw PluginError.fail(
                "\(plugin): the header \(name.debugDescription) has a line break in its name or value (a file with CRLF line ends?); remove it"
            )
        }
        endpoint = url
        self.origin = origin
        self.plugin = plugin
        self.host = host
        self.contentType = contentType
        self.headers = headers
        self.gzip = gzip
        // A deadline must be a finite, positive number of seconds: a millisecond (libcurl's
        // unit) at least, a day at most.
        self.timeout = timeout.isFinite && timeout > 0 ? min(max(timeout, 0.001), 86400) : 10
        self.maxBackoff = max(Self.minBackoff, maxBackoff.isFinite ? maxBackoff : 60)
        self.retryable = retryable
        client = whend_http_client_create()
    }

    deinit { whend_http_client_destroy(client) }

    /// Ends every wait: a `deliver` under way returns `.stopped` at its next attempt.
    package func stop() { stopping.stop() }

    /// POSTs a batch until it is accepted or refused for good; `body` is asked again for each
    /// attempt (a body may stamp the moment it is sent). `what` names the batch in the log.
    package func deliver(_ what: String, body: () -> [UInt8]) -> Outcome {
        var backoff = 0.5
        var attempt = 0
        var lastLogged: Date?
        var unlogged = 0
        while !stopping.isStopped {
            attempt += 1
            let bytes = body()
            // One deadline for the attempt, its redirects included.
            let deadline = Date().addingTimeInterval(timeout)
            var answer = post(bytes, to: endpoint, before: deadline)
            var hops = 0
            var problem: String?
            while let status = answer.status, (300..<400).contains(status) {
                let target = answer.location.flatMap {
                    URL(string: $0, relativeTo: answer.url ?? endpoint)?.absoluteURL
                }
                let sameOrigin = target.flatMap(Origin.init) == origin
                guard let target, sameOrigin, status == 307 || status == 308, hops < Self.maxRedirects else {
                    let whither = target.flatMap(Origin.init)?.description ?? "no usable Location"
                    problem =
                        "HTTP \(status) to \(sameOrigin ? "" : "another origin, ")\(whither), not followed"
                        + (sameOrigin ? "" : " (its credentials stay with \(origin))")
                    host.count("redirects_refused")
                    break
                }
                hops += 1
                host.count("redirects_followed")
                answer = post(bytes, to: target, before: deadline)
            }
            // A stop cut the exchange: nothing to say of it, and no retry.
            if stopping.isStopped && answer.status == nil { break }
            if problem == nil, let status = answer.status, (200..<300).contains(status) {
                return .accepted(answer.body)
            }
            if problem == nil, let status = answer.status, !retryable(status) {
                host.log(.error, "\(plugin): \(endpoint.absoluteString) refused \(what) with HTTP \(status); dropped")
                return .refused(status)
            }
            let advised = problem == nil ? Self.retryAfter(answer.retryAfter, cap: maxBackoff) : nil
            // The backoff is a floor: `Retry-After: 0` or a date past must not make a storm.
            let step = max(Self.minBackoff, min(maxBackoff, backoff * Double.random(in: 0.5...1.5)))
            let wait = max(advised ?? 0, step)
            if let last = lastLogged, Date().timeIntervalSince(last) < Self.retryLogInterval {
                unlogged += 1
            } else {
                let since = unlogged > 0 ? " (\(unlogged) more retries since the last logged)" : ""
                host.log(
                    .warning,
                    "\(plugin): \(endpoint.absoluteString) answered \(problem ?? answer.status.map(String.init) ?? answer.problem); attempt \(attempt), retrying in \(String(format: "%.1f", wait)) s\(since)"
                )
                lastLogged = Date()
                unlogged = 0
            }
            host.count("retries")
            stopping.sleep(wait)
            backoff = min(maxBackoff, backoff * 2)
        }
        return .stopped
    }

    /// How long a `Retry-After` asks to wait, in seconds from `now`: delay-seconds or an
    /// HTTP-date (IMF-fixdate, RFC 850 or asctime), at most `cap`; a date past is 0. Nil for a
    /// value that is neither, negative or not finite: the backoff applies then.
    package static func retryAfter(_ value: String?, now: Date = Date(), cap: Double) -> Double? {
        guard let text = value?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
        if let seconds = Double(text) {
            guard seconds.isFinite, seconds >= 0 else { return nil }
            return min(seconds, cap)
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            formatter.dateFormat = format
            if let date = formatter.date(from: text) { return min(max(0, date.timeIntervalSince(now)), cap) }
        }
        return nil
    }

    private func post(_ body: [UInt8], to url: URL, before deadline: Date) -> Answer {
        // At least a millisecond: 0 is no deadline at all to libcurl.
        let milliseconds = Int(deadline.timeIntervalSinceNow * 1000)
        guard milliseconds >= 1 else {
            return Answer(status: nil, body: Data(), problem: "nothing complete within the timeout")
        }
        var sent = body
        var lines = ["Content-Type: \(contentType)"]
        if gzip, let compressed = Self.gzipped(body) {
            sent = compressed
            lines.append("Content-Encoding: gzip")
        }
        // A header a user configured cannot add a line of its own to the request.
        for (name, value) in headers { lines.append("\(name): \(value)") }
        var answer = whend_http_answer()
        var kept = [UInt8](repeating: 0, count: Self.maxBody)
        let outcome = withCStrings(lines) { pointers in
            sent.withUnsafeBytes { bytes in
                kept.withUnsafeMutableBufferPointer { into in
                    whend_http_post(
                        client, url.absoluteString, pointers.baseAddress, pointers.count, bytes.baseAddress,
                        bytes.count, milliseconds, stopping.curl, into.baseAddress, into.count, &answer)
                }
            }
        }
        let status = Int(answer.status)
        let body = Data(kept.prefix(answer.body_length))
        func text<T>(_ field: T) -> String? {
            let value = withUnsafeBytes(of: field) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            return value.isEmpty ? nil : value
        }
        switch Int(outcome) {
        case WHEND_HTTP_ANSWERED, WHEND_HTTP_CUT:
            // Cut short past `maxBody`: the status the endpoint gave is its answer.
            return Answer(
                status: status, body: body, retryAfter: text(answer.retry_after), location: text(answer.location),
                url: url, problem: "")
        case WHEND_HTTP_TIMED_OUT:
            return Answer(status: nil, body: Data(), problem: "nothing complete within the timeout")
        case WHEND_HTTP_STOPPED:
            return Answer(status: nil, body: Data(), problem: "stopped")
        default:
            return Answer(status: nil, body: Data(), problem: text(answer.problem) ?? "no answer")
        }
    }

    /// `strings` as C strings, valid for the call of `body`.
    private func withCStrings<R>(
        _ strings: [String], _ body: (UnsafeBufferPointer<UnsafePointer<CChar>?>) -> R
    ) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        return copies.map { UnsafePointer($0) }.withUnsafeBufferPointer(body)
    }

    /// A request's origin: scheme, host and port (the scheme's default when none is written).
    struct Origin: Equatable, CustomStringConvertible {
        var scheme: String
        var host: String
        var port: Int

        init?(_ url: URL) {
            guard let scheme = url.scheme?.lowercased(), let host = url.host?.lowercased(), !host.isEmpty else {
                return nil
            }
            self.scheme = scheme
            self.host = host
            guard let port = url.port ?? ["http": 80, "https": 443][scheme] else { return nil }
            self.port = port
        }

        var description: String { "\(scheme)://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
    }

    private struct Answer {
        var status: Int?
        var body: Data
        var retryAfter: String? = nil
        var location: String? = nil
        var url: URL? = nil
        var problem: String
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
    // Unchecked: `stopped` is guarded by `lock`; `curl` is atomic.
    private let lock = NSLock()
    private var stopped = false
    /// The same stop, for an HTTP exchange under way (its progress callback reads it).
    let curl = whend_http_stop_create()

    package init() {}

    deinit { whend_http_stop_destroy(curl) }

    package func stop() {
        lock.withLock { stopped = true }
        whend_http_stop_request(curl)
    }

    package var isStopped: Bool { lock.withLock { stopped } }

    /// Sleeps `seconds`, or less if `stop()` comes first.
    package func sleep(_ seconds: Double) {
        let deadline = Date().addingTimeInterval(seconds)
        while !isStopped, Date() < deadline { usleep(UInt32(min(0.05, max(0, deadline.timeIntervalSinceNow)) * 1e6)) }
    }
}
