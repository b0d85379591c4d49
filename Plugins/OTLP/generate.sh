#!/usr/bin/env bash
# Regenerates Generated/*.pb.swift, the OTLP messages otlp sends, from OpenTelemetry's own
# definitions: opentelemetry-proto at the tag below, Debian's protoc (protobuf-compiler), and
# protoc-gen-swift from the swift-protobuf version Package.resolved names.
# Usage: Plugins/OTLP/generate.sh OPENTELEMETRY_PROTO_CHECKOUT
set -euo pipefail
tag=v1.9.0
checkout=$(readlink -f "${1:?usage: $0 OPENTELEMETRY_PROTO_CHECKOUT (a clone of github.com/open-telemetry/opentelemetry-proto)}")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(sed -n '/"identity" : "swift-protobuf"/,/version/ s/.*"version" : "\(.*\)".*/\1/p' "$root/Package.resolved")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler" >&2; exit 1; }

echo "building protoc-gen-swift $version…"
mkdir -p "$work/gen"
cat > "$work/gen/Package.swift" <<SWIFT
// swift-tools-version:6.0
import PackageDescription
let package = Package(
    name: "gen", dependencies: [.package(url: "https://github.com/apple/swift-protobuf.git", exact: "$version")],
    targets: [])
SWIFT
swift build --package-path "$work/gen" --product protoc-gen-swift >/dev/null
plugin=$(swift build --package-path "$work/gen" --show-bin-path)/protoc-gen-swift

echo "generating from opentelemetry-proto $tag…"
git -C "$checkout" archive "$tag" opentelemetry/proto/common opentelemetry/proto/resource \
    opentelemetry/proto/logs opentelemetry/proto/collector/logs | tar -x -C "$work"
mkdir -p "$work/out"
(cd "$work" && protoc --plugin=protoc-gen-swift="$plugin" --swift_opt=Visibility=Internal \
    --swift_opt=FileNaming=DropPath --swift_out=out $(find opentelemetry -name '*.proto' | sort))
rm -f "$here"/Generated/*.pb.swift
cp "$work"/out/*.pb.swift "$here/Generated/"
ls "$here/Generated"
