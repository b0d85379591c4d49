import Foundation
import Testing
import WhendWire

/// What other local users, and whoever reads whend's output, can get at: secrets in reload
/// output, the log, status and --check-config; the sockets' directory; the modes of what whend
/// writes; a reader that goes away.
@Suite(.serialized) struct LocalBoundaryTests {
    /// A write key from a systemd credential reaches the plugin (the endpoint gets it); no secret
    /// — from the file, a credential, a header, a URL's user-info — is in `whenctl reload`'s
    /// answer, whend's log, `whenctl status` or `whend --check-config`, nor in the message of a
    /// plugin that quotes its configuration when it refuses it.
    @Test func secretsNeverShowInReloadStatusLogOrCheckConfig() throws {
        let server = try HTTPTestServer(answers: [.init(status: 200)])
        defer { server.stop() }
        let credentials = scratchDirectory("creds-e2e")
        let tag = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        let writeKey = "wk-cred-\(tag)"
        try (writeKey + "\n").write(toFile: credentials + "/analytics-key", atomically: true, encoding: .utf8)
        let (token1, token2, password1, password2, other) =
            ("tok1-\(tag)", "tok2-\(tag)", "pw1-\(tag)", "pw2-\(tag)", "sec-\(tag)")
        let config = credentials + "/whend.conf"
        func write(token: String, password: String, endpointUserInfo: String?) throws {
            let analyticsEndpoint =
                endpointUserInfo.map { "ftp://\($0)@127.0.0.1:\(server.port)/v1/batch" }
                ?? "http://127.0.0.1:\(server.port)/v1/batch"
            try """
            pipeline.analytics = analytics
            plugin.analytics = {"endpoint": "\(analyticsEndpoint)", "file": null, "flush_interval": 0.2, "write_key": "$credential:analytics-key"}
            plugin.otlp = {"endpoint": "http://user:\(password)@127.0.0.1:9/v1/logs", "headers": {"Authorization": "Bearer \(token)"}}
            plugin.other = {"nested": {"client_secret": "\(other)"}}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        }
        try write(token: token1, password: password1, endpointUserInfo: nil)
        let daemon = TestDaemon.live("secrets-e2e", arguments: ["--config", config])
        daemon.environment = ["CREDENTIALS_DIRECTORY": credentials]
        try daemon.start()
        defer { daemon.stop() }

        // The credential reached the plugin: the endpoint got it as HTTP Basic auth.
        try sendSession(daemon, app: "com.example.mail", session: "s-1", [#"{"type":"when","name":"opened"}"#])
        #expect(eventually { !server.requests.isEmpty })
        let basic = "Basic " + Data((writeKey + ":").utf8).base64EncodedString()
        #expect(server.requestHeads.first?.lowercased().contains("authorization: \(basic.lowercased())") == true)

        // A reload that changes every secret, and then one that the plugin refuses quoting its URL.
        let rotated = "wk-rotated-\(tag)"
        try (rotated + "\n").write(toFile: credentials + "/analytics-key", atomically: true, encoding: .utf8)
        try write(token: token2, password: password2, endpointUserInfo: nil)
        let reload = try daemon.whenctl(["reload"])
        #expect(reload.status == 0, "\(reload.error)")
        #expect(reload.output.contains("plugin.otlp") && reload.output.contains("***"), "\(reload.output)")
        #expect(reload.output.contains("plugin.analytics"), "a rotated credential is a change: \(reload.output)")
        // The plugin refuses an ftp endpoint, quoting it: the reload and --check-config are
        // refused with the plugin's message, which must not carry the URL's password.
        try write(token: token2, password: password2, endpointUserInfo: "user:\(password1)")
        let refused = try daemon.whenctl(["reload"])
        #expect(refused.status != 0, "\(refused.output)")
        #expect((refused.output + refused.error).contains("analytics"), "\(refused.output) \(refused.error)")
        let refusedCheck = try runCommand(
            executable("whend"), ["--config", config, "--check-config"],
            environment: ["CREDENTIALS_DIRECTORY": credentials])
        #expect(refusedCheck.status != 0, "\(refusedCheck.output)")
        try write(token: token2, password: password2, endpointUserInfo: nil)
        let status = try daemon.whenctl(["status", "--json"])
        let check = try runCommand(
            executable("whend"), ["--config", config, "--check-config"],
            environment: ["CREDENTIALS_DIRECTORY": credentials])
        #expect(check.status == 0, "\(check.error)")
        // (The file's own quoting: a value with quotes in it is printed "quoted".)
        #expect(check.output.contains(#"\"write_key\": \"***\""#), "\(check.output)")

        let shown = [
            ("reload", reload.output + reload.error), ("refused reload", refused.output + refused.error),
            ("log", daemon.log), ("status", status.output), ("check-config", check.output + check.error),
            ("refused check-config", refusedCheck.output + refusedCheck.error),
        ]
        for (place, text) in shown {
            for secret in [writeKey, rotated, token1, token2, password1, password2, other] {
                #expect(!text.contains(secret), "\(secret) in \(place): \(text)")
            }
        }
    }

    /// A configuration refused for a plugin's value that is not JSON does not quote it.
    @Test func aRefusedPluginValueIsNotQuoted() throws {
        let directory = scratchDirectory("secret-bad")
        try #"plugin.x = {"password": "pw-bad-1", "n": [1,}"#.write(
            toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let check = try runCommand(executable("whend"), ["--config", directory + "/whend.conf", "--check-config"])
        #expect(check.status == 2)
        #expect(check.error.contains("plugin.x") && !check.error.contains("pw-bad-1"), "\(check.error)")
        // JSON spread over lines, and more JSON after the value: the lines are not quoted.
        for text in ["plugin.x = {\"n\": 1}\n  \"token\": \"pw-bad-2\"", #"plugin.x = {"n": 1} "token": "pw-bad-2"}"#] {
            try text.write(toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
            let spread = try runCommand(executable("whend"), ["--config", directory + "/whend.conf", "--check-config"])
            #expect(spread.status == 2 && !spread.error.contains("pw-bad-2"), "\(spread.error)")
        }
        // A credential that cannot be read refuses the configuration, saying what to do.
        try #"plugin.x = {"token": "$credential:missing"}"#.write(
            toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let missing = try runCommand(
            executable("whend"), ["--config", directory + "/whend.conf", "--check-config"],
            environment: ["CREDENTIALS_DIRECTORY": directory])
        #expect(missing.status == 2)
        // A configuration file the user may not read (the packaged one is root:whend-config 0640).
        if getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") {
            chmod(directory, 0o755)
            chmod(directory + "/whend.conf", 0o640)
            let denied = try runCommand(
                "/usr/bin/setpriv",
                [
                    "--reuid=65534", "--regid=65534", "--clear-groups", executable("whend"), "--config",
                    directory + "/whend.conf", "--check-config",
                ])
            #expect(denied.status == 2 && denied.error.contains("may hold secrets"), "\(denied.error)")
        }
        #expect(
            missing.error.contains("plugin.x") && missing.error.contains("\(directory)/missing"), "\(missing.error)")
    }

    /// With no runtime directory set, whend and whenctl fall back on /tmp/whend-$UID: only when
    /// it is the user's own (not a symbolic link, owned by them, not writable by others), and
    /// whend makes it 0700 when it is missing. Each case runs in a mount namespace of its own
    /// with a fresh tmpfs on /tmp, so that the real /tmp/whend-0 of other tests is not touched
    /// and no override of the path is needed. A directory that is the user's own may still hold
    /// sockets another user bound while it was not (`socket-of-another`): the clients refuse
    /// those too.
    @Test(arguments: ["owned-by-nobody", "writable-by-others", "symbolic-link", "socket-of-another", "missing"])
    func theTemporaryRuntimeDirectoryMustBeTheUsersOwn(_ setup: String) throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare") else { return }
        let prepare: String
        switch setup {
        case "owned-by-nobody": prepare = "mkdir $dir && chown nobody $dir && chmod 0777 $dir"
        case "writable-by-others": prepare = "mkdir $dir && chmod 0777 $dir"
        case "symbolic-link": prepare = "mkdir -m 0700 /tmp/elsewhere && ln -s /tmp/elsewhere $dir"
        case "socket-of-another": prepare = "mkdir -m 0777 $dir"
        default: prepare = "true"
        }
        let script = """
            set -u
            # The build may live under /tmp (a clone there): its directory is kept open and
            # put back in place over the fresh tmpfs, at the same path (mount must not resolve
            # the descriptor's path, which the tmpfs now hides).
            bin=$(dirname "$1")
            exec 9<"$bin"
            mount -t tmpfs -o size=16m tmpfs /tmp || { echo "no tmpfs"; exit 0; }
            case "$bin" in /tmp/*) mkdir -p "$bin" && mount --no-canonicalize --bind /proc/self/fd/9 "$bin" ;; esac
            dir=/tmp/whend-$(id -u)
            \(prepare)
            unset XDG_RUNTIME_DIR RUNTIME_DIRECTORY WHEND_SOCKET WHEND_CONTROL_SOCKET
            # An app (whend-demo, through WhenClient) sends nothing to a socket another user could
            # have put there.
            as=""
            [ "$4" = socket-of-another ] && as="setpriv --reuid=65534 --regid=65534 --clear-groups"
            if [ "$4" != missing ]; then
                $as /usr/bin/python3 -c '
            import socket, sys
            c = socket.socket(socket.AF_UNIX); c.bind(sys.argv[2]); c.listen(5)
            s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(5); s.settimeout(2.5); n = 0
            try:
                while True:
                    c, _ = s.accept(); c.settimeout(1)
                    try:
                        while True:
                            d = c.recv(65536)
                            if not d: break
                            n += len(d)
                    except OSError: pass
            except OSError: pass
            print("attacker-received=%d" % n)' $dir/events.sock $dir/control.sock > /tmp/attacker.out 2>&1 &
                attacker=$!
                for i in $(seq 50); do [ -S $dir/events.sock ] && break; sleep 0.1; done
                # Made private after the other user's sockets are in it.
                [ "$4" = socket-of-another ] && chmod 0700 $dir
                timeout 5 "$3" --duration 1 --quiet > /dev/null 2>&1
                wait $attacker
                cat /tmp/attacker.out
                [ "$4" = socket-of-another ] || rm -f $dir/events.sock $dir/control.sock
            fi
            # whenctl first: a socket in a directory that is not the user's own is not asked.
            "$2" status > /tmp/whenctl.out 2>&1
            echo "whenctl=$?"
            timeout 15 "$1" --state-dir /tmp/state --builtin-pipelines false > /tmp/whend.log 2>&1 &
            pid=$!
            for i in $(seq 150); do
                [ -S $dir/control.sock ] && break
                kill -0 $pid 2>/dev/null || break
                sleep 0.1
            done
            if [ -S $dir/control.sock ]; then
                echo "listening mode=$(stat -c %a $dir) owner=$(stat -c %u $dir)"
                "$2" status > /dev/null 2>&1 && echo "status-ok"
                kill -TERM $pid
            fi
            wait $pid
            echo "whend=$?"
            cat /tmp/whenctl.out /tmp/whend.log
            """
        let run = try runCommand(
            "/usr/bin/unshare",
            [
                "--mount", "--propagation", "private", "sh", "-c", script, "sh", executable("whend"),
                executable("whenctl"), executable("whend-demo"), setup,
            ])
        if run.output.hasPrefix("no tmpfs") { return }
        if setup == "socket-of-another" {
            #expect(run.output.contains("attacker-received=0\n"), "\(run.output)")
            #expect(run.output.contains("whenctl=1"), "\(run.output)")
            #expect(
                run.output.contains("will not connect to /tmp/whend-0/control.sock: it belongs to uid 65534"),
                "\(run.output)")
            #expect(run.output.contains("set XDG_RUNTIME_DIR"), "\(run.output)")
            return
        }
        if setup == "missing" {
            #expect(run.output.contains("listening mode=700 owner=0"), "\(run.output)\(run.error)")
            #expect(run.output.contains("status-ok") && run.output.contains("whend=0"), "\(run.output)")
            return
        }
        // whend refuses at start (exit 1), saying why and what to do; whenctl asks no one.
        #expect(!run.output.contains("listening"), "\(run.output)")
        #expect(run.output.contains("whend=1"), "\(run.output)")
        #expect(run.output.contains("whenctl=1"), "\(run.output)")
        #expect(run.output.contains("attacker-received=0\n"), "\(run.output)")
        let why = [
            "owned-by-nobody": "belongs to uid 65534", "writable-by-others": "may be written by others (mode 0777)",
            "symbolic-link": "is a symbolic link",
        ][setup]!
        #expect(run.output.contains("refusing to listen: /tmp/whend-0 \(why)"), "\(run.output)")
        #expect(
            run.output.contains("will not connect to /tmp/whend-0/control.sock: /tmp/whend-0 \(why)"), "\(run.output)")
        #expect(run.output.contains("set XDG_RUNTIME_DIR"), "\(run.output)")
    }

    /// Everything whend and its built-in plugins write under the state directory — segments,
    /// cursors, snapshots, crash reports, the session index, the analytics file and spool, the
    /// lock — is 0640 at most, every directory 0750 at most: nothing for other users. The spool,
    /// which holds events on their way to an endpoint, is 0600 from its creation (its compaction,
    /// which no delivery starts here, leaves it so too).
    @Test func nothingUnderTheStateDirectoryIsForOtherUsers() throws {
        let directory = scratchDirectory("modes-conf")
        let unreachable = #"plugin.analytics = {"endpoint": "http://127.0.0.1:9/v1/batch", "flush_interval": 0.2}"#
        try "pipeline_snapshot_interval = 0.2\n\(unreachable)\n".write(
            toFile: directory + "/whend.conf", atomically: true, encoding: .utf8)
        let daemon = TestDaemon.live(
            "modes", arguments: ["--builtin-pipelines", "true", "--config", directory + "/whend.conf"])
        try daemon.start()
        defer { daemon.stop() }
        try sendSession(
            daemon, app: "com.example.mail", session: "m-1",
            [
                #"{"type":"navigation","action":"root","screen":"Inbox"}"#,
                #"{"type":"lifecycle","screen":"Inbox","status":"willAppear","isBeingPresentedInitially":true}"#,
                #"{"type":"lifecycle","screen":"Inbox","status":"didAppear","isBeingPresentedInitially":true}"#,
                #"{"type":"when","name":"userOpensMail"}"#,
                #"{"type":"error","message":"index out of range","fatal":true}"#,
            ])
        let state = daemon.stateDirectory
        let expected = [
            "/plugins/analytics/events.ndjson", "/pipelines/screens/snapshot", "/pipelines/crashes/snapshot",
            "/plugins/crash-reports/reports", "/whend.lock", "/plugins/analytics/spool.ndjson",
        ]
        #expect(
            eventually(30) { expected.allSatisfy { FileManager.default.fileExists(atPath: state + $0) } },
            "\(expected.filter { !FileManager.default.fileExists(atPath: state + $0) })")
        #expect(daemon.stop() == 0)
        var looked = 0
        let walker = FileManager.default.enumerator(atPath: state)
        var paths = [state]
        while let relative = walker?.nextObject() as? String { paths.append(state + "/" + relative) }
        for path in paths {
            var st = stat()
            guard lstat(path, &st) == 0 else { continue }
            let mode = st.st_mode & 0o7777
            looked += 1
            switch st.st_mode & S_IFMT {
            case S_IFDIR: #expect(mode & ~0o750 == 0, "\(path) is a directory of mode 0\(String(mode, radix: 8))")
            default: #expect(mode & ~0o640 == 0, "\(path) has mode 0\(String(mode, radix: 8))")
            }
        }
        #expect(looked > 20, "\(paths)")
        var spool = stat()
        #expect(lstat(state + "/plugins/analytics/spool.ndjson", &spool) == 0)
        #expect(spool.st_mode & 0o7777 == 0o600, "the spool has mode 0\(String(spool.st_mode & 0o7777, radix: 8))")
    }

    /// whenctl ignores SIGPIPE: a reader that goes away (`whenctl cat | head -1`) ends it with
    /// exit status 0 through EPIPE, not a death by signal.
    @Test func whenctlEndsQuietlyWhenItsReaderGoesAway() throws {
        let daemon = TestDaemon.live("sigpipe")
        try daemon.start()
        let noise = String(repeating: "n", count: 200)
        let events = (1...1000).map { #"{"type":"when","name":"e\#($0)","params":{"noise":"\#(noise)"}}"# }
        #expect(try exchange(daemon.socketPath, [helloWithAcks] + events).acks.last == 1000)
        #expect(daemon.stop() == 0)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable("whenctl"))
        p.arguments = ["cat", "--state-dir", daemon.stateDirectory]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        // One line, as `head -1` reads it, then the reader is gone.
        var first: [UInt8] = []
        var byte: UInt8 = 0
        while byte != 0x0A, read(out.fileHandleForReading.fileDescriptor, &byte, 1) == 1 { first.append(byte) }
        #expect(String(decoding: first, as: UTF8.self).contains(#""name":"e1""#))
        try out.fileHandleForReading.close()
        p.waitUntilExit()
        #expect(p.terminationReason == .exit, "whenctl died of signal \(p.terminationStatus)")
        #expect(p.terminationStatus == 0)
    }

    /// The filesystem under whend: a state or socket directory read-only, owned by another user
    /// or writable by anyone. whend refuses at start (exit 1) with a message that says what to
    /// do; it never runs on a state directory another user could rewrite (its owner, or anyone
    /// when it is world-writable without the sticky bit, could put a symbolic link where whend,
    /// perhaps root, is about to write). Each case runs in a mount namespace of its own.
    @Test(arguments: [
        (
            "state-read-only", "mount -t tmpfs -o size=1m,ro,mode=0750 tmpfs $d/state", false,
            ["Read-only file system", "set --state-dir"]
        ),
        (
            "state-not-whends", "chown root $d/state && chmod 0755 $d/state", true,
            ["Permission denied", "set --state-dir"]
        ),
        (
            "state-owned-by-another", "chown nobody $d/state && chmod 0700 $d/state", false,
            ["belongs to uid 65534", "set --state-dir"]
        ),
        (
            "state-writable-by-anyone", "chmod 0777 $d/state", false,
            ["may be written by anyone (mode 0777)", "chmod go-w"]
        ),
        // Sticky or not: anyone may still make the journal/ or plugins/ whend would then use.
        (
            "state-sticky", "chmod 1777 $d/state", false,
            ["may be written by anyone (mode 01777)", "chmod go-w"]
        ),
        (
            "state-writable-by-group", "chmod 0770 $d/state", false,
            ["may be written by its group (gid 0) (mode 0770)", "set --state-dir"]
        ),
        // What another user put inside a state directory of whend's own before it was private.
        (
            "journal-of-another", "mkdir -m 0777 $d/state/journal && chown nobody $d/state/journal", false,
            ["state/journal belongs to uid 65534", "remove it"]
        ),
        (
            "plugins-of-another", "mkdir -p $d/state/plugins/analytics && chown -R nobody $d/state/plugins", false,
            ["state/plugins belongs to uid 65534", "remove it"]
        ),
        (
            "link-of-another",
            "mkdir -p $d/state/plugins/analytics && ln -s /etc/passwd $d/state/plugins/analytics/events.ndjson && chown -h nobody $d/state/plugins/analytics/events.ndjson",
            false, ["analytics/events.ndjson belongs to uid 65534", "remove it"]
        ),
        // A link whend would write through, to a directory another user owns and anyone may
        // write (crash reports were written there), or to one of whend's it may not.
        (
            "link-to-others-directory",
            "mkdir -p $d/state/plugins && mkdir -m 0777 $d/elsewhere && chown nobody $d/elsewhere && ln -s $d/elsewhere $d/state/plugins/crash-reports",
            false, ["elsewhere, which belongs to uid 65534", "remove the link"]
        ),
        (
            "link-to-writable-directory",
            "mkdir -m 0777 $d/journal && ln -s $d/journal $d/state/journal", false,
            ["which others may write (mode 0777)", "remove the link"]
        ),
        // Found from outside once links were followed: a chain through a link another user
        // owns (re-pointed after start, whend wrote segments there); a dangling link (another
        // user made its target later); a link to a directory whend would "repair" (it chmod-ed
        // a 1777 directory outside the state directory to 0755).
        (
            "link-through-others-link",
            "mkdir -m 0755 $d/mine $d/hop && chown nobody $d/hop && ln -s $d/mine $d/hop/j && chown -h nobody $d/hop/j && ln -s $d/hop/j $d/state/journal",
            false, ["hop, which belongs to uid 65534", "remove the link"]
        ),
        (
            "link-dangling", "ln -s $d/not-yet $d/state/journal", false,
            ["not-yet, which does not exist", "remove the link"]
        ),
        (
            "link-to-directory-not-whends-to-repair",
            "mkdir -p $d/victim/open && chmod 1777 $d/victim/open && mkdir -p $d/state/plugins && ln -s $d/victim $d/state/plugins/extra && stat -c %a $d/victim/open",
            false, ["plugins/extra/open may be written by others (mode 01777)", "remove it"]
        ),
        (
            "socket-dir-not-whends", "chown root $d/run && chmod 0755 $d/run", true,
            ["cannot listen on", "set --socket"]
        ),
        (
            "socket-dir-read-only", "mount -t tmpfs -o size=1m,ro tmpfs $d/run", false,
            ["Read-only file system", "set --socket"]
        ),
    ])
    func aDirectoryWhendCannotOwnIsRefusedSayingWhatToDo(
        _ name: String, _ prepare: String, _ asNobody: Bool, _ expected: [String]
    ) throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else { return }
        let d = scratchDirectory("fs-" + name)
        chmod(d, 0o755)
        let script = """
            set -u
            d=$1
            mkdir -p $d/state $d/run
            [ "$3" = nobody ] && chown nobody $d/state $d/run
            \(prepare) || { echo "cannot prepare"; exit 0; }
            user=""
            [ "$3" = nobody ] && user="setpriv --reuid=65534 --regid=65534 --clear-groups"
            timeout 15 $user "$2" --config /dev/null --state-dir $d/state --socket $d/run/events.sock --builtin-pipelines false
            echo "whend=$?"
            """
        let run = try runCommand(
            "/usr/bin/unshare",
            [
                "--mount", "--propagation", "private", "sh", "-c", script, "sh", d, executable("whend"),
                asNobody ? "nobody" : "root",
            ])
        if run.output.contains("cannot prepare") { return }
        #expect(run.output.contains("whend=1"), "\(name): \(run.output) \(run.error)")
        for text in expected { #expect(run.error.contains(text), "\(name): no \"\(text)\" in \(run.error)") }
    }

}
