#!/bin/sh
# Layering check: every `#include "..."` in src/ that names another room must point to a room of a
# lower layer. The layers are read from the ```layers block of docs/ARCHITECTURE.md (the one place
# they are declared): one layer per line, lowest first; rooms on one line are siblings and may not
# include each other. Rooms are the subdirectories of src/; a declared room that does not exist yet
# is fine, a room that exists but is not declared is an error.
#
#   scripts/check_layers.sh [ROOT]   check ROOT (default: the repository this script is in)
#   scripts/check_layers.sh --self-test
#                                    check that the check fails on an upward include, a sibling
#                                    include and an undeclared room, naming file:line
#
# Exit status: 0 clean, 1 violations (each printed as file:line: ...), 2 bad usage or layout.
# Not here: includes from tests/, bench/ or system headers (<...>), which are not rooms.
set -u

check() {
    root=$1
    doc="$root/docs/ARCHITECTURE.md"
    [ -d "$root/src" ] || { echo "check_layers: $root/src: no such directory" >&2; return 2; }
    [ -f "$doc" ] || { echo "check_layers: $doc: no such file" >&2; return 2; }
    # room -> layer index, from the block between ```layers and the next ```.
    layers=$(awk '
        /^```layers[ \t]*$/ { on = 1; next }
        on && /^```/ { exit }
        on {
            sub(/#.*/, "")
            if (NF == 0) next
            n++
            for (i = 1; i <= NF; i++) print $i, n
        }' "$doc")
    if [ -z "$layers" ]; then
        echo "check_layers: $doc: no \`\`\`layers block" >&2
        return 2
    fi
    dup=$(printf '%s\n' "$layers" | awk '{ print $1 }' | sort | uniq -d)
    if [ -n "$dup" ]; then
        echo "check_layers: $doc: room(s) declared twice in the layers block: $dup" >&2
        return 2
    fi
    bad=0
    for d in "$root"/src/*/; do
        r=$(basename "$d")
        if ! printf '%s\n' "$layers" | grep -q "^$r "; then
            echo "src/$r/: room not declared in the layers block of docs/ARCHITECTURE.md"
            bad=1
        fi
    done
    # Every quoted include, as file:line:text; resolved as the compiler does for quotes: first
    # beside the including file, then from src/ (the include path). One awk pass: a fork per
    # include would make this the slowest test.
    out=$(cd "$root" && find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
            -o -name '*.cpp' \) | LC_ALL=C sort | xargs grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' /dev/null |
        awk -v layers="$layers" '
        BEGIN {
            n = split(layers, l, "\n")
            for (i = 1; i <= n; i++) { split(l[i], f, " "); layer[f[1]] = f[2] }
        }
        # Normalises a/b/../c to a/c.
        function norm(p,    k, m, i, seg, out) {
            m = split(p, seg, "/"); k = 0
            for (i = 1; i <= m; i++) {
                if (seg[i] == "." || seg[i] == "") continue
                if (seg[i] == ".." && k > 0 && st[k] != "..") { k--; continue }
                st[++k] = seg[i]
            }
            out = ""
            for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") st[i]
            return out
        }
        function exists(p,    r, line) {
            r = (getline line < p) >= 0
            close(p)
            return r
        }
        {
            file = $0; sub(/:.*/, "", file)
            rest = substr($0, length(file) + 2)
            line = rest; sub(/:.*/, "", line)
            inc = rest; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
            split(file, fp, "/"); from = fp[2]
            dir = file; sub(/\/[^\/]*$/, "", dir)
            if (exists(dir "/" inc)) {
                p = norm(dir "/" inc)
                if (p !~ /^src\//) { printf "%s:%s: \"%s\" resolves outside src/\n", file, line, inc; next }
                split(p, tp, "/"); to = tp[2]
                if (tp[3] == "") to = from  # a file directly in src/
            } else {
                if (inc !~ /\//) next        # no directory: a generated header beside the build
                to = inc; sub(/\/.*/, "", to)
                if (!(to in layer)) next     # not a declared room (and not found): the compiler will say
            }
            if (to == from || !(from in layer) || !(to in layer)) next  # undeclared rooms: reported above
            if (layer[to] + 0 > layer[from] + 0)
                printf "%s:%s: \"%s\": %s/ includes %s/, a higher layer\n", file, line, inc, from, to
            else if (layer[to] + 0 == layer[from] + 0)
                printf "%s:%s: \"%s\": %s/ includes %s/, a sibling on the same layer\n", file, line, inc, from, to
        }')
    if [ -n "$out" ]; then
        printf '%s\n' "$out"
        bad=1
    fi
    if [ "$bad" -ne 0 ]; then
        echo "check_layers: imports must run downwards (docs/ARCHITECTURE.md, \"The parts and their rooms\"):" \
             "move the code down, or pass a function pointer or a small interface down instead" >&2
        return 1
    fi
    echo "check_layers: $(printf '%s\n' "$layers" | wc -l | tr -d ' ') rooms declared, no upward include"
    return 0
}

self_test() {
    tmp=$(mktemp -d) || return 2
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/docs" "$tmp/src/base" "$tmp/src/model" "$tmp/src/tokenizer" "$tmp/src/grammar"
    cat > "$tmp/docs/ARCHITECTURE.md" <<'EOF'
```layers
base
tokenizer   # a comment
grammar model
absent
```
EOF
    printf '#include "base/status.h"\n' > "$tmp/src/base/status.h"
    printf '#include <stdio.h>\n#include "tokenizer/tok.h"\n#include "base/status.h"\n' > "$tmp/src/model/gguf.h"
    printf '// fine: downwards, same room, beside the file\n#include "base/status.h"\n#include "tok.h"\n' \
        > "$tmp/src/tokenizer/tok.h"
    printf '#include "grammar/g.h"\n' > "$tmp/src/grammar/g.h"
    fail=0
    out=$(check "$tmp" 2>&1); rc=$?
    [ "$rc" -eq 0 ] || { echo "self-test: a clean tree failed (rc $rc): $out"; fail=1; }
    # Upward: tokenizer includes model (the GGUF reader's old home).
    printf '\n#include "model/gguf.h"  // upward\n' >> "$tmp/src/tokenizer/tok.h"
    out=$(check "$tmp" 2>&1); rc=$?
    [ "$rc" -eq 1 ] || { echo "self-test: an upward include passed (rc $rc)"; fail=1; }
    printf '%s\n' "$out" | grep -q '^src/tokenizer/tok.h:5: "model/gguf.h": tokenizer/ includes model/, a higher layer$' ||
        { echo "self-test: the upward include is not named by file:line: $out"; fail=1; }
    # Upward through a relative path.
    printf '#include "../model/gguf.h"\n' > "$tmp/src/base/rel.c"
    out=$(check "$tmp" 2>&1)
    printf '%s\n' "$out" | grep -q '^src/base/rel.c:1: "../model/gguf.h": base/ includes model/, a higher layer$' ||
        { echo "self-test: a relative upward include is not found: $out"; fail=1; }
    rm "$tmp/src/base/rel.c"
    sed -i '$d' "$tmp/src/tokenizer/tok.h"
    # Sibling: grammar and model share a layer.
    printf '#include "model/gguf.h"\n' > "$tmp/src/grammar/g.c"
    out=$(check "$tmp" 2>&1); rc=$?
    [ "$rc" -eq 1 ] && printf '%s\n' "$out" | grep -q '^src/grammar/g.c:1: .*a sibling on the same layer$' ||
        { echo "self-test: a sibling include passed (rc $rc): $out"; fail=1; }
    rm "$tmp/src/grammar/g.c"
    # A room nobody placed.
    mkdir "$tmp/src/newroom"
    out=$(check "$tmp" 2>&1); rc=$?
    [ "$rc" -eq 1 ] && printf '%s\n' "$out" | grep -q '^src/newroom/: room not declared' ||
        { echo "self-test: an undeclared room passed (rc $rc): $out"; fail=1; }
    rmdir "$tmp/src/newroom"
    # No block at all.
    printf '# nothing\n' > "$tmp/docs/ARCHITECTURE.md"
    check "$tmp" > /dev/null 2>&1; rc=$?
    [ "$rc" -eq 2 ] || { echo "self-test: a missing layers block gave rc $rc, not 2"; fail=1; }
    [ "$fail" -eq 0 ] && echo "check_layers self-test: upward, relative, sibling and undeclared rooms are caught"
    return "$fail"
}

case "${1:-}" in
    --self-test) self_test; exit $? ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") check "$(cd "$(dirname "$0")/.." && pwd -P)"; exit $? ;;
    *) check "$(cd "$1" && pwd -P)"; exit $? ;;
esac
