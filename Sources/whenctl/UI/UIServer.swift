import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

/// The debugger page's HTTP server: 127.0.0.1 only, every request checked by `UIGuard`, the page
/// and its script and style from the binary, JSON and Server-Sent Events from `UISource`.
struct UIServer {
    let port: Int
    let token: String
    /// This run's own host name, `whenctl-<hex>.localhost` (see `UIGuard`).
    let site: String
    let source: UISource

    /// Serves until the process ends; `listening` is told the port once the socket is bound.
    func run(listening: @escaping @Sendable (Int) -> Void) async throws {
        let bound = UIBoundPort()
        let router = Router()
        router.add(middleware: UIGuard(token: token, site: site, port: bound))
        router.get("/") { _, _ in Self.asset(PackageResources.index_html, type: "text/html; charset=utf-8") }
        router.get("/app.js") { _, _ in
            Self.asset(PackageResources.app_js, type: "text/javascript; charset=utf-8")
        }
        router.get("/views.js") { _, _ in
            Self.asset(PackageResources.views_js, type: "text/javascript; charset=utf-8")
        }
        // The page has no icon; a browser asks all the same.
        router.get("/favicon.ico") { _, _ in Response(status: .noContent) }
        router.get("/style.css") { _, _ in Self.asset(PackageResources.style_css, type: "text/css; charset=utf-8") }
        let source = self.source
        router.get("/api/stream") { request, _ in
            UIStream.response(
                query: Dictionary(
                    request.uri.queryParameters.map { (String($0.key), String($0.value)) }, uniquingKeysWith: { $1 }),
                lastEventID: request.headers[.lastEventID], source: source)
        }
        router.get("/api/overview") { _, _ in Self.json(Self.encode(source.overview())) }
        router.get("/api/metrics") { _, _ in
            let text = try await blocking { try source.metrics() }
            return Self.text(.ok, text)
        }
        router.get("/api/rejections") { _, _ in Self.json(try await blocking { Self.encode(source.rejections()) }) }
        router.get("/api/plan-violations") { _, _ in
            Self.json(try await blocking { Self.encode(source.planViolations()) })
        }
        router.get("/api/sessions") { request, _ in
            let app = request.uri.queryParameters.get("app")
            return Self.json(try await blocking { Self.encode(source.sessions(app: app)) })
        }
        router.get("/api/crashes") { _, _ in Self.json(try await blocking { Self.encode(source.crashes()) }) }
        router.get("/api/crashes/:seq") { _, context in
            let seq = context.parameters.get("seq", as: UInt64.self) ?? 0
            guard let report = try await blocking({ source.crash(seq: seq).map { Self.encode($0) } }) else {
                return Self.text(.notFound, "no crash report #\(seq)")
            }
            return Self.json(report)
        }
        router.get("/api/record/:seq") { _, context in
            guard let seq = context.parameters.get("seq", as: UInt64.self), seq > 0 else {
                return Self.text(.badRequest, "a record is named by its _seq, a whole number from 1")
            }
            switch try await source.record(seq: seq) {
            case .found(let line): return Self.json(line)
            case .missing(let why): return Self.text(.notFound, why)
            }
        }
        router.get("/api/flow") { request, _ in
            let app = request.uri.queryParameters.get("app").flatMap { $0.isEmpty ? nil : $0 }
            return Self.json(Self.encode(try await source.flow(app: app)))
        }
        let app = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: nil),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? 0
                bound.set(port)
                listening(port)
            },
            logger: .init(label: "whenctl-ui") { _ in SwiftLogNoOpLogHandler() }
        )
        try await app.run()
    }

    /// Ends whenctl ui at once on SIGINT or SIGTERM: it holds nothing that needs saving, and an
    /// open event stream would hold a graceful stop for as long as a browser keeps it.
    static func stopOnSignals() {
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { Foundation.exit(0) }
            source.resume()
            UISignalSources.keep(source)
        }
    }

    static func asset(_ bytes: [UInt8], type: String) -> Response {
        Response(
            status: .ok, headers: [.contentType: type, .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func text(_ status: HTTPResponse.Status, _ text: String) -> Response {
        Response(
            status: status, headers: [.contentType: "text/plain; charset=utf-8", .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(string: text.hasSuffix("\n") ? text : text + "\n")))
    }

    static func json(_ bytes: [UInt8]) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func encode(_ object: [String: Any]) -> [UInt8] {
        let data =
            (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
            ?? Data("{}".utf8)
        return Array(data)
    }
}

/// The signal sources, kept alive for the process's life.
enum UISignalSources {
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []
    static func keep(_ source: any DispatchSourceSignal) { sources.append(source) }
}

/// The port the server was bound to, known once it listens (the Host check needs it).
final class UIBoundPort: @unchecked Sendable {
    // Unchecked: `value` is guarded by `lock`.
    private let lock = NSLock()
    private var value = 0
    func set(_ port: Int) { lock.withLock { value = port } }
    var port: Int { lock.withLock { value } }
}

/// Runs blocking work (a control request, a read of the state directory) on a thread of its
/// own: Swift's shared threads, as few as the cores, serve every request and stream.
func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

/// Every request: the Host must be this server's own (a page of another site that has its name
/// resolve to 127.0.0.1 names itself). The address printed names a host of this run's own,
/// `whenctl-<hex>.localhost` (browsers take any name under localhost to be the loopback), so
/// that the page is an origin no earlier server on this port can have been: a browser's cache
/// and service workers are kept per origin, and one that held the port before could otherwise
/// have left a script of its own cached as /app.js, or a worker, to run in the page and read
/// its token. 127.0.0.1:PORT and localhost:PORT are answered too. Every request for data: the token, as `Authorization:
/// Bearer` (the page's fetches) or `?token=` (its EventSource, which cannot set headers). The
/// page and its script and style hold no data and are served without it: the token comes to
/// the page in the address's fragment, which a browser never sends, and stays in the page's
/// local storage, which browsers keep apart by port, unlike cookies. Every answer: no
/// caching, no framing, no referrer, scripts only from this origin.
struct UIGuard<Context: RequestContext>: RouterMiddleware {
    let token: String
    let site: String
    let port: UIBoundPort

    /// What the page is made of: the same for everyone, and nothing of whend's.
    static var assets: Set<String> { ["/", "/app.js", "/views.js", "/style.css", "/favicon.ico"] }

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        var response: Response
        do {
            response = try await check(request, context: context, next: next)
        } catch let error as HTTPError {
            // What the framework refuses itself (a path or a method it has no route for) gets
            // the same headers as the rest.
            response = UIServer.text(error.status, error.body ?? "whenctl ui: \(error.status)")
        }
        response.headers[.crossOriginResourcePolicy] = "same-origin"
        response.headers[.contentSecurityPolicy] =
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        response.headers[.xFrameOptions] = "DENY"
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[.referrerPolicy] = "no-referrer"
        return response
    }

    private func check(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let port = self.port.port
        // The first Host became the authority; any other is still among the fields. Which one a
        // proxy in front would have judged by is unknowable, so neither is taken (RFC 9112 §3.2).
        guard request.headers[values: .extraHost].isEmpty else {
            return UIServer.text(.badRequest, "whenctl ui: refused: a request names one Host, not several")
        }
        let host = (request.head.authority ?? "").lowercased()
        guard host == "\(site):\(port)" || host == "127.0.0.1:\(port)" || host == "localhost:\(port)" else {
            return UIServer.text(
                .misdirectedRequest,
                "whenctl ui: refused: this server answers to \(site):\(port), 127.0.0.1:\(port) and localhost:\(port) only, not to Host \"\(printable(host, limit: 100))\" (a page of another site may have its name resolve here)"
            )
        }
        guard Self.assets.contains(request.uri.path) || presentsToken(request) else {
            return UIServer.text(
                .forbidden,
                "whenctl ui: refused: this page needs the token whenctl ui printed with its address (http://\(site):\(port)/#token=…); open that address"
            )
        }
        return try await next(request, context)
    }

    private func presentsToken(_ request: Request) -> Bool {
        if let query = request.uri.queryParameters.get("token"), UIToken.matches(Substring(query), token) {
            return true
        }
        // Every Authorization field is looked at: one that matches is enough.
        for field in request.headers[values: .authorization] {
            let parts = field.split(separator: " ", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "bearer",
                UIToken.matches(parts[1].trimmingCharacters(in: .whitespaces)[...], token)
            {
                return true
            }
        }
        return false
    }
}

extension HTTPField.Name {
    static let xFrameOptions = HTTPField.Name("X-Frame-Options")!
    static let referrerPolicy = HTTPField.Name("Referrer-Policy")!
    static let lastEventID = HTTPField.Name("Last-Event-ID")!
    static let crossOriginResourcePolicy = HTTPField.Name("Cross-Origin-Resource-Policy")!
    /// A Host field left among the fields: the first one became the request's authority.
    static let extraHost = HTTPField.Name("Host")!
}
