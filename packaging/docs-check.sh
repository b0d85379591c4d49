#!/usr/bin/env bash
# After `dpkg -i` of the .deb: the man pages are where man finds them, and the bash completion
# the package installed completes a subcommand. Usage: packaging/docs-check.sh
set -euo pipefail
fail() { echo "docs-check: $*" >&2; exit 1; }

for page in whenctl whend; do
    path=$(man -w "$page") || fail "man -w $page finds no page (is /usr/share/man excluded by dpkg?)"
    echo "man -w $page: $path"
    man "$page" 2>/dev/null | grep -q "Exit status" || fail "man $page has no exit statuses"
done

# As bash does it: load the file bash-completion would load for `whenctl`, ask the function it
# registered for `whenctl ca<TAB>`.
completions=/usr/share/bash-completion/completions/whenctl
[ -f "$completions" ] || fail "no bash completion at $completions"
got=$(bash -c '
    source '"$completions"'
    function=$(complete -p whenctl | sed -n "s/.*-F \([^ ]*\).*/\1/p")
    COMP_WORDS=(whenctl ca); COMP_CWORD=1; COMP_LINE="whenctl ca"; COMP_POINT=${#COMP_LINE}
    "$function" whenctl ca whenctl
    printf "%s\n" "${COMPREPLY[@]}"')
[ "$got" = cat ] || fail "bash completes 'whenctl ca' to '$got', not 'cat'"
echo "bash: whenctl ca<TAB> → $got"
for file in /usr/share/zsh/vendor-completions/_whenctl /usr/share/fish/vendor_completions.d/whenctl.fish; do
    [ -s "$file" ] || fail "no completion at $file"
done
echo "docs-check: man pages and completions installed"
