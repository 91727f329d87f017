#!/bin/sh
# Passes when a command exits with the given status and its output (stdout
# and stderr together) has a line matching the pattern; else prints the end
# of the output and what was wanted. Arguments: status, pattern, command...
want=$1
pattern=$2
shift 2
out=$("$@" 2>&1)
status=$?
if [ $status -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
    exit 0
fi
printf '%s\n' "$out" | tail -8
echo "$*: exit $status (want $want and '$pattern')"
exit 1
