// swift-tools-version:6.0
import PackageDescription

// The ingest benchmark: whend side by side with rsyslog on one corpus, in one run.
// A package of its own so that it never slows the main build; `make bench` runs it.
let package = Package(
    name: "whend-benchmarks",
    dependencies: [.package(path: "..")],
    targets: [
        .executableTarget(
            name: "whend-bench",
            dependencies: [.product(name: "WhendWire", package: "main")],
            swiftSettings: [.unsafeFlags(["-Ounchecked"])]
        )
    ],
    swiftLanguageModes: [.v6]
)
