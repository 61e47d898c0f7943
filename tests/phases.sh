#!/usr/bin/env bash
# `make test`, phase by phase: each phase's wall time is printed at the
# end (the test layers' own times come from tests/conftest.py, the kernel
# VM's steps from tests/kernel/conftest.py).  The budget is 20 minutes on
# a quiet 2-core machine, installs included.
#
# Usage: tests/phases.sh NAME 'COMMAND' [NAME 'COMMAND' ...]
# Stops at the first phase that fails, with that phase's exit status.
set -uo pipefail

names=()
secs=()
summary() {
    echo
    echo "== make test phases (seconds) =="
    local total=0 i
    for i in "${!names[@]}"; do
        printf '%-28s %7s\n' "${names[$i]}" "${secs[$i]}"
        total=$((total + secs[i]))
    done
    printf '%-28s %7s\n' total "$total"
}
trap summary EXIT

while [ $# -ge 2 ]; do
    name=$1 cmd=$2
    shift 2
    start=$(date +%s)
    bash -c "$cmd"
    rc=$?
    names+=("$name")
    secs+=($(($(date +%s) - start)))
    if [ $rc -ne 0 ]; then
        echo "phase '$name' failed (exit $rc)" >&2
        exit $rc
    fi
done
