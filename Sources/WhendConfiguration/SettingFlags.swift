/// Why a list of setting flags is refused.
package struct SettingFlagError: Error, CustomStringConvertible, Equatable {
    package let description: String
}

extension SettingValue {
    /// Every setting of `Settings.all` as a flag, `--socket-mode 0660` or `--socket-mode=0660`,
    /// read in order: the flags whend takes, and those a daemon embedded in another program
    /// (the tests) is given.
    package static func flags(_ arguments: [String]) throws(SettingFlagError) -> [SettingValue] {
        var values: [SettingValue] = []
        var arguments = arguments.makeIterator()
        while let argument = arguments.next() {
            guard argument.hasPrefix("--"), argument.count > 2 else {
                throw SettingFlagError(
                    description: "unexpected argument '\(argument)'; `whend --help` lists the settings")
            }
            var name = String(argument.dropFirst(2))
            var value: String?
            if let equals = name.firstIndex(of: "=") {
                value = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            let key = name.replacingOccurrences(of: "-", with: "_")
            guard let setting = Settings.all.first(where: { $0.key == key }) else {
                throw SettingFlagError(description: "unknown option '--\(name)'; `whend --help` lists the settings")
            }
            guard let given = value ?? arguments.next() else {
                throw SettingFlagError(description: "--\(name) needs a value: \(setting.allowed)")
            }
            values.append(SettingValue(key: key, value: given, source: "--" + name))
        }
        return values
    }
}
