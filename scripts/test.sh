#!/usr/bin/env bash
# The whole test suite in four pytest sessions (`make test`; the Makefile passes the test paths):
#
#   1. the live vLLM session (tests/integration with SPECADAPT_LIVE_PHASE=vllm, then tests/configs), one test
#      at a time; its output is printed as it runs. Its tests that measure time (marked `timed`) run first,
#      alone on the machine: nothing else runs until they have finished.
#   2. then, beside the rest of it, the tests that share no real server, on both cores (pytest-xdist): its
#      untimed tests assert nothing that rests on a quiet machine, and the two keep both cores busy where the
#      live tests leave one waiting.
#   3. once the parallel session has ended and the vLLM session has stopped every vLLM server but the two
#      most tests use (all the servers at once do not fit in 24 GB), the live tests of reference servers
#      only, in two sessions side by side (features, and the rest), beside the rest of the vLLM session.
#
# The buffered sessions' output follows the vLLM session's. Each session must collect tests (pytest's
# exit 5 fails here). Every session is stopped if this script is.
#
# usage: scripts/test.sh PYTHON   (PARALLEL_TESTS, SERIAL_TESTS, REFERENCE_TESTS, PYTEST_ARGS from the environment)
set -u
PY=${1:?usage: scripts/test.sh PYTHON}
PARALLEL_TESTS=${PARALLEL_TESTS:?} SERIAL_TESTS=${SERIAL_TESTS:?} REFERENCE_TESTS=${REFERENCE_TESTS-}
PYTEST_ARGS=${PYTEST_ARGS-}
logs=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$logs"' EXIT
trap 'exit 130' INT TERM

# until FILE exists or the vLLM session has ended
await() { while [ ! -e "$1" ] && kill -0 "$v" 2>/dev/null; do sleep 1; done; }

# shellcheck disable=SC2086  # the test paths and arguments are lists
SPECADAPT_LIVE_PHASE=vllm SPECADAPT_QUIET_DONE="$logs/quiet-done" SPECADAPT_ROOM_DONE="$logs/room-done" \
  $PY -m pytest $SERIAL_TESTS $PYTEST_ARGS & v=$!
await "$logs/quiet-done"
printf "\n(the timed live tests have finished: the parallel session runs beside the rest; its output follows)\n" >&2
# shellcheck disable=SC2086
$PY -m pytest -n 2 $PARALLEL_TESTS $PYTEST_ARGS >"$logs/parallel.log" 2>&1 & p=$!

wait $p; a=$?  # before the reference sessions: not three at once, the CPUs' threads would wait on each other

c=0 d=0
if [ -n "$REFERENCE_TESTS" ]; then
  await "$logs/room-done"
  printf "\n(the reference sessions start now, beside the rest of the vLLM session; their output follows)\n" >&2
  # shellcheck disable=SC2086
  SPECADAPT_LIVE_PHASE=features $PY -m pytest $REFERENCE_TESTS $PYTEST_ARGS >"$logs/features.log" 2>&1 & f=$!
  # shellcheck disable=SC2086
  SPECADAPT_LIVE_PHASE=reference $PY -m pytest $REFERENCE_TESTS $PYTEST_ARGS >"$logs/reference.log" 2>&1 & r=$!
  wait $r; c=$?
  wait $f; d=$?
fi
wait $v; b=$?

for name in parallel reference features; do
  if [ -s "$logs/$name.log" ]; then
    echo; echo "=============== the $name session ==============="; cat "$logs/$name.log"
  fi
done

for rc in $a $b $c $d; do
  if [ "$rc" -eq 5 ]; then echo "error: a pytest session collected no tests; that is a failure here" >&2; exit 1; fi
done
fail=0
[ $a -ne 0 ] && { echo "error: the parallel session failed (exit $a)" >&2; fail=$a; }
[ $b -ne 0 ] && { echo "error: the session of live vLLM tests failed (exit $b)" >&2; fail=$b; }
[ $c -ne 0 ] && { echo "error: the session of live reference tests failed (exit $c)" >&2; fail=$c; }
[ $d -ne 0 ] && { echo "error: the session of live feature tests failed (exit $d)" >&2; fail=$d; }
exit $fail
