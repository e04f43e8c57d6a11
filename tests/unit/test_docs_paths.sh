#!/usr/bin/env bash
# No tracked file names a folder of one particular machine. Checked in every file git
# tracks (text only, as the working tree has it):
#   - the absolute path of the folder above this checkout, computed here (where the
#     checkout happens to live: a fresh clone in /tmp/x/main checks for /tmp/x/), unless
#     that folder is one of the system's shared ones (/, /tmp, /srv, ...), whose paths the
#     documentation uses on purpose;
#   - a developer machine's home folders: /home/NAME/, /Users/NAME/, /root/;
#   - the folder above the checkout's own folder too, when the checkout sits two levels
#     down (a machine that keeps its checkouts in /SOMETHING/NAME/main: that prefix is
#     computed here, never written in this file).
# Paths that stand for every installation (/etc/quantd, /srv/quantized, /var/lib/quantd,
# /tmp/...) are fine. Write a path relative to the repository (build/release,
# ../shared/data) or with a placeholder ($REPO, BUILD_DIR) instead.
# Usage: test_docs_paths.sh [SOURCE_DIR]; skips (77) outside a git checkout.
set -u
src=${1:-${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
command -v git >/dev/null || { echo "SKIP: git not installed"; exit 77; }
git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "SKIP: $src is not a git checkout"; exit 77; }
top=$(git -C "$src" rev-parse --show-toplevel)
cd "$top" || exit 2
self=tests/unit/test_docs_paths.sh
fails=0

parents=()
for p in "$(cd "$top/.." && pwd -L)" "$(cd "$top/.." && pwd -P)" "$(cd "$top/../.." && pwd -P)"; do
    case "$p" in
    /|/tmp|/var/tmp|/srv|/opt|/usr|/usr/local|/var|/var/lib|/etc|/home|/mnt|/media|/data) ;;
    *) [[ " ${parents[*]} " == *" $p "* ]] || parents+=("$p") ;;
    esac
done
for p in "${parents[@]}"; do
    hits=$(git grep -I -n -F -e "$p/" -- . ":!$self" 2>/dev/null)
    if [ -n "$hits" ]; then
        echo "FAIL: tracked files name $p/, the folder this checkout lives in:" >&2
        echo "$hits" | cut -c1-200 >&2
        fails=$((fails + 1))
    fi
done

# A machine's home folders. (?<!...) is not in POSIX regexes: a path counts when
# it starts a word (after a space, quote, parenthesis, =, : or the line start).
hits=$(git grep -I -n -E -e '(^|[[:space:]"'"'"'(=:`])/(home|Users)/[A-Za-z0-9_.-]+/' \
                          -e '(^|[[:space:]"'"'"'(=:`])/root/' -- . ":!$self" 2>/dev/null)
if [ -n "$hits" ]; then
    echo "FAIL: tracked files name a developer machine's folders:" >&2
    echo "$hits" | cut -c1-200 >&2
    fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "test_docs_paths: $(git ls-files | wc -l) tracked files name no machine's folders (checked: ${parents[*]:-no checkout-specific parent} and /home, /Users, /root)"
exit $((fails > 0))
