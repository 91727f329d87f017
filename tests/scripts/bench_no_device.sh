#!/bin/sh
# kiln-bench with no usable device (no GPU here, or no device 99 on a
# machine with one): gemm and ffn fail before any work, exit status 1 and a
# line naming the device, and write no report.
bench=$1
out=${TMPDIR:-/tmp}/kiln-bench-no-device.$$
fail=0
for cmd in "gemm --shapes 256x256 --m 1" "ffn --layers 1 --m 1"; do
    # shellcheck disable=SC2086
    err=$("$bench" $cmd --device 99 --json "$out.json" 2>&1 >/dev/null)
    status=$?
    if [ $status -ne 1 ] || ! printf '%s\n' "$err" | grep -q "^kiln-bench: device 99: "; then
        echo "kiln-bench $cmd --device 99: exit $status, '$err' (want 1 and 'kiln-bench: device 99: ...')"
        fail=1
    fi
    if [ -e "$out.json" ]; then
        echo "kiln-bench $cmd --device 99: wrote a report"
        fail=1
    fi
    rm -f "$out.json"
done
exit $fail
