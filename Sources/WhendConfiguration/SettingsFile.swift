import Foundation
import WhendJournal
import WhendWire

extension Settings {
    /// Reads a configuration file: one `key = value` a line; `#` starts a comment; a value may
    /// be "quoted" (then `\"` and `\\` are its escapes), and a JSON value (`{…}` or `[…]`) runs
    /// to its closing bracket, `#` in its strings included.
    package static func parse(_ text: String, path: String) throws(SettingError) -> [SettingValue] {
        var values: [SettingValue] = []
        var seen: [String: Int] = [:]
        // A line ends at LF (a CR before it is part of the line end), as for every other tool
        // that reads the file: Swift's other line breaks (a lone CR, VT, FF, NEL, U+2028,
        // U+2029) inside a comment would otherwise begin a setting that grep shows nowhere.
        let lines = text.unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false).map { scalars in
            var line = String.UnicodeScalarView(scalars)
            if line.last == "\r" { line.removeLast() }
            return String(line)
        }
        for (number, raw) in lines.enumerated() {
            let source = "\(path):\(number + 1)"
            let trimmed = raw.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            guard let eq = trimmed.firstIndex(of: "=") else {
                throw .notKeyValue(source: source, line: trimmed)
            }
            let key = trimmed[..<eq].trimmingCharacters(in: .whitespaces)
            var value = trimmed[trimmed.index(after: eq)...].trimmingCharacters(in: .whitespaces)
            if value.unicodeScalars.first == "\"" {
                // Up to the closing quote, with \" and \\ as escapes; then only a comment. By
                // scalars, not Characters: a quote followed by a combining mark is one Character,
                // and would be taken for no quote at all.
                let scalars = value.unicodeScalars
                var unquoted = String.UnicodeScalarView()
                var escaped = false
                var closing: String.UnicodeScalarView.Index?
                var i = scalars.index(after: scalars.startIndex)
                while i < scalars.endIndex {
                    let ch = scalars[i]
                    if escaped {
                        unquoted.append(ch)
                        escaped = false
                    } else if ch == "\\" {
                        escaped = true
                    } else if ch == "\"" {
                        closing = i
                        break
                    } else {
                        unquoted.append(ch)
                    }
                    i = scalars.index(after: i)
                }
                guard let closing else {
                    throw .unclosedQuote(source: source, key: key)
                }
                let rest = String(scalars[scalars.index(after: closing)...]).trimmingCharacters(in: .whitespaces)
                guard rest.isEmpty || rest.hasPrefix("#") else {
                    throw .textAfterValue(source: source, key: key, text: rest, valueKind: "quoted")
                }
                value = String(unquoted)
            } else if key.hasPrefix("plugin.") {
                // A plugin's configuration is JSON, and runs to its closing bracket: a `#` inside
                // its strings is part of it; after it, only a comment.
                guard value.hasPrefix("{") || value.hasPrefix("[") else {
                    throw .notJSON(source: source, key: key, reason: "it does not start with { or [")
                }
                let end: String.Index
                switch jsonValueEnd(value) {
                case .success(let index): end = index
                case .failure(let error):
                    // Where and what, never the text: it may hold a secret.
                    let reason = error.message.replacingOccurrences(of: "the line is not valid JSON: ", with: "")
                        .replacingOccurrences(of: "the line ends", with: "the value ends")
                        .replacingOccurrences(of: " at byte ", with: " at its byte ")
                    throw .notJSON(source: source, key: key, reason: reason)
                }
                let rest = value[end...].trimmingCharacters(in: .whitespaces)
                guard rest.isEmpty || rest.hasPrefix("#") else {
                    throw .textAfterValue(source: source, key: key, text: rest, valueKind: "JSON")
                }
                value = String(value[..<end])
            } else if let hash = value.firstIndex(of: "#") {
                value = value[..<hash].trimmingCharacters(in: .whitespaces)
            }
            if let first = seen[key] {
                throw .setTwice(source: source, key: key, firstLine: first)
            }
            seen[key] = number + 1
            values.append(SettingValue(key: key, value: value, source: source))
        }
        return values
    }

    /// Where the JSON value at the start of `text` ends (just past its closing bracket), read
    /// by the scanner that reads the wire's lines; or why it is not one whole, valid JSON value.
    package static func jsonValueEnd(_ text: String) -> Result<String.Index, WireError> {
        let bytes = Array(text.utf8)
        let scanned: Result<Int, WireError> = bytes.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer)
            return Result { () throws(WireError) in try scanner.scanValue().range.upperBound }
        }
        return scanned.map { text.utf8.index(text.utf8.startIndex, offsetBy: $0) }
    }

    /// `WHEND_<KEY>` variables for every key (`WHEND_SOCKET` is also the protocol's own).
    package static func fromEnvironment(_ environment: [String: String] = ProcessInfo.processInfo.environment)
        -> [SettingValue]
    {
        all.compactMap { setting in
            let name = "WHEND_" + setting.key.uppercased()
            return environment[name].map { SettingValue(key: setting.key, value: $0, source: "environment \(name)") }
        }
    }
}
