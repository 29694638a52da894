# Sourced by bin/test: the stage runner. Each stage runs a command; `serial` in the foreground,
# `parallel` in the background, as many at once as fit in JOBS shares. Every stage prints its
# start and its end (time, pass or fail, seconds) when they happen, and keeps its output in a
# log file of its own in STAGE_LOGS, which stays after the run; a stage that fails prints its
# log's last STAGE_TAIL lines at once. `stages_report` waits for the rest, prints the summary
# and returns 1 when a stage failed. tests/test_stages.py runs it with tiny stages.
#
# stages_init DIR: use DIR for the logs (created; the logs of an earlier run in it removed)
# serial NAME CMD...: run now, its output shown; stop the script at the first failure (set -e)
# parallel SHARES NAME CMD...: start in the background once SHARES fit in JOBS
# stages_report: wait for every stage, print the summary; 1 when one failed

STAGE_NAMES=()
TIMES=()  # bin/test adds its virtualenvs' times too
declare -A STAGE_SHARES  # pid of a running stage -> the shares it takes
STAGE_TAIL="${STAGE_TAIL:-60}"

stages_init() {
  STAGE_LOGS="$1"
  mkdir -p "$STAGE_LOGS"
  rm -f "$STAGE_LOGS"/*.log "$STAGE_LOGS"/*.rc "$STAGE_LOGS"/*.time "$STAGE_LOGS"/*.json
  STAGE_START=$SECONDS
  echo "== the logs of this run: $STAGE_LOGS (one file a stage, kept after the run)"
}

_stage_clock() { date -u +%H:%M:%S; }

_stage_log() {  # _stage_log INDEX NAME: the stage's log file
  local slug
  slug="$(printf '%s' "$2" | tr -c 'A-Za-z0-9._-' '-' | tr -s '-' | cut -c1-60)"
  printf '%s/%02d-%s.log' "$STAGE_LOGS" "$1" "${slug%-}"
}

_stage_ended() {  # _stage_ended NAME RC SECONDS LOG: the end line, and the log's tail on failure
  if [ "$2" = 0 ]; then
    echo "== $(_stage_clock) passed ($3 s): $1"
  else
    {
      echo "== $(_stage_clock) FAILED (exit $2, $3 s): $1"
      echo "== the last $STAGE_TAIL lines of $4:"
      tail -n "$STAGE_TAIL" "$4"
      echo "== (end of $4)"
    } | cat  # one write per line block, less interleaved with the others' lines
  fi
}

serial() {
  local name="$1" began=$SECONDS rc=0
  shift
  echo "== $(_stage_clock) start: $name"
  "$@" || rc=$?
  TIMES+=("$(printf '%4ss  %s' $((SECONDS - began)) "$name")")
  if [ "$rc" != 0 ]; then
    echo "== $(_stage_clock) FAILED (exit $rc, $((SECONDS - began)) s): $name"
    exit "$rc"
  fi
  echo "== $(_stage_clock) passed ($((SECONDS - began)) s): $name"
}

_stages_busy() {  # BUSY := the shares the running stages take
  local pid
  BUSY=0
  for pid in $(jobs -rp); do BUSY=$((BUSY + ${STAGE_SHARES[$pid]:-0})); done
}

parallel() {
  local shares="$1" name="$2" i=${#STAGE_NAMES[@]} log
  shift 2
  STAGE_NAMES+=("$name")
  # at most JOBS shares at once: all ten stages at once loaded 2 cores past 13, and process
  # tests whose children must answer within seconds waited on the CPU instead
  _stages_busy
  while [ "$BUSY" -gt 0 ] && [ $((BUSY + shares)) -gt "$JOBS" ]; do
    wait -n || true
    _stages_busy
  done
  log="$(_stage_log "$i" "$name")"
  echo "== $(_stage_clock) start: $name (log: $log)"
  (
    began=$SECONDS
    if "$@" >"$log" 2>&1; then rc=0; else rc=$?; fi
    echo "$rc" >"$STAGE_LOGS/$i.rc"
    echo $((SECONDS - began)) >"$STAGE_LOGS/$i.time"
    _stage_ended "$name" "$rc" $((SECONDS - began)) "$log"
  ) &
  STAGE_SHARES[$!]=$shares
}

stages_report() {
  local i rc failed=0
  wait
  echo "== ${#STAGE_NAMES[@]} stages ended; their logs: $STAGE_LOGS"
  for i in "${!STAGE_NAMES[@]}"; do
    rc="$(cat "$STAGE_LOGS/$i.rc" 2>/dev/null || echo 1)"
    if [ "$rc" = 0 ]; then
      echo "passed          ${STAGE_NAMES[$i]}"
    else
      failed=1
      echo "FAILED (exit $rc) ${STAGE_NAMES[$i]}: $(_stage_log "$i" "${STAGE_NAMES[$i]}")"
    fi
    TIMES+=("$(printf '%4ss  %s' "$(cat "$STAGE_LOGS/$i.time" 2>/dev/null || echo '?')" "${STAGE_NAMES[$i]}")")
  done
  echo "== time per stage (the side-by-side ones overlap)"
  printf '%s\n' "${TIMES[@]}"
  echo "$(printf '%4ss' $((SECONDS - STAGE_START)))  in all"
  return "$failed"
}
