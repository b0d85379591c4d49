#!/usr/bin/env bash
# record-report.sh REPORT COMMAND: writes what `make bench` printed (REPORT) into BENCHMARKS.md,
# between its "last run" markers, with the date, the machine and the commit; and the headline
# figures (whend as it ships, beside rsyslog) into the README's small table, between its markers.
# Everything outside the markers is left as written. DOCS_DIR: where BENCHMARKS.md and README.md
# are (default: the checkout this script is in).
set -euo pipefail
report=$(realpath "$1")
command=$2
cd "$(dirname "$0")/.."

commit=$(git rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit, with changes not committed"; fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
memory=$(awk '/^MemTotal:/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
machine="$(nproc) cores ($cpu), $memory, Linux $(uname -r)"

# Replaces the lines strictly between the two markers in FILE by the contents of BODY.
replace_between() {
    local file=$1 begin=$2 end=$3 body=$4
    grep -qF -- "$begin" "$file" && grep -qF -- "$end" "$file" || {
        echo "record-report.sh: $file has no '$begin' … '$end' markers" >&2
        exit 1
    }
    awk -v begin="$begin" -v end="$end" -v body="$body" '
        index($0, begin) == 1 { print; while ((getline line < body) > 0) print line; skipping = 1; next }
        index($0, end) == 1 { skipping = 0 }
        !skipping { print }
    ' "$file" > "$file.new"
    mv "$file.new" "$file"
}

block=$(mktemp)
trap 'rm -f "$block"' EXIT
{
    echo "Last run: \`$command\`, $(date -u +%Y-%m-%d), commit $commit, on $machine."
    echo
    echo '```'
    grep -v '^\[' "$report"
    echo '```'
} > "$block"
replace_between "${DOCS_DIR:-.}/BENCHMARKS.md" '<!-- make bench: last run -->' '<!-- make bench: end of last run -->' "$block"

# The headline, if the run measured whend as it ships.
ingest=$(sed -n 's/^  ingest: \([0-9,]*\) events\/s (\([0-9.]*\) × rsyslog.*/\1 events\/s, \2 × rsyslog/p' "$report" | head -1)
e2e=$(sed -n 's/^  end to end (first byte → every pipeline.s lag 0): \([0-9,]*\) events\/s (\([0-9.]*\) × rsyslog).*/\1 events\/s, \2 × rsyslog/p' "$report" | head -1)
pss=$(sed -n "s/^  the whole service's PSS (whend and its workers): idle \([0-9.]*\) MiB, after the run \([0-9.]*\) MiB.*/idle \1 MiB, after the run \2 MiB/p" "$report" | head -1)
if [ -n "$ingest" ] && [ -n "$e2e" ] && [ -n "$pss" ]; then
    {
        echo "| whend as it ships, 1M events over 4 connections, acks and \`fsync\` | $(date -u +%Y-%m-%d), commit $commit |"
        echo "|---|---|"
        echo "| ingest | $ingest |"
        echo "| end to end, every pipeline caught up | $e2e |"
        echo "| the whole service's memory (PSS) | $pss |"
    } > "$block"
    replace_between "${DOCS_DIR:-.}/README.md" '<!-- make bench: headline -->' '<!-- make bench: end of headline -->' "$block"
fi
echo "record-report.sh: wrote the run into BENCHMARKS.md$([ -n "$ingest" ] && echo " and its headline into README.md")"
