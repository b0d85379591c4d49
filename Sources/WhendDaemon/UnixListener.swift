import Foundation
import NIOCore
import NIOPosix
import WhendWire

/// Where whend listens: the socket the service manager passed under a name, else a path bound
/// privately (the socket never exists at its path with wider permissions), after a leftover
/// socket file is removed and a live daemon on the path refused. For the event and the control
/// socket alike.
struct UnixListener: Sendable {
    let activation: SocketActivation

    /// Takes the socket named `name` from the service manager, else binds `path` with `mode`.
    func listen(
        _ bootstrap: ServerBootstrap, name: String, what: String, path: String, mode: mode_t, flag: String
    ) async throws -> (channel: Channel, description: String) {
        if let fd = activation.descriptors[name] {
            do {
                return (
                    try await bootstrap.withBoundSocket(fd).get(), "the \(what) from the service manager (fd \(fd))"
                )
            } catch {
                throw DaemonStartError.inheritedSocketUnusable(what: what, fd: fd, reason: "\(error)")
            }
        }
        try prepareSocketPath(path, what: what, flag: flag)
        do {
            return (try await bindPrivately(bootstrap, path: path, mode: mode), path)
        } catch {
            throw DaemonStartError.cannotListen(path: path, what: what, reason: "\(error)", flag: flag)
        }
    }

    /// Creates the socket's directory, and removes a socket file left by a daemon that is gone.
    /// Refuses to start when another daemon answers on the path.
    /// Binds the socket in a private (0700) directory beside `path`, gives it `mode`, then renames
    /// it into place, so that it never exists at `path` with wider permissions. (A umask would do
    /// the same for one thread, but the umask is the whole process's: plugin and pipeline
    /// directories created meanwhile on other threads would get the socket's mode.)
    private func bindPrivately(_ bootstrap: ServerBootstrap, path: String, mode: mode_t) async throws -> Channel {
        var template = Array(((path as NSString).deletingLastPathComponent + "/.whend-XXXXXX").utf8CString)
        let staging: String? = template.withUnsafeMutableBufferPointer { buffer in
            mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
        }
        // sun_path holds 107 bytes; a path too long to stage beside is bound directly.
        guard let staging, staging.utf8.count + 2 < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else {
            let channel = try await bootstrap.bind(unixDomainSocketPath: path).get()
            chmod(path, mode)
            return channel
        }
        let staged = staging + "/s"
        defer {
            unlink(staged)
            rmdir(staging)
        }
        let channel = try await bootstrap.bind(unixDomainSocketPath: staged).get()
        guard chmod(staged, mode) == 0, rename(staged, path) == 0 else {
            let error = IOError(errnoCode: errno, reason: "placing the socket at \(path)")
            channel.close(promise: nil)
            throw error
        }
        return channel
    }

    private func prepareSocketPath(_ path: String, what: String, flag: String) throws {
        let directory = (path as NSString).deletingLastPathComponent
        if directory == SocketLocation.temporaryRuntimeDirectory {
            if let reason = SocketLocation.checkPrivateDirectory(directory, create: true) {
                throw DaemonStartError.socketDirectoryNotPrivate(reason: reason)
            }
        } else if !FileManager.default.fileExists(atPath: directory) {
            do {
                try FileManager.default.createDirectory(
                    atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            } catch {
                throw DaemonStartError.socketDirectoryUnusable(directory: directory, what: what, reason: "\(error)")
            }
        }
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        guard st.st_mode & S_IFMT == S_IFSOCK else {
            throw DaemonStartError.notASocket(path: path, flag: flag)
        }
        if socketAnswers(path) {
            throw DaemonStartError.socketInUse(path: path, flag: flag)
        }
        unlink(path)
    }

    /// Whether a process listens at `path` (else the file is left over from one that died).
    private func socketAnswers(_ path: String) -> Bool {
        (try? BlockingSocket(path: path)) != nil
    }

}
