import Foundation

/// A `posix_spawn` that failed: its error number.
public struct SpawnError: Error, CustomStringConvertible {
    public var code: Int32

    public init(code: Int32) { self.code = code }

    public var description: String { String(cString: strerror(code)) }
}

/// Starts `path` with `posix_spawn` (no fork of a large, threaded process): `path` and then
/// `arguments` as its argv, `environment` as the whole of its environment, its descriptors as
/// `arrange` sets them in the file actions (what they leave open is inherited). The C strings
/// and the file actions live only for the call.
/// - Returns: the child's pid, or the `posix_spawn` error.
///
/// Public for the benchmarks' package, which starts the daemons it measures with it.
public func spawnProcess(
    _ path: String, _ arguments: [String], environment: [String: String],
    arrange: (inout posix_spawn_file_actions_t) -> Void
) -> Result<pid_t, SpawnError> {
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
        argv.forEach { free($0) }
        envp.forEach { free($0) }
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    arrange(&actions)
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, path, &actions, nil, argv, envp)
    return rc == 0 ? .success(pid) : .failure(SpawnError(code: rc))
}
