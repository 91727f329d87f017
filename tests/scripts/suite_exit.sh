#!/bin/sh
# A suite's exit status is its verdict (tests/util/main.c): a run that failed
# a test, ran no test, or ran part of the suite without an explicit --filter
# fails; a GPU suite exits 77 (ctest: skipped) only when a test skipped and
# none failed. Arguments: the stand-in GPU suite
# (tests/harness/stand_in_suite.c), core_test_status, gpu_test_session_bench
# and the fake libcuda (tests/harness/fake_libcuda.c).
stand_in=$1
cpu=$2
gpu=$3
fake_cuda=$4
fail=0
expect() { # exit status, pattern, command...
    sh "$(dirname "$0")/expect_exit.sh" "$@" || fail=1
}
one=status/detail_message_is_per_thread

expect 0 "Tested: 1 | Passing: 1" "$stand_in" --filter stand_in/passes
expect 77 "1 of 1 tests skipped, the first stand_in::skips: no GPU here" \
    "$stand_in" --filter stand_in/skips
expect 1 "Tested: 2 | Passing: 1 | Failing: 1" "$stand_in"
expect 1 "Failing: 1" "$stand_in" --filter stand_in/fails

expect 1 "no test ran: the --filter selects none" "$cpu" --filter "none/*"
expect 1 "no test ran: the --filter selects none" "$gpu" --filter "none/*"
expect 1 "ran 1 test(s), fewer than the [0-9]* the suite declares" env CRITERION_TEST_PATTERN=$one "$cpu"
expect 0 "Tested: 1 | Passing: 1" "$cpu" --filter $one
expect 2 "usage" "$cpu" --no-such-option
expect 0 "$(basename $one)" "$cpu" --list

# The GPU suite itself, on a driver that sees no device and on one whose
# device cannot be read: skipped, then failed.
expect 77 "[0-9]* of [0-9]* tests skipped, the first .*no GPU here (the CUDA driver sees no device)" \
    env KILN_LIBCUDA="$fake_cuda" KT_FAKE_CUDA=no-device "$gpu"
expect 1 "a GPU is there but cannot be used: device 0: cuDeviceGet: CUDA_ERROR_UNKNOWN" \
    env KILN_LIBCUDA="$fake_cuda" "$gpu"
exit $fail
