#!/usr/bin/env bash
# `make test`, phase by phase: each phase's wall time is printed at the
# end (the test layers' own times come from tests/conftest.py, the kernel
# VM's steps from tests/kernel/conftest.py).  The budget is 20 minutes on
# a quiet 2-core machine, installs included.
#
# Usage: tests/phases.sh NAME 'COMMAND' [NAME 'COMMAND' ...]
#
# Phases run one after the other, except one whose NAME ends in '&': it
# starts in the background (its own process group, its output kept in
# $PHASES_LOGS/NAME.log) and the next phase starts at once; its output is
# printed when every foreground phase is done and it has ended.  The
# kernel tests run so: their VM mostly waits on emulated hardware, which
# leaves a core for the other layers.
# Stops at the first phase that fails (a background one included, found
# at the end), with that phase's exit status; a foreground failure stops
# the background phases too.
set -uo pipefail

PHASES_LOGS=${PHASES_LOGS:-.cache/phases}
mkdir -p "$PHASES_LOGS"
set -m          # background phases in their own process groups

t00=$(date +%s)
names=()
secs=()
bg_names=()
bg_pids=()
bg_starts=()
summary() {
    echo
    echo "== make test phases (seconds) =="
    local i
    for i in "${!names[@]}"; do
        printf '%-28s %7s\n' "${names[$i]}" "${secs[$i]}"
    done
    printf '%-28s %7s\n' 'total (wall)' "$(($(date +%s) - t00))"
}
stop_background() {
    local pid
    for pid in "${bg_pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null
    done
}
trap summary EXIT
trap 'stop_background; exit 130' INT TERM

while [ $# -ge 2 ]; do
    name=$1 cmd=$2
    shift 2
    start=$(date +%s)
    if [ "${name%&}" != "$name" ]; then
        name=${name%&}
        log="$PHASES_LOGS/${name// /-}.log"
        echo "== $name: started in the background (output: $log)"
        rm -f "$log.end"
        (bash -c "$cmd"; rc=$?; date +%s > "$log.end"; exit $rc) \
            > "$log" 2>&1 &
        bg_names+=("$name")
        bg_pids+=($!)
        bg_starts+=("$start")
        continue
    fi
    bash -c "$cmd"
    rc=$?
    names+=("$name")
    secs+=($(($(date +%s) - start)))
    if [ $rc -ne 0 ]; then
        echo "phase '$name' failed (exit $rc)" >&2
        stop_background
        exit $rc
    fi
done

failed=0
for i in "${!bg_pids[@]}"; do
    wait "${bg_pids[$i]}"
    rc=$?
    log="$PHASES_LOGS/${bg_names[$i]// /-}.log"
    end=$(cat "$log.end" 2>/dev/null || date +%s)
    names+=("${bg_names[$i]} (background)")
    secs+=($((end - bg_starts[i])))
    echo
    echo "== ${bg_names[$i]} (ran in the background): its output =="
    cat "$log"
    if [ $rc -ne 0 ]; then
        echo "phase '${bg_names[$i]}' failed (exit $rc)" >&2
        [ $failed -ne 0 ] || failed=$rc
    fi
done
exit $failed
