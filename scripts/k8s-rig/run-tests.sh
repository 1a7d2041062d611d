# Sourced by test.sh and test-node.sh: runs the tests so that a signal to the script stops the run
# and leaves nothing. A bash that `exec`s into unshare keeps none of its traps, so they are set
# here, by the bash inside the namespaces (the same process: exec keeps the pid). pnpm passes a
# signal it gets only to the shell it starts for the script, which dies of it, never to the
# script: stop_with_pnpm, called before the exec, turns pnpm's end into a SIGTERM to the script.
# The tests run in a process group of their own (setsid), so that one signal reaches every vitest
# process, and get SIGTERM from the kernel if this script dies without passing one on (setpriv
# --pdeathsig). On SIGTERM, SIGINT or SIGHUP the script sends that signal to the whole group: the
# vitest workers then run their rigs' teardowns (scripts/rig-cleanup.ts). It waits up to 60 s for
# the group to end, runs the caller's `sweep` (whatever is left in the namespace, the run's
# folders) and exits with 128+signo.

# run_tests CMD...: runs CMD as above and waits for it; sets rc to its exit status.
run_tests() {
  setsid setpriv --pdeathsig TERM -- "$@" &
  tests=$!
  local s
  for s in TERM INT HUP; do trap "stop_tests $s" "$s"; done
  rc=0
  wait "$tests" || rc=$?
  trap - TERM INT HUP
}

# stop_tests SIG: the trap. Further signals (a process group's and pnpm's come one after the
# other) are ignored meanwhile, and so is SIGPIPE: the terminal or log reader may be gone already.
stop_tests() {
  trap '' TERM INT HUP PIPE
  echo "$(basename "$0"): SIG$1: stopping the tests" >&2 || true
  kill -s "$1" -- "-$tests" 2>/dev/null || true
  wait "$tests" 2>/dev/null || true
  local i
  for ((i = 0; i < 600; i++)); do
    group_runs "$tests" || break
    sleep 0.1
  done
  sweep
  exit $((128 + $(kill -l "$1")))
}

# group_runs PGID: whether a process of that group still runs (a zombie only waits to be reaped).
group_runs() {
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { n++ } END { exit n == 0 }'
}

# kill_netns_leftovers WHO: SIGKILLs every process in this network namespace but this shell,
# naming each on stderr as WHO.
kill_netns_leftovers() {
  local me p pid stat cmd
  me=$(readlink /proc/$$/ns/net)
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $pid == "$$" ]] && continue
    [[ $(readlink "$p/ns/net" 2>/dev/null) == "$me" ]] || continue
    stat=$(cat "$p/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    [[ ${stat%% *} == Z ]] && continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-160) || true
    if kill -9 "$pid" 2>/dev/null; then echo "$1: killed leftover $pid: $cmd" >&2 || true; fi
  done
}

# starttime PID: the start time of PID (field 22 of /proc/PID/stat), empty once it is gone or a zombie.
starttime() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) }
  read -r -a s <<<"$s"
  [[ ${s[0]} == Z ]] || echo "${s[19]}"
}

# stop_with_pnpm: when pnpm runs this script (an ancestor), a watcher sends the script SIGTERM once
# a pnpm it runs under (every one up the chain: `pnpm test` runs `pnpm test:k8s`) is gone, as when
# a CI runner or `timeout` signals that pnpm alone (stopWithPnpm in scripts/rig-cleanup.ts does the
# same for vitest). Call it before the exec into unshare: the watcher then stays outside the
# namespaces, where the sweep leaves it alone. It checks every second, and ends with the script.
stop_with_pnpm() {
  local pids=() pid=$PPID cmd stat
  while ((pid > 1)); do
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || break
    [[ $cmd =~ (^|/)pnpm(\.c?js)?( |$) ]] && pids+=("$pid")
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || break
    stat=${stat##*) }
    read -r _ pid _ <<<"$stat"
  done
  ((${#pids[@]})) || return 0
  local me=$$ born
  born=$(starttime $$)
  (
    while [[ $(starttime "$me") == "$born" ]]; do
      for pid in "${pids[@]}"; do
        [[ -n $(starttime "$pid") ]] || { kill -TERM "$me"; exit 0; }
      done
      sleep 1
    done
  ) </dev/null >/dev/null 2>&1 &
}
