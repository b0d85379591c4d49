/// whend's version, as the welcome line's `server` field reports it (`whend/<version>`).
public enum WhendVersion {
    public static let current = "0.1.0"
    public static let protocolVersion = 1
}
