import Foundation
import WhendJournal

/// A configuration whend refuses: a case per kind of mistake, so that callers decide by case;
/// each says where (`source`: a file and line, `--flag` or `WHEND_KEY`), which key and what to
/// do, as the user reads it.
package enum SettingError: Error, CustomStringConvertible, Equatable {
    case unknownKey(source: String, key: String)
    case notAllowed(source: String, key: String, value: String, allowed: String)
    case unreadableFile(path: String, reason: String)
    case notText(path: String)
    case notKeyValue(source: String, line: String)
    case unclosedQuote(source: String, key: String)
    case textAfterValue(source: String, key: String, text: String, valueKind: String)
    case notJSON(source: String, key: String, reason: String)
    case setTwice(source: String, key: String, firstLine: Int)
    case unreadableSecret(key: String, reason: String)

    package var description: String {
        switch self {
        case .unknownKey(let source, let key):
            return
                "\(source): unknown key \"\(key)\"; the keys are \(Settings.all.map(\.key).joined(separator: ", ")) plugin.<name>, pipeline.<name> and isolation.<plugin>"
        case .notAllowed(let source, let key, let value, let allowed):
            // A plugin's value that is refused is not known to be JSON a redaction understands.
            guard !key.hasPrefix("plugin.") else {
                return
                    "\(source): the value of \(key) (not shown: it may hold a secret) is not allowed; \(key) takes \(allowed)"
            }
            return
                "\(source): \(key) = \"\(Secrets.shown(key: key, value: value))\" is not allowed; \(key) takes \(allowed)"
        case .unreadableFile(let path, let reason):
            // The packaged file may hold secrets: only root and its group may read it.
            let advice =
                reason == String(cString: strerror(EACCES))
                ? "; it may hold secrets, so only root and its group read it: run as one of them, or name another file with --config"
                : ""
            return "cannot read the configuration file \(path): \(reason)\(advice)"
        case .notText(let path):
            return "the configuration file \(path) is not UTF-8 text"
        case .notKeyValue(let source, let line):
            // Most likely the rest of a plugin's JSON spread over lines: it may hold a secret.
            guard !line.contains("\"") else {
                return
                    "\(source): expected key = value, got a line with quotes (not shown: it may hold a secret); a plugin's JSON goes on one line: plugin.<name> = {…}"
            }
            return "\(source): expected key = value, got \"\(line)\""
        case .unclosedQuote(let source, let key):
            return "\(source): the quoted value of \(key) is not closed"
        case .textAfterValue(let source, let key, let text, let valueKind):
            // After a plugin's JSON, likely more of it: it may hold a secret.
            let shown = key.hasPrefix("plugin.") ? "text (not shown: it may hold a secret)" : "\"\(text)\""
            return "\(source): \(shown) after the \(valueKind) value of \(key); put a # before a comment"
        case .notJSON(let source, let key, let reason):
            return "\(source): the value of \(key) is not a JSON object closed on its line: \(reason)"
        case .setTwice(let source, let key, let firstLine):
            return "\(source): \(key) is set again (first on line \(firstLine)); set it once"
        case .unreadableSecret(let key, let reason):
            return "\(key): cannot read the secret \(reason)"
        }
    }
}

/// One value for a setting, and where it came from (for error messages).
package struct SettingValue: Sendable {
    package var key: String
    package var value: String
    package var source: String

    package init(key: String, value: String, source: String) {
        self.key = key
        self.value = value
        self.source = source
    }
}

/// Every setting whend has, in one table: the configuration file, the environment
/// (`WHEND_<KEY>`) and the command-line flags all go through it, so that each key is validated
/// in one place and every error names the key and what it allows.
///
/// Precedence: the embedded default, then the file, then the environment, then the flags.
package enum Settings {
    /// Whether a running daemon can take up a new value on reload, or only at its next start.
    package enum Reload: Sendable {
        case live
        case restart
    }

    package struct Setting: Sendable {
        package let key: String
        package let allowed: String
        package let help: String
        package let reload: Reload
        /// The value as the configuration file would spell it.
        package let value: @Sendable (DaemonConfiguration) -> String
        package let apply: @Sendable (inout DaemonConfiguration, String) -> Bool
    }

    package static func int(
        _ range: ClosedRange<Int>, _ set: @escaping @Sendable (inout DaemonConfiguration, Int) -> Void
    )
        -> @Sendable (inout DaemonConfiguration, String) -> Bool
    {
        { c, v in
            guard let n = Int(v.replacingOccurrences(of: "_", with: "")), range.contains(n) else { return false }
            set(&c, n)
            return true
        }
    }

    /// A finite decimal of at least `floor`: seconds, or a rate or a burst of events.
    package static func seconds(
        atLeast floor: Double = 0, _ set: @escaping @Sendable (inout DaemonConfiguration, Double) -> Void
    )
        -> @Sendable (inout DaemonConfiguration, String) -> Bool
    {
        { c, v in
            guard let n = Double(v), n >= floor, n.isFinite else { return false }
            set(&c, n)
            return true
        }
    }

    package static func number(_ n: Double) -> String {
        n == n.rounded() && abs(n) < 1e15 ? String(Int(n)) : String(n)
    }

    package static let all: [Setting] = [
        Setting(
            key: "socket", allowed: "an absolute path", help: "the event socket", reload: .restart,
            value: { $0.socketPath }
        ) { c, v in
            guard v.hasPrefix("/") else { return false }
            c.socketPath = v
            return true
        },
        Setting(
            key: "socket_mode", allowed: "octal permission bits, like 0666", help: "mode of the event socket",
            reload: .live, value: { "0" + String($0.socketMode, radix: 8) }
        ) { c, v in
            guard let m = mode_t(v, radix: 8), m <= 0o777 else { return false }
            c.socketMode = m
            return true
        },
        Setting(
            key: "control_socket", allowed: "an absolute path",
            help: "the control socket (whenctl status, reload, metrics); default: control.sock beside the event socket",
            reload: .restart, value: { $0.controlSocketPath }
        ) { c, v in
            guard v.hasPrefix("/") else { return false }
            c.controlSocketOverride = v
            return true
        },
        Setting(
            key: "state_dir", allowed: "an absolute path", help: "the state directory; the journal is journal/ inside",
            reload: .restart, value: { $0.stateDirectory }
        ) { c, v in
            guard v.hasPrefix("/") else { return false }
            c.setStateDirectory(v)
            return true
        },
        Setting(
            key: "durability", allowed: "fsync, write or none", help: "what an ack means", reload: .live,
            value: { $0.journal.durability.rawValue }
        ) { c, v in
            guard let d = Durability(rawValue: v) else { return false }
            c.journal.durability = d
            return true
        },
        Setting(
            key: "max_event_bytes", allowed: "an integer from 64 to 16777216",
            help: "the longest event line (new connections take up a change)", reload: .live,
            value: { String($0.maxEventBytes) }, apply: int(64...(16 << 20)) { $0.maxEventBytes = $1 }),
        Setting(
            key: "segment_max_bytes", allowed: "an integer of at least 4096", help: "rotate segments at this size",
            reload: .live, value: { String($0.journal.segmentMaxBytes) },
            apply: int(4096...Int.max) { $0.journal.segmentMaxBytes = Int64($1) }),
        Setting(
            key: "segment_max_age", allowed: "seconds, 0 or more", help: "rotate segments at this age",
            reload: .live, value: { number($0.journal.segmentMaxAge) },
            apply: seconds { $0.journal.segmentMaxAge = $1 }),
        Setting(
            key: "retention_max_bytes", allowed: "an integer, 0 for no limit", help: "keep the journal under this size",
            reload: .live, value: { String($0.journal.retentionMaxBytes) },
            apply: int(0...Int.max) { $0.journal.retentionMaxBytes = Int64($1) }),
        Setting(
            key: "retention_max_age", allowed: "seconds, 0 for no limit",
            help: "delete sealed segments older than this", reload: .live,
            value: { number($0.journal.retentionMaxAge) },
            apply: seconds { $0.journal.retentionMaxAge = $1 }),
        Setting(
            key: "retention_hard_max_bytes", allowed: "an integer, 0 for no limit",
            help: "past this size old segments go even if a pipeline has not read them (and it is told)",
            reload: .live, value: { String($0.journal.retentionHardMaxBytes) },
            apply: int(0...Int.max) { $0.journal.retentionHardMaxBytes = Int64($1) }),
        Setting(
            key: "retention_min_free_bytes", allowed: "an integer, 0 for no floor",
            help: "below this much free space old segments go even if a pipeline has not read them",
            reload: .live, value: { String($0.journal.retentionMinFreeBytes) },
            apply: int(0...Int.max) { $0.journal.retentionMinFreeBytes = Int64($1) }),
        Setting(
            key: "dedup_window", allowed: "an integer, 0 to turn it off", help: "records resends are checked against",
            reload: .restart, value: { String($0.journal.dedupWindow) },
            apply: int(0...100_000_000) { $0.journal.dedupWindow = $1 }),
        Setting(
            key: "rate_limit", allowed: "events per second, 0 for no limit", help: "per sender (see rate_limit_by)",
            reload: .live, value: { number($0.rateLimit) }, apply: seconds { $0.rateLimit = $1 }),
        Setting(
            key: "rate_burst", allowed: "a number of events, 1 or more",
            help: "events a sender may send at once above the rate", reload: .live,
            value: { number($0.rateBurst) }, apply: seconds(atLeast: 1) { $0.rateBurst = $1 }),
        Setting(
            key: "rate_limit_by", allowed: "pid, uid or connection", help: "who a rate limit counts against",
            reload: .live, value: { $0.rateLimitBy.rawValue }
        ) { c, v in
            guard let by = RateLimitKey(rawValue: v) else { return false }
            c.rateLimitBy = by
            return true
        },
        Setting(
            key: "rate_limit_report_interval", allowed: "seconds, at least 0.1",
            help: "how often suppressed events are summed up in the log", reload: .live,
            value: { number($0.rateLimitReportInterval) },
            apply: seconds(atLeast: 0.1) { $0.rateLimitReportInterval = $1 }),
        Setting(
            key: "max_pending_bytes", allowed: "an integer of at least 4096",
            help: "bytes all connections may have waiting for the journal", reload: .live,
            value: { String($0.maxPendingBytes) }, apply: int(4096...Int.max) { $0.maxPendingBytes = $1 }),
        Setting(
            key: "max_connections", allowed: "an integer from 1 to 1000000",
            help: "event connections open at once; one more gets an unavailable error and is closed", reload: .live,
            value: { String($0.maxConnections) }, apply: int(1...1_000_000) { $0.maxConnections = $1 }),
        Setting(
            key: "max_subscribers", allowed: "an integer from 0 to 100000",
            help: "subscriptions open at once; one more gets an unavailable error and is closed", reload: .live,
            value: { String($0.maxSubscribers) }, apply: int(0...100_000) { $0.maxSubscribers = $1 }),
        Setting(
            key: "subscribe_group", allowed: "a group name, or empty for none",
            help: "a group whose members may subscribe to records, besides whend's user and root", reload: .live,
            value: { $0.subscribeGroup }
        ) { c, v in
            // A name as groupadd takes it; looked up when a subscriber connects (it may be
            // created after whend starts).
            guard v.utf8.count <= 32, v.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "_.-".contains($0)) })
            else { return false }
            c.subscribeGroup = v
            return true
        },
        Setting(
            key: "shutdown_timeout", allowed: "seconds, 0 or more", help: "how long a graceful stop waits",
            reload: .live, value: { number($0.shutdownTimeout) }, apply: seconds { $0.shutdownTimeout = $1 }),
        Setting(
            key: "plugin_dirs", allowed: "directories separated by ':'",
            help: "where plugins load from (owned by root or whend's user, not writable by others)", reload: .live,
            value: { $0.pluginDirectories.joined(separator: ":") }
        ) { c, v in
            c.pluginDirectories = v.split(separator: ":").map { String($0) }
            return c.pluginDirectories.allSatisfy { $0.hasPrefix("/") }
        },
        Setting(
            key: "ingest", allowed: "plugin names separated by ',', each once", help: "the ingest middleware, in order",
            reload: .live, value: { $0.ingestPlugins.joined(separator: ",") }
        ) { c, v in
            guard let plugins = pluginList(v) else { return false }
            c.ingestPlugins = plugins
            return true
        },
        Setting(
            key: "tracking_plan", allowed: "an absolute path, or empty for none",
            help: "the tracking plan events are checked against at ingest (read again at each reload)",
            reload: .live, value: { $0.trackingPlan }
        ) { c, v in
            guard v.isEmpty || v.hasPrefix("/") else { return false }
            c.trackingPlan = v
            return true
        },
        Setting(
            key: "tracking_plan_mode", allowed: "report or enforce",
            help: "an event that breaks the plan is stored and counted (report), or refused (enforce)", reload: .live,
            value: { $0.trackingPlanMode.rawValue }
        ) { c, v in
            guard let mode = TrackingPlanMode(rawValue: v) else { return false }
            c.trackingPlanMode = mode
            return true
        },
        Setting(
            key: "builtin_pipelines", allowed: "true or false",
            help: "run the built-in plugins in pipelines screens, analytics, crashes and sessions", reload: .live,
            value: { $0.builtinPipelines ? "true" : "false" }
        ) { c, v in
            guard v == "true" || v == "false" else { return false }
            c.builtinPipelines = v == "true"
            return true
        },
        Setting(
            key: "pipeline_retry_limit", allowed: "an integer, 0 to retry forever",
            help: "attempts at one record before a pipeline writes it to its dead letters", reload: .live,
            value: { String($0.pipelineRetryLimit) }, apply: int(0...Int(Int32.max)) { $0.pipelineRetryLimit = $1 }),
        Setting(
            key: "pipeline_watchdog", allowed: "seconds, at least 1",
            help: "how long a pipeline worker may be silent before it is restarted", reload: .live,
            value: { number($0.pipelineWatchdog) }, apply: seconds(atLeast: 1) { $0.pipelineWatchdog = $1 }),
        Setting(
            key: "pipeline_snapshot_interval", allowed: "seconds, 0 for never",
            help: "how often a pipeline whose plugins keep state saves it with its cursor", reload: .live,
            value: { number($0.pipelineSnapshotInterval) }, apply: seconds { $0.pipelineSnapshotInterval = $1 }),
        Setting(
            key: "pipeline_snapshot_rebuild", allowed: "an integer, 0 or more",
            help:
                "records before its cursor a pipeline rebuilds its plugins' state from when the saved one cannot be used",
            reload: .live, value: { String($0.pipelineSnapshotRebuild) },
            apply: int(0...Int.max) { $0.pipelineSnapshotRebuild = $1 }),
        Setting(
            key: "log_level", allowed: "trace, debug, info, notice, warning, error or critical", help: "log level",
            reload: .live, value: { $0.logLevel }
        ) { c, v in
            guard ["trace", "debug", "info", "notice", "warning", "error", "critical"].contains(v) else { return false }
            c.logLevel = v
            return true
        },
    ]

    /// `plugin.<name> = {json}`: a plugin's configuration, one key per plugin.
    package static func pluginSetting(_ name: String) -> Setting {
        Setting(
            key: "plugin.\(name)",
            allowed:
                "a JSON object nested at most \(Secrets.maximumDepth) deep, as plugins read it: its numbers within a double's range (not 1e999), its strings without a lone surrogate (\\ud800)",
            help: "the configuration of plugin \(name)",
            reload: .live, value: { $0.pluginConfigurations[name] ?? "" }
        ) { c, v in
            guard !v.isEmpty else {
                c.pluginConfigurations[name] = nil
                return true
            }
            // Before anything walks it: every walker of a configuration recurses once a level.
            // Then as the secrets' walker reads it (whend's one JSON scanner), and as Foundation:
            // Foundation alone lets a trailing comma through, and secrets written after one were
            // neither resolved nor hidden.
            var walker = JSONSpanWalker(Array(v.utf8))
            guard Secrets.nestingDepth(of: v) <= Secrets.maximumDepth, walker.walk({ _, _ in nil }),
                (try? JSONSerialization.jsonObject(with: Data(v.utf8))) is [String: Any]
            else { return false }
            c.pluginConfigurations[name] = v
            return true
        }
    }

    /// `pipeline.<name> = a, b`: a pipeline and its plugins, in order.
    package static func pipelineSetting(_ name: String) -> Setting {
        Setting(
            key: "pipeline.\(name)", allowed: "plugin names separated by ',', each once", help: "pipeline \(name)",
            reload: .live, value: { $0.pipelines[name]?.joined(separator: ",") ?? "" }
        ) { c, v in
            guard let plugins = pluginList(v) else { return false }
            guard
                name.utf8.allSatisfy({
                    $0 == 0x2D || $0 == 0x5F || (0x30...0x39).contains($0) || (0x61...0x7A).contains($0)
                })
            else { return false }
            c.pipelines[name] = plugins
            return true
        }
    }

    /// `isolation.<plugin> = process | shared`: whether a plugin's pipelines run in a process
    /// of their own, or in the shared pipeline host with the other trusted ones (a crash there
    /// restarts them all from their cursors).
    package static func isolationSetting(_ plugin: String) -> Setting {
        Setting(
            key: "isolation.\(plugin)", allowed: "process or shared",
            help: "where plugin \(plugin)'s pipelines run (default: shared for a built-in plugin, else process)",
            reload: .live, value: { $0.pluginIsolation[plugin] ?? "" }
        ) { c, v in
            guard v.isEmpty || v == "process" || v == "shared" else { return false }
            c.pluginIsolation[plugin] = v.isEmpty ? nil : v
            return true
        }
    }

    /// Plugin names in order; nil if one is named twice (a chain holds one instance of a
    /// plugin: named twice, its `next` would call into itself while it handles the record).
    package static func pluginList(_ value: String) -> [String]? {
        let plugins = value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        return Set(plugins).count == plugins.count ? plugins : nil
    }

    package static func setting(_ key: String) -> Setting? {
        if key.hasPrefix("plugin."), key.count > 7 { return pluginSetting(String(key.dropFirst(7))) }
        if key.hasPrefix("pipeline."), key.count > 9 { return pipelineSetting(String(key.dropFirst(9))) }
        if key.hasPrefix("isolation."), key.count > 10 { return isolationSetting(String(key.dropFirst(10))) }
        return all.first { $0.key == key }
    }

    /// The fixed settings and one for each plugin configured in either configuration.
    package static func settings(of configurations: DaemonConfiguration...) -> [Setting] {
        let plugins = Set(configurations.flatMap { $0.pluginConfigurations.keys }).sorted()
        let pipelines = Set(configurations.flatMap { $0.pipelines.keys }).sorted()
        let isolated = Set(configurations.flatMap { $0.pluginIsolation.keys }).sorted()
        return all + plugins.map(pluginSetting) + pipelines.map(pipelineSetting) + isolated.map(isolationSetting)
    }

    /// The settings whose values differ between two configurations.
    package static func differences(from old: DaemonConfiguration, to new: DaemonConfiguration) -> [(
        setting: Setting, old: String, new: String
    )] {
        settings(of: old, new).compactMap { s in
            let (a, b) = (s.value(old), s.value(new))
            return a == b ? nil : (s, a, b)
        }
    }

    /// `key: old → new` for a difference, secrets as `***`.
    package static func describe(
        _ difference: (setting: Setting, old: String, new: String), from old: DaemonConfiguration,
        to new: DaemonConfiguration
    ) -> String {
        let known = old.secretValues.union(new.secretValues)
        let key = difference.setting.key
        return
            "\(key): \(Secrets.shown(key: key, value: difference.old, hiding: known)) → \(Secrets.shown(key: key, value: difference.new, hiding: known))"
    }

    /// The whole configuration as a file would spell it, one `key = value` a line, secrets as
    /// `***`.
    package static func render(_ configuration: DaemonConfiguration) -> String {
        settings(of: configuration).map { setting in
            let value = Secrets.shown(
                key: setting.key, value: setting.value(configuration), hiding: configuration.secretValues)
            // Quoted when a bare value would not read back: a `#`, a quote, a backslash, blanks
            // at either end, or a control character (a CR before the line's end is read as the
            // CRLF that ends it).
            let plain =
                !value.unicodeScalars.contains {
                    $0 == "#" || $0 == "\"" || $0 == "\\" || $0.properties.generalCategory == .control
                }
                && value == value.trimmingCharacters(in: .whitespaces)
            let spelled =
                plain
                ? value
                : quoted(value)
            return "\(setting.key) = \(spelled)"
        }.joined(separator: "\n")
    }

    /// `"value"` with `\"` and `\\` as its escapes, by scalars: a quote followed by a combining
    /// mark is one Character, which a replacement by Characters would leave unescaped.
    private static func quoted(_ value: String) -> String {
        var out = String.UnicodeScalarView()
        out.append("\"")
        for scalar in value.unicodeScalars {
            if scalar == "\"" || scalar == "\\" { out.append("\\") }
            out.append(scalar)
        }
        out.append("\"")
        return String(out)
    }

    /// Applies `values` in order; the first that is unknown or invalid is an error.
    package static func apply(_ values: [SettingValue], to configuration: inout DaemonConfiguration)
        throws(SettingError)
    {
        for v in values {
            guard let setting = setting(v.key) else {
                throw .unknownKey(source: v.source, key: v.key)
            }
            guard setting.apply(&configuration, v.value) else {
                throw .notAllowed(source: v.source, key: v.key, value: v.value, allowed: setting.allowed)
            }
        }
    }

}
