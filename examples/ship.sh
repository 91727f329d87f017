#!/bin/sh
# Compile on a build machine (no GPU needed), export the kernels the model
# needs into one read-only file, and start from it with compilation off.
#
#   examples/ship.sh [KILN] [WORKDIR]
set -eu
kiln=${1:-kiln}
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"

# The planning options, the same at every step: another capture size is
# another kernel.
plan="--target sm_90a --capture 1,8"

# 1. Build machine: compile the demo for the deployment's GPU into a cache.
"$kiln" compile demo $plan --cache "$dir/build.kiln" --quiet

# 2. Export exactly what the demo needs: the file that ships with the model,
#    and check, still without a GPU, that it holds every kernel.
rm -f "$dir/demo.kiln"
"$kiln" cache export --model demo $plan -o "$dir/demo.kiln" --cache "$dir/build.kiln"
chmod 0444 "$dir/demo.kiln"
"$kiln" cache check --model demo $plan --shipped "$dir/demo.kiln"

# 3. Deployment: read-only cache, offline (a missing kernel is an error, never
#    a compile), no writable cache of its own. Without a GPU this runs on the
#    CPU executor and says so.
KILN_OFFLINE=1 KILN_CACHE="$dir/unused.kiln" \
    "$kiln" run demo $plan --shipped "$dir/demo.kiln" --offline --tokens 1,8 --steps 2
