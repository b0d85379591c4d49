/// The error codes of PROTOCOL.md §5, exactly as they appear on the wire.
package enum WireErrorCode: String, Sendable, CaseIterable {
    case invalidJSON = "invalid_json"
    case invalidUTF8 = "invalid_utf8"
    case notAnObject = "not_an_object"
    case tooLarge = "too_large"
    case missingField = "missing_field"
    case invalidField = "invalid_field"
    case unknownType = "unknown_type"
    case reservedField = "reserved_field"
    case misplacedHello = "misplaced_hello"
    case unsupportedProtocol = "unsupported_protocol"
    case rateLimited = "rate_limited"
    case rejected = "rejected"
    case unavailable = "unavailable"
    /// A subscriber whose credentials do not allow it (§9).
    case forbidden = "forbidden"
    /// A subscriber that did not read what it was sent (§9).
    case tooSlow = "too_slow"
    /// An event that breaks the tracking plan, refused under `tracking_plan_mode = enforce`.
    case planViolation = "plan_violation"
}

/// Why one line was refused: a protocol code and a message a person can act on.
package struct WireError: Error, Sendable, Equatable, CustomStringConvertible {
    package var code: WireErrorCode
    package var message: String
    /// True for errors about the connection itself (a bad hello): they carry no event number,
    /// and the daemon closes the connection after sending them.
    package var isAboutConnection: Bool

    package init(_ code: WireErrorCode, _ message: String, isAboutConnection: Bool = false) {
        self.code = code
        self.message = message
        self.isAboutConnection = isAboutConnection
    }

    package var description: String { "\(code.rawValue): \(message)" }
}
