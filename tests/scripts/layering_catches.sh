#!/bin/sh
# layering.sh fails a tree whose runtime includes a codegen header, and
# names the file and the header.
set -eu
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/runtime"
printf '#include "core/build.h"\n#include "codegen/plan.h"\n' >"$d/runtime/session.c"
exec sh "$(dirname "$0")/expect_exit.sh" 1 "runtime/session.c includes codegen/plan.h" \
    sh "$(dirname "$0")/layering.sh" "$d"
