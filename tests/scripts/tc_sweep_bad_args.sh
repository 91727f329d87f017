#!/bin/sh
# scripts/tc-sweep refuses bad arguments before building anything: exit
# status 2 and a line naming what was wrong.
sweep=$1
fail=0
expect() { # pattern, args...
    pattern=$1
    shift
    err=$("$sweep" "$@" 2>&1 >/dev/null)
    status=$?
    if [ $status -ne 2 ] || ! printf '%s\n' "$err" | grep -q -- "$pattern"; then
        echo "tc-sweep $*: exit $status, '$err' (want 2 and '$pattern')"
        fail=1
    fi
}
expect "M must be 1, 2, 4, 8 or 16, not 3" tc_q4_0 3 4096x4096 1,4,4,4,3
expect "shape '4096by4096' is not NxK" tc_q4_0 1 4096by4096 1,4,4,4,3
expect "shape '0x64' is not NxK" tc_q4_0 1 4096x4096,0x64 1,4,4,4,3
expect "config '1,4,4' is not RT,W,KS,B,ST" tc_q4_0 1 4096x4096 1,4,4
expect "usage" tc_q4_0 1 4096x4096
expect "--against needs a git revision or a source directory" --against
expect "'no-such-revision' is neither a directory nor a git revision" --against no-such-revision tc_q4_0 1 4096x4096 1,4,4,4,3
expect "directory '/' holds no kiln kernels/ headers" --against / tc_q4_0 1 4096x4096 1,4,4,4,3
expect "--gate takes an even RT, not config" --gate tc_q4_0 1 4096x4096 1,4,4,4,3
exit $fail
