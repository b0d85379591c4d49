import BuiltinPluginSupport
import CNats
import Foundation
import WhendPluginSDK
import WhendWire

/// Forwards every record to NATS JetStream: one message per record, on a subject from a
/// template, the record's JSON as payload, and `Nats-Msg-Id` = journal identity + `_seq`, so
/// that JetStream's duplicate window turns a redelivery after a crash into exactly-once in the
/// stream. Publishes asynchronously with at most `max_in_flight` unacknowledged; the pipeline's
/// cursor passes a record only once JetStream has acknowledged it (a deferred stage). A publish
/// that fails or is not acknowledged within `ack_timeout` is sent again, with backoff. The
/// configuration keys are in docs/plugins.md.
final class Nats: WhendPlugin {
    static let name = "nats"
    static let version = "1.0.0"
    static let roles: PluginRoles = [.pipeline, .deferred]

    private let host: PluginHost
    private let hostName: String
    /// The subject of the record in hand, built in place: no String per record.
    @exclusivity(unchecked) private var subject: [UInt8] = []
    private let journalID: String
    private let ackTimeout: Int64
    private var connection: OpaquePointer?
    private var jetStream: OpaquePointer?
    private let resender: Resender

    enum TemplatePart {
        case literal(String)
        case field(String)
    }
    /// The template with its literals and `{host}` as bytes, resolved once.
    private enum SubjectPart {
        case bytes([UInt8])
        case field(String)
    }
    private let subjectParts: [SubjectPart]

    init(host: PluginHost, configuration c: [String: Any]) throws {
        self.host = host
        let servers = (c["servers"] as? [String]) ?? [c["url"] as? String ?? "nats://127.0.0.1:4222"]
        let template = try Self.parseTemplate(c["subject"] as? String ?? "whend.{host}.{app}.{type}")
        hostName = Self.token(c["host"] as? String ?? ProcessInfo.processInfo.hostName)
        subjectParts = template.map { [hostName] part in
            switch part {
            case .literal(let text): return .bytes(Array(text.utf8))
            case .field("host"): return .bytes(Array(hostName.utf8))
            case .field(let key): return .field(key)
            }
        }
        ackTimeout = Int64((c["ack_timeout"] as? Double ?? 5) * 1000)
        journalID = try c["journal_id"] as? String ?? Self.journalIdentity(host.stateDirectory)
        resender = Resender(host: host, maxBackoff: c["max_backoff"] as? Double ?? 5)

        var options: OpaquePointer?
        try Self.check(natsOptions_Create(&options), "natsOptions_Create")
        defer { natsOptions_Destroy(options) }
        var urls = servers.map { strdup($0) }
        defer { urls.forEach { free($0) } }
        try urls.withUnsafeMutableBufferPointer { buffer in
            try buffer.withMemoryRebound(to: UnsafePointer<CChar>?.self) {
                try Self.check(natsOptions_SetServers(options, $0.baseAddress, Int32($0.count)), "servers \(servers)")
            }
        }
        natsOptions_SetName(options, "whend \(hostName)")
        // Never give up on the server: the pipeline waits at its cursor meanwhile.
        natsOptions_SetMaxReconnect(options, -1)
        natsOptions_SetReconnectWait(options, 250)
        natsOptions_SetRetryOnFailedConnect(options, true, nil, nil)
        if let credentials = c["credentials"] as? String {
            try Self.check(
                natsOptions_SetUserCredentialsFromFiles(options, credentials, nil), "credentials \(credentials)")
        }
        if let tls = c["tls"] as? [String: Any] {
            try Self.check(natsOptions_SetSecure(options, true), "tls")
            if let ca = tls["ca"] as? String {
                try Self.check(natsOptions_LoadCATrustedCertificates(options, ca), "tls ca \(ca)")
            }
            if let cert = tls["cert"] as? String, let key = tls["key"] as? String {
                try Self.check(natsOptions_LoadCertificatesChain(options, cert, key), "tls cert \(cert)")
            }
        }
        // With retry on failed connect, NATS_NOT_YET_CONNECTED means it keeps trying.
        let connected = natsConnection_Connect(&connection, options)
        guard connected == NATS_OK || connected == NATS_NOT_YET_CONNECTED else {
            throw PluginError.fail(
                "nats: cannot connect to \(servers.joined(separator: ", ")): \(Self.text(connected))")
        }

        var jsOptions = jsOptions()
        jsOptions_Init(&jsOptions)
        jsOptions.PublishAsync.MaxPending = Int64(c["max_in_flight"] as? Int ?? 1000)
        jsOptions.PublishAsync.StallWait = 1000
        jsOptions.PublishAsync.AckHandler = natsAckHandler
        jsOptions.PublishAsync.AckHandlerClosure = Unmanaged.passUnretained(resender).toOpaque()
        jsOptions.Wait = ackTimeout
        try Self.check(natsConnection_JetStream(&jetStream, connection, &jsOptions), "JetStream context")
        resender.jetStream = jetStream
        resender.ackTimeout = ackTimeout
        resender.start()

        if let stream = c["stream"] as? String {
            try ensureStream(stream, c)
        }
        host.log(.info, "forwarding to \(servers.joined(separator: ", ")) as journal \(journalID)")
    }

    deinit {
        // Wait for what is in flight, so that its completions reach the cursor.
        var options = jsPubOptions()
        jsPubOptions_Init(&options)
        options.MaxWait = 5000
        _ = js_PublishAsyncComplete(jetStream, &options)
        resender.stop()
        jsCtx_Destroy(jetStream)
        natsConnection_Destroy(connection)
    }

    func handle(_ record: PluginRecord, next: PluginNext) throws {
        // Fields come from the record's field index (no JSON tree), and the subject is built as
        // bytes: as Strings, a character at a time, it was a quarter of the worker's time.
        subject.removeAll(keepingCapacity: true)
        for part in subjectParts {
            switch part {
            case .bytes(let bytes): subject += bytes
            case .field(let key): Self.appendToken(record.field(key), to: &subject)
            }
        }
        subject.append(0)
        var message: OpaquePointer?
        let created = subject.withUnsafeBufferPointer { subject in
            record.bytes.withMemoryRebound(to: CChar.self) { data in
                subject.withMemoryRebound(to: CChar.self) {
                    natsMsg_Create(&message, $0.baseAddress, nil, data.baseAddress, Int32(data.count))
                }
            }
        }
        try Self.check(created, "message")
        natsMsgHeader_Set(message, "Nats-Msg-Id", "\(journalID)-\(record.seq)")
        guard resender.publish(&message) else {
            natsMsg_Destroy(message)
            // Not connected, or too much in flight for too long: the pipeline retries this record.
            let why = nats_GetLastError(nil).map { String(cString: $0) } ?? "not connected"
            throw PluginError.fail("nats: cannot publish now (\(why))")
        }
        try next(record)
    }

    private func ensureStream(_ name: String, _ c: [String: Any]) throws {
        let subjects = c["subjects"] as? [String] ?? ["whend.>"]
        var info: UnsafeMutablePointer<jsStreamInfo>?
        var error = jsErrCode(rawValue: 0)
        let found = js_GetStreamInfo(&info, jetStream, name, nil, &error)
        if found == NATS_OK, let info {
            defer { jsStreamInfo_Destroy(info) }
            let config = info.pointee.Config.pointee
            let have = (0..<Int(config.SubjectsLen)).compactMap { config.Subjects[$0].map { String(cString: $0) } }
            let missing = subjects.filter { !have.contains($0) }
            guard missing.isEmpty else {
                throw PluginError.fail(
                    "nats: stream \(name) exists but does not take subjects \(missing.joined(separator: ", ")) (it takes \(have.joined(separator: ", "))); add them, or set \"subjects\" to match"
                )
            }
            return
        }
        guard error == JSStreamNotFoundErr else {
            throw PluginError.fail("nats: cannot look up stream \(name): \(Self.text(found)) (\(error.rawValue))")
        }
        guard c["create_stream"] as? Bool ?? false else {
            throw PluginError.fail(
                "nats: stream \(name) does not exist; create it (subjects \(subjects.joined(separator: ", "))), or set \"create_stream\": true"
            )
        }
        var config = jsStreamConfig()
        jsStreamConfig_Init(&config)
        let cName = strdup(name)
        var cSubjects = subjects.map { UnsafePointer(strdup($0)) }
        defer {
            free(cName)
            cSubjects.forEach { free(UnsafeMutablePointer(mutating: $0)) }
        }
        config.Name = UnsafePointer(cName)
        config.SubjectsLen = Int32(subjects.count)
        config.Replicas = Int64(c["replicas"] as? Int ?? 1)
        config.Retention = (c["retention"] as? String) == "interest" ? js_InterestPolicy : js_LimitsPolicy
        config.Storage = js_FileStorage
        // The window in which a redelivered Nats-Msg-Id is recognised.
        config.Duplicates = Int64((c["duplicate_window"] as? Double ?? 600) * 1e9)
        var created: UnsafeMutablePointer<jsStreamInfo>?
        let status = cSubjects.withUnsafeMutableBufferPointer { buffer -> natsStatus in
            buffer.withMemoryRebound(to: UnsafePointer<CChar>?.self) { subjects in
                config.Subjects = subjects.baseAddress
                return js_AddStream(&created, jetStream, &config, nil, &error)
            }
        }
        guard status == NATS_OK else {
            throw PluginError.fail("nats: cannot create stream \(name): \(Self.text(status)) (\(error.rawValue))")
        }
        jsStreamInfo_Destroy(created)
        host.log(.info, "created stream \(name) (\(subjects.joined(separator: ", ")), \(config.Replicas) replica(s))")
    }

    /// A stable identity for this journal's records, kept beside the plugin's state.
    static func journalIdentity(_ directory: String) throws -> String {
        let path = directory + "/journal-id"
        if let text = try? String(contentsOfFile: path, encoding: .utf8), !text.isEmpty {
            return text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let id = String(UInt64.random(in: 0...UInt64.max), radix: 36)
        try writeFileAtomically(Array(id.utf8), to: path)
        return id
    }

    static func parseTemplate(_ text: String) throws -> [TemplatePart] {
        var parts: [TemplatePart] = []
        var rest = Substring(text)
        while let open = rest.firstIndex(of: "{") {
            if open > rest.startIndex { parts.append(.literal(String(rest[..<open]))) }
            guard let close = rest[open...].firstIndex(of: "}") else {
                throw PluginError.fail("nats: subject template \(text) has an unclosed {")
            }
            parts.append(.field(String(rest[rest.index(after: open)..<close])))
            rest = rest[rest.index(after: close)...]
        }
        if !rest.isEmpty { parts.append(.literal(String(rest))) }
        return parts
    }

    /// A subject token: no dots, spaces or wildcards.
    static func token(_ text: String) -> String {
        var bytes: [UInt8] = []
        appendToken(Array(text.utf8), to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A string field's value as a subject token (`none` for no string, or an empty one).
    static func appendToken(_ value: JSONValue?, to subject: inout [UInt8]) {
        guard let contents = value?.stringContents else { return subject += "none".utf8 }
        if contents.contains(UInt8(ascii: "\\")) {
            appendToken(decodeJSONString(contents), to: &subject)
        } else {
            appendToken(contents, to: &subject)
        }
    }

    /// Each byte that would end a token or be a wildcard (`.`, `*`, `>`, a space, a tab, CR or
    /// LF) becomes `_`, byte by byte: a subject is bytes to NATS, so a dot followed by a
    /// combining mark must go too. A NUL ends a C string, so it goes as well.
    static func appendToken<Bytes: Collection<UInt8>>(_ text: Bytes, to subject: inout [UInt8]) {
        guard !text.isEmpty else { return subject += "none".utf8 }
        for byte in text {
            switch byte {
            case UInt8(ascii: "."), UInt8(ascii: "*"), UInt8(ascii: ">"), UInt8(ascii: " "), 0x09, 0x0D, 0x0A, 0:
                subject.append(UInt8(ascii: "_"))
            default: subject.append(byte)
            }
        }
    }

    static func check(_ status: natsStatus, _ what: String) throws {
        guard status == NATS_OK else { throw PluginError.fail("nats: \(what): \(text(status))") }
    }

    static func text(_ status: natsStatus) -> String { String(cString: natsStatus_GetText(status)) }
}

/// Publishes, hears JetStream's acknowledgements (on libnats' thread), completes records, and
/// sends again what failed or timed out, after a backoff, from its own thread.
final class Resender: @unchecked Sendable {
    // Unchecked: `retries` and `stopped` are guarded by `condition`; `jetStream` and
    // `ackTimeout` are set once before `start`.
    let host: PluginHost
    var jetStream: OpaquePointer?
    var ackTimeout: Int64 = 5000
    private let maxBackoff: Double
    private let condition = NSCondition()
    private var retries: [(message: OpaquePointer, due: Date, attempt: Int)] = []
    private var stopped = false
    private let done = DispatchSemaphore(value: 0)

    init(host: PluginHost, maxBackoff: Double) {
        self.host = host
        self.maxBackoff = maxBackoff
    }

    /// Hands `message` to libnats (which then owns it); false if it could not take it.
    func publish(_ message: inout OpaquePointer?) -> Bool {
        var options = jsPubOptions()
        jsPubOptions_Init(&options)
        options.MaxWait = ackTimeout
        return js_PublishMsgAsync(jetStream, &message, &options) == NATS_OK
    }

    func acknowledged(_ message: OpaquePointer?, success: Bool, error: String) {
        guard let message else { return }
        if success {
            if let seq = Self.seq(of: message) { host.complete(seq) }
            natsMsg_Destroy(message)
            return
        }
        condition.withLock {
            retries.append((message, Date().addingTimeInterval(0.1), 1))
            condition.signal()
        }
        host.count("retries")
        host.log(.warning, "nats: a publish failed (\(error)); sending it again")
    }

    func start() {
        Thread { [self] in
            run()
            done.signal()
        }.start()
    }

    func stop() {
        condition.withLock {
            stopped = true
            condition.broadcast()
        }
        done.wait()
        for r in retries { natsMsg_Destroy(r.message) }
        retries.removeAll()
    }

    private func run() {
        while true {
            condition.lock()
            while !stopped && (retries.first.map { $0.due > Date() } ?? true) {
                _ = condition.wait(until: retries.first?.due ?? Date().addingTimeInterval(1))
            }
            if stopped {
                condition.unlock()
                return
            }
            var retry = retries.removeFirst()
            condition.unlock()
            var message: OpaquePointer? = retry.message
            if !publish(&message) {
                // Still no way through: later, with a longer wait, keeping the order of retries.
                retry.attempt += 1
                let wait = min(maxBackoff, 0.1 * pow(2, Double(min(retry.attempt, 10)))) * Double.random(in: 0.5...1.5)
                condition.withLock {
                    retries.insert((retry.message, Date().addingTimeInterval(wait), retry.attempt), at: 0)
                }
            }
        }
    }

    /// The `_seq` at the end of the message's `Nats-Msg-Id` (`<journal>-<seq>`), read in place.
    static func seq(of message: OpaquePointer) -> UInt64? {
        var value: UnsafePointer<CChar>?
        guard natsMsgHeader_Get(message, "Nats-Msg-Id", &value) == NATS_OK, let value else { return nil }
        let id = UnsafeBufferPointer(
            start: UnsafeRawPointer(value).assumingMemoryBound(to: UInt8.self), count: strlen(value))
        guard let dash = id.lastIndex(of: UInt8(ascii: "-")) else { return nil }
        return JSONBytes.parseUInt(UnsafeBufferPointer(rebasing: id[(dash + 1)...]))
    }
}

private let natsAckHandler:
    @convention(c) (
        OpaquePointer?, OpaquePointer?, UnsafeMutablePointer<jsPubAck>?, UnsafeMutablePointer<jsPubAckErr>?,
        UnsafeMutableRawPointer?
    ) -> Void = { _, message, ack, failure, closure in
        guard let closure else { return }
        let resender = Unmanaged<Resender>.fromOpaque(closure).takeUnretainedValue()
        let error = failure.map { f in f.pointee.ErrText.map { String(cString: $0) } ?? Nats.text(f.pointee.Err) } ?? ""
        resender.acknowledged(message, success: ack != nil && failure == nil, error: error)
    }

@_cdecl("whend_plugin_entry") public func whendPluginEntry() -> UnsafeRawPointer { exportPlugin(Nats.self) }
