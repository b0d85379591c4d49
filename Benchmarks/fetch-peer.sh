#!/usr/bin/env bash
# Unpacks rsyslog 8 and the libraries it needs from Debian into Benchmarks/.peer/root, without
# installing it: the system's own logging is never touched.
set -euo pipefail
peer="$(cd "$(dirname "$0")" && pwd)/.peer"
[ -x "$peer/root/usr/sbin/rsyslogd" ] && exit 0
mkdir -p "$peer/debs" "$peer/root"
cd "$peer/debs"
packages="rsyslog libestr0 libfastjson4 liblognorm5"
if ! apt-get download $packages 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then apt-get update -qq; else sudo apt-get update -qq; fi
    apt-get download $packages
fi
for deb in *.deb; do dpkg -x "$deb" "$peer/root"; done
echo "rsyslog unpacked in $peer/root"
