// swift-tools-version:6.1
import PackageDescription

// The dependencies' products that more than one target uses.
let logging: Target.Dependency = .product(name: "Logging", package: "swift-log")
let nioCore: Target.Dependency = .product(name: "NIOCore", package: "swift-nio")
let nioConcurrencyHelpers: Target.Dependency = .product(name: "NIOConcurrencyHelpers", package: "swift-nio")
let argumentParser: Target.Dependency = .product(name: "ArgumentParser", package: "swift-argument-parser")
// Tests only: properties over generated, seeded inputs, with shrinking.
let deque: Target.Dependency = .product(name: "DequeModule", package: "swift-collections")
let propertyBased: Target.Dependency = .product(name: "PropertyBased", package: "swift-property-based")

let package = Package(
    name: "whend",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "whend", targets: ["whend"]),
        .executable(name: "whenctl", targets: ["whenctl"]),
        // App sessions simulated through WhenClient, for the tour and the benchmarks.
        .executable(name: "whend-demo", targets: ["whend-demo"]),
        .library(name: "WhendWire", targets: ["WhendWire"]),
        // For apps: emit to whend without ever blocking.
        .library(name: "WhenClient", targets: ["WhenClient"]),
        // For app tests: the GIVEN/WHEN/THEN runner, from Swift Testing or XCTest.
        .library(name: "WhenTesting", targets: ["WhenTesting"]),
        // For plugin authors: the Swift SDK over the C ABI (Sources/CWhendPlugin/include).
        .library(name: "WhendPluginSDK", targets: ["WhendPluginSDK"]),
        // The properties Fuzz/'s libFuzzer targets check, for that package alone.
        .library(name: "WhendFuzzing", targets: ["WhendFuzzing"]),
        // The seeded generator the demo, the benchmarks and the tests draw from.
        .library(name: "SeededRandom", targets: ["SeededRandom"]),
        // posix_spawn with its C strings and file actions (`spawnProcess`), for the benchmarks' daemons.
        .library(name: "WhendSystem", targets: ["WhendSystem"]),
        // Plugins, as shared libraries loaded with dlopen.
        .library(name: "redact", type: .dynamic, targets: ["RedactPlugin"]),
        .library(name: "screen-tracking", type: .dynamic, targets: ["ScreenTrackingPlugin"]),
        .library(name: "crash-reports", type: .dynamic, targets: ["CrashReportsPlugin"]),
        .library(name: "analytics", type: .dynamic, targets: ["AnalyticsPlugin"]),
        .library(name: "nats", type: .dynamic, targets: ["NatsPlugin"]),
        .library(name: "session-recorder", type: .dynamic, targets: ["SessionRecorderPlugin"]),
        .library(name: "otlp", type: .dynamic, targets: ["OTLPPlugin"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-protobuf.git", from: "1.39.0"),
        // Experimental names (session.id, app.screen.name, user.id) need the minor version pinned.
        .package(
            url: "https://github.com/swift-otel/swift-otel-semantic-conventions.git",
            .upToNextMinor(from: "1.44.0"), traits: ["Experimental"]),
        // whenctl ui's web server (loopback only): HTTP/1.1, routing, streamed bodies for SSE.
        .package(url: "https://github.com/hummingbird-project/hummingbird", exact: "2.28.1", traits: []),
        // Its header types, named by whenctl ui's security headers.
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // Tests only: properties over generated, seeded inputs, with shrinking.
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
    ],
    targets: [
        // C libraries from Debian, through system-library targets.
        .systemLibrary(name: "CZstd", pkgConfig: "libzstd", providers: [.apt(["libzstd-dev"])]),
        // zlib, for analytics' gzip bodies.
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        .systemLibrary(name: "CNats", pkgConfig: "libnats", providers: [.apt(["libnats-dev"])]),

        // The client library apps emit with, in the seeds' idioms. No NIO.
        .target(name: "WhenClient", dependencies: ["WhendWire"]),
        .target(name: "WhenTesting", dependencies: ["WhenClient"]),
        .executableTarget(
            name: "whend-demo", dependencies: ["WhenClient", "WhendWire", "WhendSystem", "SeededRandom"]),
        // SplitMix64: one seed, one sequence, for whatever must be generated the same way again.
        .target(name: "SeededRandom"),
        // The plugin ABI: a C header, checked by the host before it calls anything.
        .target(name: "CWhendPlugin"),
        // Linux calls and types Swift's Glibc module does not import (they need _GNU_SOURCE).
        .target(name: "CLinux"),
        // A cache prefetch for the journal's resend table, inlined into Swift (static inline C).
        .target(name: "CScan"),
        .target(
            name: "WhendFuzzing", dependencies: ["WhendWire", "WhendRecord", "WhendJournal", "WhendConfiguration"]),
        // The ABI version as exported data, linked into every plugin built with the SDK.
        .target(name: "CWhendPluginABI", dependencies: ["CWhendPlugin"]),
        .target(name: "WhendPluginSDK", dependencies: ["CWhendPlugin", "CWhendPluginABI", "WhendWire"]),
        .target(name: "RedactPlugin", dependencies: ["WhendPluginSDK"], path: "Plugins/Redact"),
        // What the built-in plugins share (linked into each library).
        .target(name: "BuiltinPluginSupport", dependencies: ["WhendWire", "WhendSystem"], path: "Plugins/Support"),
        .target(
            name: "ScreenTrackingPlugin", dependencies: ["WhendPluginSDK", "BuiltinPluginSupport", "WhendWire"],
            path: "Plugins/ScreenTracking"),
        .target(
            name: "NatsPlugin", dependencies: ["WhendPluginSDK", "BuiltinPluginSupport", "CNats", "WhendWire"],
            path: "Plugins/Nats"),
        // One HTTP exchange with libcurl (Debian's libcurl4-openssl-dev), on the calling thread.
        .target(name: "CHTTP", linkerSettings: [.linkedLibrary("curl")]),
        .target(name: "PluginHTTP", dependencies: ["WhendPluginSDK", "CZlib", "CHTTP"], path: "Plugins/HTTP"),
        .target(
            name: "AnalyticsPlugin",
            dependencies: [
                "WhendPluginSDK", "BuiltinPluginSupport", "WhendWire", "WhendRecord", "WhendSystem", "PluginHTTP",
                deque,
            ],
            path: "Plugins/Analytics"
        ),
        .target(
            name: "OTLPPlugin",
            dependencies: [
                "WhendPluginSDK", "WhendWire", "PluginHTTP",
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "OTelSemanticConventions", package: "swift-otel-semantic-conventions"),
            ],
            path: "Plugins/OTLP", exclude: ["generate.sh"]
        ),
        .target(
            name: "CrashReportsPlugin", dependencies: ["WhendPluginSDK", "BuiltinPluginSupport", "WhendSystem"],
            path: "Plugins/CrashReports"),
        .target(
            name: "SessionRecorderPlugin", dependencies: ["WhendPluginSDK", "BuiltinPluginSupport"],
            path: "Plugins/SessionRecorder"),

        // The control socket's protocol, typed: whend answers it, whenctl asks it.
        .target(name: "WhendControl"),
        // The wire format (PROTOCOL.md): framing, the validating scanner, normalisation, and the
        // JSON reading and writing plugin authors use too. No NIO.
        .target(name: "WhendWire"),
        // The stored-record format (PROTOCOL.md §7): a scanned event encoded as the journal
        // stores it, its resend key, and a stored record read back.
        .target(name: "WhendRecord", dependencies: ["WhendWire"]),
        // What whend asks of the operating system beyond Foundation: durable files, signals, its
        // own executable.
        .target(name: "WhendSystem"),
        // Tracking plans: the plan file, its schemas compiled once, and the check of an event
        // against them (whend at ingest, whenctl plan over the journal).
        .target(name: "WhendTrackingPlan", dependencies: ["WhendWire", "WhendSystem"]),
        // The append-only zstd journal: writer, recovery, reader, index, verify. No NIO.
        .target(name: "WhendJournal", dependencies: ["WhendWire", "WhendRecord", "WhendSystem", "CZstd", "CScan"]),
        // whend's settings: one table for the file, the environment and the flags, and how a
        // configuration is resolved (whend and whenctl replay share it).
        .target(name: "WhendConfiguration", dependencies: ["WhendWire", "WhendJournal", "WhendSystem"]),
        // Plugins as whend hosts them: loading (dlopen, the ABI check), host services, chains,
        // and a pipeline run offline (whenctl replay).
        .target(
            name: "WhendPluginHost",
            dependencies: [
                "CWhendPlugin", "WhendWire", "WhendRecord", "WhendSystem", "WhendConfiguration", logging,
                nioConcurrencyHelpers,
            ]),
        // Pipelines: the spec, the worker and the shared pipeline host, their supervisor in the
        // daemon, the frames between them, the exactly-once ledger, snapshots and the plugin check.
        .target(
            name: "WhendPipelines",
            dependencies: [
                "WhendWire", "WhendSystem", "WhendJournal", "WhendConfiguration", "WhendPluginHost", "CWhendPlugin",
                "CLinux", logging, nioConcurrencyHelpers, deque,
            ]),
        // The daemon: NIO event and control sockets, connections, acks, wiring to the journal,
        // reload, metrics.
        .target(
            name: "WhendDaemon",
            dependencies: [
                "WhendWire", "WhendRecord", "WhendSystem", "WhendJournal", "WhendConfiguration", "WhendControl",
                "WhendPluginHost", "WhendPipelines", "WhendTrackingPlan", "CSystemd",
                "CWhendPlugin", "CLinux",
                nioCore,
                .product(name: "NIOPosix", package: "swift-nio"),
                logging,
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ]
        ),
        .executableTarget(
            name: "whend",
            dependencies: [
                "WhendDaemon", "WhendPipelines", "WhendConfiguration", "WhendSystem", argumentParser, logging,
            ]
        ),
        .executableTarget(
            name: "whenctl",
            dependencies: [
                "WhendWire", "WhendRecord", "WhendSystem", "WhendJournal", "WhendConfiguration", "WhendControl",
                "WhendPluginHost", "WhendTrackingPlan", "BuiltinPluginSupport", argumentParser, nioCore,
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"), logging,
            ],
            // The debugger page's HTML, script and style (`whenctl ui`), compiled into the binary.
            resources: [.embedInCode("UI/Assets")]
        ),

        .testTarget(name: "WhendWireTests", dependencies: ["WhendWire", "WhendRecord", "SeededRandom", propertyBased]),
        // Where the tests keep their files (one directory a run; earlier runs' are removed).
        .target(name: "TestScratch", path: "Tests/Scratch"),
        .testTarget(
            name: "WhendJournalTests",
            dependencies: ["WhendJournal", "WhendWire", "WhendRecord", "TestScratch", "SeededRandom"]),
        .testTarget(name: "WhendPluginSDKTests", dependencies: ["WhendPluginSDK"]),
        .testTarget(name: "WhendControlTests", dependencies: ["WhendControl", propertyBased]),
        .testTarget(
            name: "WhendTrackingPlanTests",
            dependencies: ["WhendTrackingPlan", "WhendWire", "SeededRandom", "TestScratch"]),
        // End to end: whend on real sockets, in the test's own process (`TestDaemon`) or as a
        // real process where a promise needs one (kills, signals, systemd), with whenctl and the
        // demo as real processes. Depends on the executables so that `swift test` builds them
        // beside the test bundle.
        .testTarget(
            name: "WhendTests",
            dependencies: [
                "WhendWire", "WhendRecord", "WhendSystem", "WhendJournal", "WhendConfiguration", "WhendPluginHost",
                "WhendPipelines", "WhendDaemon", "WhendTrackingPlan", "WhenClient", "BuiltinPluginSupport",
                "WhenTesting", "whend", "whenctl",
                "whend-demo", "SeededRandom", "TestScratch",
                // The connection handler alone, on NIO's test channel (ConnectionHandlerTests).
                nioCore,
                .product(name: "NIOEmbedded", package: "swift-nio"),
                logging,
                propertyBased,
            ]),
    ],
    swiftLanguageModes: [.v6]
)
