import WhendDaemon

/// Any bytes as a configuration file: the parser and the settings table either accept them or
/// say why (naming a line), never crash; and an accepted configuration, written back out as a
/// file, reads back to the same configuration.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfiguration(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    var configuration = DaemonConfiguration(environment: [:])
    do {
        try Settings.apply(try Settings.parse(text, path: "fuzz.conf"), to: &configuration)
    } catch {
        precondition(error.description.hasPrefix("fuzz.conf:"), "an error that names no line: \(error)")
        return 0
    }
    let rendered = Settings.render(configuration)
    var again = DaemonConfiguration(environment: [:])
    do {
        try Settings.apply(try Settings.parse(rendered, path: "rendered.conf"), to: &again)
    } catch {
        preconditionFailure("a configuration written out does not read back: \(error)\n\(rendered)")
    }
    precondition(
        Settings.render(again) == rendered, "a configuration written out reads back different:\n\(rendered)")
    return 0
}
