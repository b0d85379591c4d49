// swift-tools-version:6.0
import Foundation
import PackageDescription

// libFuzzer targets for whend's input formats. A package of its own, built with
// `swift build --sanitize=fuzzer`; `make fuzz` runs each target for a bounded time.
// Each target holds only `LLVMFuzzerTestOneInput`: libFuzzer provides `main`.
let fuzzTarget: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]
// A path dependency is named after its folder, whatever the clone is called.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

// One target a fuzzed format (Sources/<name>), each of them over WhendFuzzing's properties.
let formats: [Target] = ["FuzzEventLine", "FuzzSegment", "FuzzPluginOutput", "FuzzConfiguration"].map { name in
    .executableTarget(
        name: name, dependencies: [.product(name: "WhendFuzzing", package: root)], swiftSettings: fuzzTarget)
}

// `make fuzz-differential` puts an earlier version's WhendWire in .reference/ (not in git) and
// sets WHEND_FUZZ_REFERENCE; then the differential target runs it side by side with today's.
let differential: [Target] =
    ProcessInfo.processInfo.environment["WHEND_FUZZ_REFERENCE"] != nil
    ? [
        .target(name: "WhendWireReference", path: ".reference/WhendWireReference"),
        .executableTarget(
            name: "FuzzEventLineDifferential",
            dependencies: [.product(name: "WhendFuzzing", package: root), "WhendWireReference"],
            path: "Differential/FuzzEventLineDifferential",
            swiftSettings: fuzzTarget
        ),
    ] : []

let package = Package(
    name: "whend-fuzz",
    dependencies: [.package(path: "..")],
    targets: formats + differential,
    swiftLanguageModes: [.v6]
)
