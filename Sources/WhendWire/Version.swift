/// whend's version, as the welcome line's `server` field reports it (`whend/<version>`).
package enum WhendVersion {
    package static let current = "0.1.0"
    package static let protocolVersion = 1
}
