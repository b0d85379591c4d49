#!/usr/bin/env bash
# Builds whend_<version>_<arch>.deb from a release build: the binaries (Swift's standard
# library linked in, so the package needs no Swift toolchain), the systemd units, the default
# configuration and the docs. Usage: packaging/build-deb.sh [output directory]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.build-deb}
version=$(sed -n 's/.*current = "\(.*\)".*/\1/p' Sources/WhendWire/Version.swift)
arch=$(dpkg --print-architecture)
scratch=.build-static

echo "building whend $version (release, static Swift standard library)…"
swift build -c release --static-swift-stdlib --scratch-path "$scratch" --product whend
swift build -c release --static-swift-stdlib --scratch-path "$scratch" --product whenctl
bin=$(swift build -c release --static-swift-stdlib --scratch-path "$scratch" --show-bin-path)

root="$out/whend_${version}_${arch}"
rm -rf "$root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/whend" \
    "$root/usr/share/doc/whend" "$root/usr/lib/whend/plugins"
install -m 0755 "$bin/whend" "$bin/whenctl" "$root/usr/bin/"
strip --strip-unneeded "$root/usr/bin/whend" "$root/usr/bin/whenctl"
install -m 0644 packaging/whend.service packaging/whend.socket packaging/whend-control.socket \
    "$root/lib/systemd/system/"
install -m 0644 packaging/whend.conf "$root/etc/whend/whend.conf"
install -m 0644 README.md "$root/usr/share/doc/whend/README.md"
printf 'whend\nSee /usr/share/doc/whend/README.md.\n' > "$root/usr/share/doc/whend/copyright"

size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: whend
Version: $version
Architecture: $arch
Maintainer: whend developers <whend@localhost>
Depends: libc6, libstdc++6, libgcc-s1, libzstd1, libsystemd0
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
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
    systemctl enable --now whend.socket whend-control.socket || true
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
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SCRIPT
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
dpkg-deb --root-owner-group --build "$root" "$out/" >/dev/null
echo "built $out/whend_${version}_${arch}.deb"
