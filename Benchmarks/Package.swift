// swift-tools-version:6.0
import Foundation
import PackageDescription

// The benchmarks: whend's ingest side by side with rsyslog on one corpus (`make bench`), and
// the cost of WhenClient.emit to the app (`make bench-client`), each against a peer in the same
// run. A package of its own so that it never slows the main build.
// A path dependency is named after its folder, whatever the clone is called.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "whend-benchmarks",
    dependencies: [.package(path: "..")],
    targets: [
        .target(name: "BenchSupport", dependencies: [.product(name: "WhendSystem", package: root)]),
        .executableTarget(
            name: "whend-bench",
            dependencies: [
                "BenchSupport", .product(name: "WhendWire", package: root),
                .product(name: "SeededRandom", package: root),
            ],
            swiftSettings: [.unsafeFlags(["-Ounchecked"])]
        ),
        // What WhenClient.emit costs the app's thread, with the daemon up, down and stopped.
        .executableTarget(
            name: "whenclient-bench",
            dependencies: ["BenchSupport", .product(name: "WhenClient", package: root)]
        ),
    ],
    swiftLanguageModes: [.v6]
)
