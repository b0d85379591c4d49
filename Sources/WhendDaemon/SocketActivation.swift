import CSystemd
import Foundation
import WhendConfiguration
import WhendPluginHost

/// Sockets handed over by the service manager (`LISTEN_FDS`, `LISTEN_FDNAMES`), by name.
///
/// Under socket activation the `.socket` unit owns the event socket: connections wait in the
/// kernel while whend restarts, and whend neither creates, chmods nor removes the path.
struct SocketActivation {
    /// Descriptors by the names the `.socket` unit gave them (`FileDescriptorName=`).
    let descriptors: [String: Int32]

    /// Reads what the service manager passed, and clears those variables so that children
    /// do not inherit them.
    static func fromEnvironment() -> SocketActivation {
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        let count = sd_listen_fds_with_names(1, &names)
        guard count > 0 else { return SocketActivation(descriptors: [:]) }
        var descriptors: [String: Int32] = [:]
        for i in 0..<Int(count) {
            let fd = SD_LISTEN_FDS_START + Int32(i)
            var name = names?[i].map { String(cString: $0) } ?? "unknown"
            // A single unnamed socket is the event socket.
            if count == 1 && (name == "unknown" || name.isEmpty) { name = "events" }
            descriptors[name] = fd
            free(names?[i])
        }
        free(names)
        return SocketActivation(descriptors: descriptors)
    }

    var events: Int32? { descriptors["events"] }
}
