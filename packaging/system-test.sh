#!/usr/bin/env bash
# whend under a live systemd: installs the .deb (built by `make deb`) into a minimal Debian 12
# root, boots that root with systemd-nspawn, and lets packaging/system-test-inside.sh check
# socket activation, the dynamic user, READY/STATUS, the journal, reload, the watchdog, the
# sandboxed pipelines, the hardening score and the installed tools, from a unit inside. The
# results are read after the power-off. The root is built with debootstrap once and cached in
# $WHEND_SYSTEM_TEST_CACHE (default /var/cache/whend-system-test). Needs root.
# Usage: packaging/system-test.sh [path/to/whend.deb]
set -euo pipefail
cd "$(dirname "$0")/.."
deb=${1:-$(ls -t .build-deb/whend_*.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "system-test: no .deb; run make deb first" >&2; exit 1; }
cache=${WHEND_SYSTEM_TEST_CACHE:-/var/cache/whend-system-test}
mirror=${WHEND_DEBIAN_MIRROR:-http://deb.debian.org/debian}
nspawn=(systemd-nspawn -q --register=no --keep-unit)

if [ ! -x "$cache/root/usr/bin/systemctl" ]; then
    echo "system-test: building a minimal Debian 12 root in $cache (once)…"
    rm -rf "$cache/root.partial"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,zstd,ca-certificates \
        bookworm "$cache/root.partial" "$mirror" > "$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    mv "$cache/root.partial" "$cache/root"
fi

work=$(mktemp -d /var/tmp/whend-system-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "system-test: a fresh copy of the root, the .deb installed into it…"
cp -a "$cache/root" "$work/root"
cp "$deb" "$work/root/var/tmp/whend.deb"
# Without a running systemd the package enables its sockets but starts nothing. (Not in /tmp:
# systemd-nspawn mounts a fresh tmpfs there.)
"${nspawn[@]}" -D "$work/root" bash -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /var/tmp/whend.deb' \
    > "$work/install.log" 2>&1 || { tail -20 "$work/install.log" >&2; exit 1; }
install -m 0755 packaging/system-test-inside.sh "$work/root/usr/local/bin/whend-system-test"
cat > "$work/root/etc/systemd/system/whend-system-test.service" <<'UNIT'
[Unit]
Description=whend system test
After=basic.target whend.socket whend-control.socket

[Service]
Type=oneshot
ExecStart=/usr/local/bin/whend-system-test
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/whend-system-test.service \
    "$work/root/etc/systemd/system/multi-user.target.wants/whend-system-test.service"

# systemd-nspawn keeps state under /run/systemd/nspawn; without a host systemd, /run may not be
# a tmpfs.
mkdir -p /run/systemd/nspawn
mountpoint -q /run/systemd/nspawn || mount -t tmpfs tmpfs /run/systemd/nspawn
echo "system-test: booting it (systemd-nspawn -b)…"
timeout 600 "${nspawn[@]}" -b -D "$work/root" > "$work/boot.log" 2>&1 || true

results="$work/root/system-test.results"
if [ ! -f "$results" ]; then
    echo "system-test: the test unit left no results; the boot:" >&2
    tail -40 "$work/boot.log" >&2
    exit 1
fi
cat "$results"
if grep -q '^FAIL' "$results" || ! grep -q '^done' "$results"; then
    echo "system-test: FAILED (whend's journal inside follows)" >&2
    "${nspawn[@]}" -D "$work/root" journalctl -u whend.service --no-pager 2>/dev/null | tail -40 >&2 || true
    exit 1
fi
echo "system-test: $(grep -c '^ok' "$results") checks passed under systemd $("${nspawn[@]}" -D "$work/root" systemctl --version | head -1 | cut -d' ' -f2)"
