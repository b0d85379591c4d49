#!/usr/bin/env bash
# Builds whend_<version>_<arch>.deb from a release build: the binaries, the built-in plugins,
# the Swift runtime they share (in /usr/lib/whend/swift, so the package needs no Swift
# toolchain, and Swift plugins load into the same runtime as whend), the systemd units, the
# default configuration, the docs, man pages and shell completions. Usage: packaging/build-deb.sh [output directory]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.build-deb}
version=$(sed -n 's/.*current = "\(.*\)".*/\1/p' Sources/WhendWire/Version.swift)
arch=$(dpkg --print-architecture)
scratch=.build-deb-release
runtime=/usr/lib/whend/swift
plugins="screen-tracking analytics crash-reports session-recorder redact nats otlp"
# The binaries look for the Swift runtime beside them and in $runtime only, never in the
# toolchain that built them.
flags=(-c release --scratch-path "$scratch" -Xswiftc -no-toolchain-stdlib-rpath -Xlinker -rpath="$runtime")

echo "building whend $version (release)…"
for product in whend whenctl generate-manual $plugins; do
    swift build "${flags[@]}" --product "$product"
done
bin=$(swift build "${flags[@]}" --show-bin-path)
# Run here, the release binaries find the Swift runtime in the toolchain.
swiftlib=$(readlink -f "$(dirname "$(readlink -f "$(command -v swift)")")/../lib/swift/linux")

root="$out/whend_${version}_${arch}"
rm -rf "$root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/whend" \
    "$root/usr/share/doc/whend" "$root/usr/lib/whend/plugins"
install -d "$root$runtime"
install -m 0755 "$bin/whend" "$bin/whenctl" "$root/usr/bin/"
for plugin in $plugins; do install -m 0644 "$bin/lib$plugin.so" "$root/usr/lib/whend/plugins/"; done
# The Swift runtime libraries the binaries and plugins need, from the toolchain.
needed=$( (for f in "$root/usr/bin/"* "$root/usr/lib/whend/plugins/"*.so; do
    LD_LIBRARY_PATH="$swiftlib" ldd "$f"; done) | awk -v dir="$swiftlib" '$3 ~ "^"dir {print $3}' | sort -u)
for lib in $needed; do install -m 0644 "$lib" "$root$runtime/"; done
strip --strip-unneeded "$root/usr/bin/"* "$root/usr/lib/whend/plugins/"*.so "$root$runtime/"*.so
install -m 0644 packaging/whend.service packaging/whend.socket packaging/whend-control.socket \
    "$root/lib/systemd/system/"
# Not world-readable: it may hold secrets. postinst gives it to group whend-config (the unit's
# SupplementaryGroups=), through dpkg-statoverride so that an administrator's choice stays.
install -m 0640 packaging/whend.conf "$root/etc/whend/whend.conf"
install -m 0644 README.md SECURITY.md ARCHITECTURE.md BENCHMARKS.md "$root/usr/share/doc/whend/"
install -d "$root/usr/share/doc/whend/docs"
install -m 0644 docs/*.md "$root/usr/share/doc/whend/docs/"
# Man pages and shell completions, generated from the argument parsers so they cannot drift:
# whend(8), whenctl(1); bash, zsh and fish completions where each shell looks for them.
echo "generating man pages and completions…"
manual_date=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}" +%F)
install -d "$root/usr/share/man/man1" "$root/usr/share/man/man8" "$root/usr/share/bash-completion/completions" \
    "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"
manuals=$(mktemp -d)
trap 'rm -rf "$manuals"' EXIT
for page in whenctl:1 whend:8; do
    tool=${page%%:*} section=${page##*:}
    LD_LIBRARY_PATH="$swiftlib" "$bin/generate-manual" "$bin/$tool" --section "$section" --date "$manual_date" \
        --authors "whend developers<whend@localhost>" -o "$manuals" >/dev/null
    gzip -9n < "$manuals/$tool.$section" > "$root/usr/share/man/man$section/$tool.$section.gz"
    LD_LIBRARY_PATH="$swiftlib" "$bin/$tool" --generate-completion-script bash \
        > "$root/usr/share/bash-completion/completions/$tool"
    LD_LIBRARY_PATH="$swiftlib" "$bin/$tool" --generate-completion-script zsh \
        > "$root/usr/share/zsh/vendor-completions/_$tool"
    LD_LIBRARY_PATH="$swiftlib" "$bin/$tool" --generate-completion-script fish \
        > "$root/usr/share/fish/vendor_completions.d/$tool.fish"
done
{ printf 'whend, under the Apache License, Version 2.0:\n\n'; cat LICENSE; } > "$root/usr/share/doc/whend/copyright"

size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: whend
Version: $version
Architecture: $arch
Maintainer: whend developers <whend@localhost>
Depends: libc6, libstdc++6, libgcc-s1, libzstd1, zlib1g, libsystemd0, libcurl4, libnats3.4
Installed-Size: $size
Section: admin
Priority: optional
Description: local event daemon for apps
 whend receives screen lifecycle, navigation and When events from local apps on a Unix
 socket, appends every event to an append-only zstd-compressed journal, and runs them
 through plugin pipelines. whenctl emits, reads, follows, verifies and controls.
CONTROL
echo /etc/whend/whend.conf > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
# Enabled also where systemd does not run (an image being built, a container): the sockets
# listen at the next boot. Started now only where it runs.
if [ "$1" = configure ]; then
    # The group the service reads its configuration through (whend.service:
    # SupplementaryGroups=); not named whend, which the dynamic user takes.
    getent group whend-config >/dev/null || groupadd --system whend-config
    if ! dpkg-statoverride --list /etc/whend/whend.conf >/dev/null; then
        dpkg-statoverride --update --add root whend-config 0640 /etc/whend/whend.conf
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        systemctl enable --now whend.socket whend-control.socket || true
    else
        systemctl enable whend.socket whend-control.socket || true
    fi
fi
SCRIPT
cat > "$root/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl disable --now whend.service whend.socket whend-control.socket || true
fi
SCRIPT
cat > "$root/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = purge ] && dpkg-statoverride --list /etc/whend/whend.conf >/dev/null; then
    dpkg-statoverride --remove /etc/whend/whend.conf
fi
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SCRIPT
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
dpkg-deb --root-owner-group --build "$root" "$out/" >/dev/null
echo "built $out/whend_${version}_${arch}.deb"
