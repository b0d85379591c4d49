#!/usr/bin/env bash
# Runs the installed whend (from the .deb) on scratch sockets for a few seconds: events in, and
# the built-in plugins at work on them (a screen view derived, a session indexed, an analytics
# batch written). Proves that the packaged binaries find their Swift runtime and that the
# packaged plugins load into it. Usage: packaging/smoke-test.sh [/usr/bin]
set -euo pipefail
bin=${1:-/usr/bin}
scratch=$(mktemp -d /tmp/whend-smoke.XXXXXX)
# Stopped and waited for before its directory goes: its workers may still be saving state.
trap '{ kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; } || true; rm -rf "$scratch"' EXIT
"$bin/whend" --socket "$scratch/events.sock" --state-dir "$scratch/state" >"$scratch/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$scratch/events.sock" ] && break; sleep 0.1; done
"$bin/whenctl" emit --socket "$scratch/events.sock" --app com.example.marvel --session smoke \
    '{"type":"navigation","action":"root","screen":"CharacterList"}' \
    '{"type":"when","name":"userTapsCharacter","params":{"characterId":1}}'
ok=""
for _ in $(seq 100); do
    if "$bin/whenctl" cat --state-dir "$scratch/state" --type screen | grep -q CharacterList \
        && [ -s "$scratch/state/plugins/analytics/events.ndjson" ] \
        && "$bin/whenctl" sessions --state-dir "$scratch/state" | grep -q smoke; then
        ok=yes
        break
    fi
    sleep 0.1
done
if [ -z "$ok" ]; then
    echo "smoke test failed: the built-in plugins did not run; whend's log:" >&2
    cat "$scratch/log" >&2
    exit 1
fi
if grep -q "built-in pipeline .* is off" "$scratch/log"; then
    echo "smoke test failed: a built-in plugin did not load:" >&2
    cat "$scratch/log" >&2
    exit 1
fi
echo "smoke test: the installed whend stored events and ran its four built-in plugins"
