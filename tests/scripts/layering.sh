#!/bin/sh
# The library's folders depend one way: a file may include project headers
# (a quoted path with a folder) only from the folders listed for its own.
# The runtime reads the build (core/build.h) and the kernels' argument
# structs, never the codegen or a backend. Prints every include that
# breaks a rule; exits 1 when there is one.
# usage: layering.sh SOURCE_DIR
set -eu
cd "$1"
allowed_for() {
    case "$1" in
    core) echo "core/" ;;
    graph) echo "core/ graph/" ;;
    cache) echo "core/ cache/" ;;
    kernels) echo "core/ graph/ kernels/" ;;
    codegen) echo "core/ graph/ cache/ kernels/ codegen/" ;;
    runtime) echo "core/ graph/ runtime/ kernels/common/kiln_args.h" ;;
    esac
}
bad=0
files=0
for dir in core graph cache kernels codegen runtime; do
    [ -d "$dir" ] || continue
    allowed=$(allowed_for "$dir")
    for f in $(find "$dir" -name '*.[ch]' | sort); do
        files=$((files + 1))
        for path in $(sed -n 's/^#include "\([a-z_]*\/[^"]*\)".*/\1/p' "$f"); do
            ok=0
            for a in $allowed; do
                case "$path" in "$a"*) ok=1 ;; esac
            done
            if [ $ok = 0 ]; then
                echo "layering: $f includes $path; $dir/ may include only from: $allowed"
                bad=$((bad + 1))
            fi
        done
    done
done
if [ "$bad" -gt 0 ]; then
    echo "layering: $bad includes break the rules"
    exit 1
fi
echo "layering: $files files follow the rules"
