#!/usr/bin/env bash
# Runs the test suite (`swift test --skip-build` and the arguments given) with a deadline: a suite
# that has not ended within WHEND_TEST_DEADLINE seconds (default 1800; a whole run takes about 6
# minutes on 2 cores) is a hang, not a slow run. Then, before stopping it, this says what the
# hang is: where each thread of the test process waits (gdb), what each whend the tests started
# is doing, and, last, which tests started and never ended. Without this, a hang ran until CI's
# own limit and left only the output's tail, with nothing of where it waited.
set -uo pipefail
deadline=${WHEND_TEST_DEADLINE:-1800}
swift=${SWIFT:-swift}
log=$(mktemp /tmp/whend-suite.XXXXXX)
trap 'rm -f "$log"' EXIT

# A session of its own: on a hang, the whole tree (the test process, and every whend and worker
# it started) is stopped with one signal.
setsid stdbuf -oL -eL "$swift" test --skip-build "$@" > >(tee "$log") 2>&1 &
suite=$!

descendants() {
    local children
    children=$(pgrep -P "$1" || true)
    for child in $children; do
        echo "$child"
        descendants "$child"
    done
}

started=$SECONDS
while kill -0 "$suite" 2>/dev/null; do
    if ((SECONDS - started > deadline)); then
        echo
        echo "run-suite: the suite has not ended after ${deadline} s: it hangs. Where it waits:"
        for pid in $(descendants "$suite"); do
            name=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
            [ "$name" = tee ] && continue
            state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
            echo "--- pid $pid ($name), state $state, waiting in $(cat "/proc/$pid/wchan" 2>/dev/null): $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-300)"
            case "$name" in
            whend* | whenctl | *PackageTes*)
                if command -v gdb >/dev/null; then
                    # A line a thread: its name, and the innermost frames of whend's own code
                    # or the tests' (file:line), demangled; the runtime's frames are left out.
                    timeout 120 gdb -p "$pid" -batch -ex "thread apply all bt 40" 2>/dev/null |
                        "$swift" demangle --simplified --compact 2>/dev/null | awk '
                        function flush() { if (thread != "" && frames != "") print "  " thread ":" frames; frames = ""; n = 0 }
                        /^Thread / { flush(); thread = $1 " " $2; if (match($0, /"[^"]*"/)) thread = thread " " substr($0, RSTART, RLENGTH); next }
                        /^#[0-9]/ && /\/(Sources|Tests|Plugins)\// && n < 3 {
                            f = $0; sub(/^#[0-9]+ +(0x[0-9a-f]+ in )?/, "", f); loc = f
                            sub(/ \(.*/, "", f); sub(/.* at .*\//, "", loc)
                            frames = frames " " substr(f, 1, 90) " [" loc "]"; n++
                        }
                        END { flush() }' | cut -c1-400
                fi
                ;;
            esac
        done
        echo
        echo "run-suite: the tests that started and never ended:"
        # "◇ Test name() started." against "✔ Test name() passed…", "✘ … failed…", "➜ … skipped",
        # and "━ … passed … with 1 known issue".
        comm -23 \
            <(grep -aoE "◇ Test [^ ]+\)? started" "$log" | awk '{print $3}' | grep -v '^run$' | sort) \
            <(grep -aE "[✔✘➜━] Test [^ ]+ .*(passed|failed|skipped)" "$log" | grep -aoE "Test [^ ]+" | awk '{print $2}' | sort) | sed 's/^/  /'
        kill -KILL -- "-$suite" $(descendants "$suite") 2>/dev/null
        wait "$suite" 2>/dev/null
        echo "run-suite: stopped after ${deadline} s (WHEND_TEST_DEADLINE): the tests above hang; the stacks above say where."
        exit 124
    fi
    sleep 5
done
wait "$suite"
