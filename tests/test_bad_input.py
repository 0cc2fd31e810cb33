"""Bad input gets a clear error and changes nothing (DESIGN §3.5, check before write).

Three layers: malformed ARGV sent straight to each script; keys of every wrong Redis
type planted by "another program" in every key a script takes; and bad values passed
to the Python driver, which rejects them before sending anything.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from helpers import T0, argv_rule, busy_queue, calls_touching_every_key, dump_all

from pyqueue import InvalidArgument, Job, NewJob, Queue, WrongTypeError
from pyqueue.protocol.errors import map_redis_error
from pyqueue.drivers.scripts import SCRIPT_KEYS
from pyqueue.ops.service import Services
from pyqueue.drivers.queue import transport_of

RECEIPT = "w|c|1|1|job"

#: (script, ARGV) pairs every script must reject: with PQ_CONTRACT when the header allows
#: no such count of ARGV (tests/test_contract_counts.py), else with PQ_BADARG.
MALFORMED: list[tuple[str, list[Any]]] = [
    ("enqueue", ["", 0]),
    ("enqueue", ["", 1001]),
    ("enqueue", ["", "one", "id", b"", 0, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", ""][:-1]),  # too few values for one job
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "", "extra"]),
    ("enqueue", ["", 1, "", b"", 0, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "a\r\nb", b"", 0, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "x" * 257, b"", 0, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", -1, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", "1.5", 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", "1e3", 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", "nan", 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 2**41, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 0, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 10001, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, "999999999999999999999999", "", "", "", ""]),
    ("enqueue", ["soon", 1, "id", b"", 0, 1, "", "", "", ""]),
    ("enqueue", [-5, 1, "id", b"", 0, 1, "", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, 6, "", "", ""]),  # priority above 5
    ("enqueue", ["", 1, "id", b"", 0, 1, -6, "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "1.5", "", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "a|b", "", ""]),  # a group may not hold |
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "a\nb", "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "g" * 129, "", ""]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", 0, ""]),  # expires_ms 0
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "soon", ""]),
    ("enqueue", ["", 1, "id", b"", 100, 1, "", "", 100, ""]),  # expires before the delay ends
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", 100, "debounce|100|k"]),  # expires within the window
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "debounce|0|k"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "debounce||k"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "debounce|5|"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "debounce|5|a\nb"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "debounce|5|" + "k" * 257]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "sequence|5|k"]),  # the policy is block or skip
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "sequence|Block|k"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "sequence|block|"]),
    # Rate keys (lua/README.md section 2.7): "rate|<count>/<period_ms>/<burst>/<cost>|<key>",
    # alone or beside a flow key (and a task name), each on a line of its own, in any order.
    *(("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", key]) for key in [
        "rate|10/1000/1|k",  # no cost
        "rate|10/1000/1/1",  # no key
        "rate|10/1000/1/1|",
        "rate||k",
        "rate|ten/1000/1/1|k",
        "rate|-1/1000/1/1|k",
        "rate|1.5/1000/1/1|k",
        "rate|10/1000/1/0|k",  # cost 0
        "rate|10/1000/2/3|k",  # cost above the burst: it could never pass
        "rate|0/1000/1/1|k",  # count 0: a job's own limit must limit (set_rate_limit lifts one)
        "rate|1000001/1000/1/1|k",
        "rate|10/0/1/1|k",  # period 0
        "rate|10/86400001/1/1|k",
        "rate|10/1000/0/1|k",  # burst 0
        "rate|10/1000/1000001/1|k",
        "rate|10/1000/1/1|a\tb",  # a control character in the key
        "rate|10/1000/1/1|" + "k" * 257,
        "rate|10/1000/1/1|k\nrate|10/1000/1/1|k",  # two rate keys
        "debounce|100|k\nrate|10/1000/0/1|k",  # a bad rate key after a good flow key
        "debounce|100|k\nrate|10/1000/1/1|",
        "throttle|100|k\nrate|10/1000/1/2|k",
        "sequence|block|k\nrate|10/1000/1/1|k\n",
        "debounce|0|k\nrate|10/1000/1/1|k",  # a bad flow key before a good rate key
        "debounce|100|k\n",
        "debounce|100|k\nthrottle|100|k",
        "Rate|10/1000/1/1|k",
        "\nrate|10/1000/1/1|k",  # an empty flow key before the newline
    ]),
    ("set_rate_limit", ["", "10/1000/1"]),
    ("set_rate_limit", ["a\nb", "10/1000/1"]),
    ("set_rate_limit", ["k" * 257, "10/1000/1"]),
    ("set_rate_limit", ["k", "10/1000"]),
    ("set_rate_limit", ["k", "10/1000/1/1"]),  # a cost is a job's, not a key's
    ("set_rate_limit", ["k", "off"]),
    ("set_rate_limit", ["k", "-1/1000/1"]),
    ("set_rate_limit", ["k", "1000001/1000/1"]),
    ("set_rate_limit", ["k", "10/0/1"]),
    ("set_rate_limit", ["k", "10/86400001/1"]),
    ("set_rate_limit", ["k", "10/1000/0"]),
    ("set_rate_limit", ["k", "10/1000/1000001"]),
    ("set_rate_limit", ["k", " 10/1000/1"]),
    ("defer_key", ["soon", RECEIPT, 1000]),
    ("defer_key", ["", "not-a-receipt", 1000]),
    ("defer_key", ["", "w|c|x|1|job", 1000]),
    ("defer_key", ["", "w|c|1|1|", 1000]),
    ("defer_key", ["", RECEIPT, -1]),
    ("defer_key", ["", RECEIPT, "soon"]),
    ("defer_key", ["", RECEIPT, "1.5"]),
    ("defer_key", ["", RECEIPT, ""]),
    ("defer_key", ["", RECEIPT, 2**40 + 1]),
    # Byte budgets (lua/README.md section 2.7): max_bytes an integer 0..2^50.
    ("set_budget", [-1]),
    ("set_budget", [2**50 + 1]),
    ("set_budget", ["1.5"]),
    ("set_budget", ["1e3"]),
    ("set_budget", ["512MiB"]),
    ("set_budget", [" 100"]),
    ("set_budget", [""]),
    # Results budgets (lua/README.md section 2, results): max_bytes an integer 0..2^50.
    ("set_result_budget", [-1]),
    ("set_result_budget", [2**50 + 1]),
    ("set_result_budget", ["1.5"]),
    ("set_result_budget", ["1e3"]),
    ("set_result_budget", ["64MiB"]),
    ("set_result_budget", [" 100"]),
    ("set_result_budget", [""]),
    # Tombstone limits (lua/README.md section 2, tombstones): max_count an integer 0..2^40.
    ("set_tombstone_limit", [-1]),
    ("set_tombstone_limit", [2**40 + 1]),
    ("set_tombstone_limit", ["1.5"]),
    ("set_tombstone_limit", ["1e3"]),
    ("set_tombstone_limit", ["10k"]),
    ("set_tombstone_limit", [" 100"]),
    ("set_tombstone_limit", [""]),
    # Indexes (lua/README.md section 2.8): a task name "task|<name>", 1..256 bytes without
    # control characters, on a line of its own, at most one; set_indexes' on 0 or 1;
    # search's filters; promote_now's ids.
    *(("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", key]) for key in [
        "task|",  # no name
        "task|" + "t" * 257,
        "task|a\tb",  # a control character in the name
        "task|a\nb",  # a second line that is no key
        "task|a\ntask|b",  # two task names
        "task|a\n",  # an empty line after it
        "\ntask|a",
        "task|a\nrate|10/1000/1/1|k\ntask|b",
        "task|a\ndebounce|0|k",  # a bad flow key beside a good task name
        "Task|a",  # not a task line: a flow key of an unknown mode
    ]),
    ("set_indexes", ["", 2]),
    ("set_indexes", ["", -1]),
    ("set_indexes", ["", ""]),
    ("set_indexes", ["", "on"]),
    ("set_indexes", ["", "1.0"]),
    ("set_indexes", ["soon", 1]),
    ("search", ["soon", "", "", "", "", "", "", "", 10]),
    ("search", ["", "done", "", "", "", "", "", "", 10]),  # not a state search answers
    ("search", ["", "Dead", "", "", "", "", "", "", 10]),
    ("search", ["", "", "t" * 257, "", "", "", "", "", 10]),
    ("search", ["", "", "a\nb", "", "", "", "", "", 10]),
    ("search", ["", "", "", "a|b", "", "", "", "", 10]),
    ("search", ["", "", "", "g" * 129, "", "", "", "", 10]),
    ("search", ["", "", "", "", "Timeout:Error", "", "", "", 10]),
    ("search", ["", "", "", "", "a\tb", "", "", "", 10]),
    ("search", ["", "ready", "", "", "TimeoutError", "", "", "", 10]),  # an error implies dead
    ("search", ["", "", "", "", "", -1, "", "", 10]),
    ("search", ["", "", "", "", "", "", 2**50 + 1, "", 10]),
    ("search", ["", "", "", "", "", "today", "", "", 10]),
    ("search", ["", "", "", "", "", "", "", "", 0]),
    ("search", ["", "", "", "", "", "", "", "", 501]),
    ("search", ["", "", "", "", "", "", "", "", ""]),
    ("search", ["", "", "task", "", "", "", "", "", 10]),  # the busy queue keeps no indexes
    ("search", ["", "dead", "", "", "", "", "", "h0:0", 10]),  # a cursor of another source
    ("search", ["", "dead", "", "", "", "", "", "dnot a cursor", 10]),
    ("search", ["", "", "", "", "", "", "", "hx:y", 10]),
    ("search", ["", "leased", "", "", "", "", "", "lx", 10]),
    ("promote_now", ["", ""]),
    ("promote_now", ["", "a\nb"]),
    ("promote_now", ["", "x" * 257]),
    ("promote_now", ["", "due", ""]),  # a bad id after a good one
    ("promote_now", ["soon", "due"]),
    ("promote_now", [""]),  # no id: a contract error
    ("sequence_skip", ["", ""]),
    ("sequence_skip", ["", "a\nb"]),
    ("sequence_skip", ["soon", "k"]),
    ("enqueue", ["", 1, "id", b"", 0, 1, "", "", "", "k"]),
    ("enqueue", ["", 1, "id", b"", 5, 1, "", "", "", "debounce|5|k"]),  # a debounced job's delay is its window
    ("groups", [-1, 10]),
    ("groups", [0, 0]),
    ("groups", [0, 1001]),
    ("groups", ["first", 10]),
    ("set_group_limit", ["a|b", 1]),
    ("set_group_limit", ["g" * 129, 1]),
    ("set_group_limit", ["", -1]),
    ("set_group_limit", ["", ""]),  # the default cap cannot be deleted: 0 lifts it
    ("set_group_limit", ["g", "x"]),
    ("set_group_limit", ["", 1_000_001]),
    ("lease", ["", "", "c", 1, 1000, 100, 1000]),
    ("lease", ["", "a|b", "c", 1, 1000, 100, 1000]),
    ("lease", ["", "w", "c d", 1, 1000, 100, 1000]),
    ("lease", ["", "w", "c" * 65, 1, 1000, 100, 1000]),
    ("lease", ["", "w", "c", -1, 1000, 100, 1000]),
    ("lease", ["", "w", "c", 1001, 1000, 100, 1000]),
    ("lease", ["", "w", "c", 1, 0, 100, 1000]),
    ("lease", ["", "w", "c", 1, 604800001, 100, 1000]),
    ("lease", ["", "w", "c", 1, 1000, 0, 1000]),
    ("lease", ["", "w", "c", 1, 1000, 100, 1000, "not-a-receipt"]),
    ("lease", ["", "w", "c", 1, 1000, 100, 1000, "w|c|x|1|id"]),
    ("lease", ["", "w", "c", 1, 1000, 100, -1]),
    ("lease", ["", "w", "c", 1, 1000, 100, 2**40 + 1]),
    ("lease", ["", "w", "c", 1, 1000, 100, ""]),
    ("lease", ["", "w", "c", 1, 1000, 100]),
    ("ack", []),
    ("ack", ["", 1000]),
    ("ack", [RECEIPT]),
    ("ack", ["", RECEIPT, RECEIPT]),
    ("ack", ["", -1, RECEIPT]),
    ("ack", ["", 2**40 + 1, RECEIPT]),
    ("ack", ["x", 1000, RECEIPT]),
    ("ack", ["", 1000, "w|c|1|1|"]),
    ("ack", ["", 1000, "w|c|1|id"]),
    ("ack", ["", 1000, *[RECEIPT] * 1001]),
    ("nack", ["", "bad", "e", "", 100, 1000]),
    ("nack", ["", RECEIPT, "e", "-3", 100, 1000]),
    ("nack", ["", RECEIPT, "e", "", 0, 1000]),
    ("nack", ["", RECEIPT, "e", "", 100, "big"]),
    ("nack", ["", RECEIPT, "x" * 65537, "", 100, 1000]),
    ("nack", ["", RECEIPT, "e", "", 100]),
    ("nack", ["", RECEIPT, "e", "", 100, 1000, "2"]),
    ("nack", ["", RECEIPT, "e", "", 100, 1000, "x"]),
    ("nack", ["", RECEIPT, "e", "", 100, 1000, "true"]),
    ("nack", ["", RECEIPT, "e", "", 100, 1000, "1", "extra"]),
    ("extend", ["", 1000]),
    ("extend", ["", 0, RECEIPT]),
    ("extend", ["", 1000, "oops"]),
    ("release", []),
    ("release", [""]),
    ("release", ["", "|||"]),
    ("release", ["x", "w|c|1|1|held"]),
    ("promote", ["", 0]),
    ("promote", ["", 1001]),
    ("promote", ["yesterday", 10]),
    ("stats", ["-1"]),
    ("dead_list", [-1, 10]),
    ("dead_list", [0, 0]),
    ("dead_list", [0, 1001]),
    ("dead_replay", [""]),
    ("dead_replay", ["x", "id"]),
    ("dead_replay", ["", *["id"] * 1001]),
    ("dead_purge", []),
    ("dead_purge", ["id"] * 1001),
    ("scrub", ["", "", 10]),
    ("scrub", ["", "a|b", 10]),
    ("scrub", ["", "w", 0]),
    ("scrub", ["", "w", 1001]),
    ("scrub", ["x", "w", 10]),
    ("service_register", ["", 0, "host", 1, "q", 60000, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "", 1, "q", 60000, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", -1, "q", 60000, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "", 60000, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "q", 999, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 0, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 1001, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "bad token", "reg"]),
    ("service_register", ["", 2, "host", 1, "q", 60000, 100, 10, "tok", "reg"]),  # key is :1, id 2
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", ""]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "not-alnum"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "r" * 17]),
    ("service_register", ["", 1, "host", 1, "q a", 60000, 100, 10, "tok", "reg"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "reg", "a,,b"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "reg", "a b"]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "reg", "t" * 201]),
    ("service_register", ["", 1, "host", 1, "q", 60000, 100, 10, "tok", "reg", "a", "extra"]),
    ("service_renew", ["", "x", "tok", "next", 60000, 10]),
    ("service_renew", ["", "1", "tok", "", 60000, 10]),
    ("service_renew", ["", "1", "tok", "next", 0, 10]),
    ("service_renew", ["", "1", "tok", "next", 60000, 101]),
    ("service_renew", ["", "1", "tok", "next", 60000, 10, "x" * 65537]),
    ("service_deregister", ["", "x", "0", "reg"]),
    ("service_deregister", ["", "1", "2", "reg"]),
    ("service_deregister", ["", "2", "0", "reg"]),  # key is :1, id 2
    ("service_deregister", ["-1", "1", "0", "reg"]),
    ("service_deregister", ["", "1", "0", ""]),
    ("service_deregister", ["", "1", "0", "a-b"]),
    ("service_stop", ["", "x", ""]),
    ("service_stop", ["", "2", ""]),  # key is :1, id 2
    ("service_stop", ["-1", "1", ""]),
    ("service_stop", ["", "1", "a-b"]),
    ("service_stop", ["", "1", "r" * 17]),
    ("get", ["x", "j", "0"]),
    ("get", ["", "", "0"]),
    ("get", ["", "a\nb", "0"]),
    ("get", ["", "x" * 257, "0"]),
    ("get", ["", "j", "2"]),
    ("cancel", ["", "", "0"]),
    ("cancel", ["", "a\nb", "0"]),
    ("cancel", ["", "x" * 257, "0"]),
    ("cancel", ["", "j", "-1"]),
    ("cancel", ["", "j", "x"]),
    ("cancel", ["x", "j", "0"]),
    ("limit", ["-1", "1000", "1"]),
    ("limit", ["1000001", "1000", "1"]),
    ("limit", ["5", "0", "1"]),
    ("limit", ["5", "86400001", "1"]),
    ("limit", ["5", "1000", "0"]),
    ("limit", ["x", "1000", "1"]),
    ("ack_result", ["", "0", "1000", "10"]),  # no receipt
    ("ack_result", ["", "0", "1000", "10", "w|c|1|1|j"]),  # a receipt without its value
    ("ack_result", ["", "0", "0", "10", "w|c|1|1|j", "v"]),
    ("ack_result", ["", "0", "1000", "0", "w|c|1|1|j", "v"]),
    ("ack_result", ["", "-1", "1000", "10", "w|c|1|1|j", "v"]),
    ("ack_result", ["", "0", "1000", "10", "not a receipt", "v"]),
    ("ack_result", ["", "0", "1000", "10", "w|c|1|1|j", "x" * 524_289]),
    ("result", ["", ""]),
    ("result", ["", "a\nb"]),
    ("result", ["x", "j"]),
    ("pause", ["x"]),
    ("pause", ["-1"]),
    ("resume", ["x"]),
    ("resume", [str(2**53 + 2)]),
    ("peek", ["x"]),
    ("peek", ["-1"]),
    ("peek", [str(2**53 + 2)]),
    ("flow_wait", ["", "", "p", "3", "", "", "1000", "", "q\tj"]),
    ("flow_wait", ["x", "w", "p", "3", "", "", "1000", "", "q\tj"]),
    ("flow_wait", ["", "w", "p", "0", "", "", "1000", "", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "9", "", "1000", "", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "a|b", "1000", "", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "0", "", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "", "no tab"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "", "q{x}\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "", "q\ta\nb"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "", "q\tj", ""]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "report", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "task|", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", "task|a\nb", "q\tj"]),
    ("flow_wait", ["", "w", "p", "3", "", "", "1000", ""]),  # waits for nothing
    ("flow_done", ["", "w", "maybe", "1000"]),
    ("flow_done", ["", "", "fail", "1000"]),
    ("flow_done", ["x", "w", "fail", "1000"]),
    ("flow_done", ["", "w", "fail", "0"]),
    ("flow_done", ["", "w", "fail", "1000", "q\tj", "meh"]),
    ("flow_done", ["", "w", "fail", "1000", "nope", "ok"]),
    ("flow_done", ["", "w", "fail", "1000", "q\tj"]),  # a job without its ending
    ("flow_record", ["x", "f", "{}", "1000"]),
    ("flow_record", ["", "", "{}", "1000"]),
    ("flow_record", ["", "a\nb", "{}", "1000"]),
    ("flow_record", ["", "f", "", "1000"]),
    ("flow_record", ["", "f", "{}", "0"]),
    ("flow_record", ["", "f", "{}", str(2**40 + 1)]),
    ("flow_record", ["", "f", "x" * 8_388_609, "1000"]),
    ("flow_show", ["x", "f"]),
    ("flow_show", ["", ""]),
    ("flow_show", ["", "a\tb" * 100]),
    ("browse", ["x", "ready", 0, 10]),
    ("browse", ["", "dead", 0, 10]),  # dead letters: dead_list
    ("browse", ["", "", 0, 10]),
    ("browse", ["", "ready", -1, 10]),
    ("browse", ["", "ready", 2**31 + 1, 10]),
    ("browse", ["", "ready", "first", 10]),
    ("browse", ["", "ready", 0, 0]),
    ("browse", ["", "ready", 0, 501]),
    ("browse", ["", "ready", 0, "1.5"]),
    ("progress", ["x", "w|c|1|1|held", "{}"]),
    ("progress", ["", "not a receipt", "{}"]),
    ("progress", ["", "w|c|1|1|held", "x" * 4097]),
    ("progress_show", [""]),
    ("progress_show", ["held", "a\nb"]),
    ("set_events", ["-1"]),
    ("set_events", ["10000001"]),
    ("set_events", ["ten"]),
    ("set_events", ["1.5"]),
    ("step", ["x", "w|c|1|1|held", 1000, "s", b""]),
    ("step", ["", "not a receipt", 1000, "s", b""]),
    ("step", ["", "w|c|1|1|held", 0, "s", b""]),
    ("step", ["", "w|c|1|1|held", 1000, "", b""]),
    ("step", ["", "w|c|1|1|held", 1000, "a\tb", b""]),
    ("step", ["", "w|c|1|1|held", 1000, "x" * 201, b""]),
    ("step", ["", "w|c|1|1|held", 1000, "s", b"x" * 524_289]),
    ("park", ["", "w|c|1|1|held", "nap", "s", 10, 1000]),
    ("park", ["", "w|c|1|1|held", "sleep", "s", -1, 1000]),
    ("park", ["", "w|c|1|1|held", "wait", "s", 10, 604_800_001]),
    ("park", ["", "w|c|1|1|held", "wait", "", 10, 1000]),
    ("park", ["", "not a receipt", "wait", "s", 10, 1000]),
    ("signal", ["", "", "go", b""]),
    ("signal", ["", "held", "", b""]),
    ("signal", ["", "held", "go", b"x" * 524_289]),
    ("signal", ["soon", "held", "go", b""]),
    ("signal", ["", "held", "go", b"t"]),
    ("steps", ["", ""]),
    ("steps", ["", "a\nb"]),
    ("steps", ["now", "held"]),
]


#: Also on the async driver (conftest.Blocking).
ASYNC_TOO = True

@pytest.mark.parametrize(("script", "args"), MALFORMED, ids=[f"{s}-{i}" for i, (s, _) in enumerate(MALFORMED)])
def test_malformed_arguments_are_rejected_with_pq_badarg_and_nothing_written(
    q: Queue, r: redis.Redis, script: str, args: list[Any]
) -> None:
    busy_queue(q)
    services = Services(r, namespace="ns")
    services.register(["q"])
    keys = services.keys.of(1) if script.startswith("service_") else q.spec.keys
    before = dump_all(r)
    code = "PQ_BADARG" if argv_rule(script).allows(len(args)) else "PQ_CONTRACT"
    with pytest.raises(redis.ResponseError, match=rf"^{code} ") as info:
        transport_of(q).run(script, keys, args)
    assert isinstance(map_redis_error(info.value), InvalidArgument)
    assert dump_all(r) == before


def test_every_script_has_malformed_argument_cases() -> None:
    assert {s for s, _ in MALFORMED} == set(SCRIPT_KEYS)


#: The texts of a few of the rate-key refusals above (lua/include/control.lua): each names
#: the part that is wrong, and enqueue adds the job's place in the call.
RATE_KEY_ERRORS = {
    "rate|10/1000/1|k": 'a rate key must be "rate|<count>/<period_ms>/<burst>/<cost>|<key>", got "rate|10/1000/1|k"',
    "rate|10/1000/1/0|k": "a job's cost must be in [1, burst] (1): more could never pass, got 0",
    "rate|10/1000/2/3|k": "a job's cost must be in [1, burst] (2): more could never pass, got 3",
    "rate|0/1000/1/1|k": "a rate limit's count must be in [1, 1000000], got 0",
    "rate|10/0/1/1|k": "a rate limit's period_ms must be in [1, 86400000], got 0",
    "rate|10/1000/0/1|k": "a rate limit's burst must be in [1, 1000000], got 0",
    "rate|10/1000/1/1|a\tb": "key must be 1..256 bytes without control characters",
    "debounce|100|k\nrate|10/1000/0/1|k": "a rate limit's burst must be in [1, 1000000], got 0",
    "debounce|0|k\nrate|10/1000/1/1|k": "debounce window_ms must be in [1, 1099511627776], got 0",
}


@pytest.mark.parametrize("key", sorted(RATE_KEY_ERRORS))
def test_a_bad_rate_key_is_refused_with_the_part_that_is_wrong(q: Queue, r: redis.Redis, key: str) -> None:
    good = ["ok", b"", 0, 1, "", "", "", "rate|10/1000/1/1|k"]
    with pytest.raises(redis.ResponseError) as info:
        transport_of(q).run("enqueue", q.spec.keys, [T0, 2, *good, "id", b"", 0, 1, "", "", "", key])
    assert str(info.value) == f"PQ_BADARG {RATE_KEY_ERRORS[key]}, job 2"
    assert r.keys("*") == []


def test_defer_key_of_a_job_without_a_rate_key_is_refused_and_writes_nothing(q: Queue, r: redis.Redis) -> None:
    handles = busy_queue(q)
    q.enqueue(b"", job_id="rated", rate_key="api", rate_limit="10/s", now_ms=T0)  # the queue has rate keys
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"^PQ_BADARG job held has no rate key to defer$"):
        transport_of(q).run("defer_key", q.spec.keys, [T0 + 60, handles["held"].receipt, 1000])
    with pytest.raises(InvalidArgument):
        q.defer_key(handles["held"], 1000, now_ms=T0 + 60)
    assert dump_all(r) == before


#: The rate-limit scripts' calls on a queue with a leased job of a rate key (and one
#: deferred behind it), and the keys each must prove before it writes.
RATE_WRONG_TYPE_CASES = [
    ("set_rate_limit", "keyed", planted) for planted in ("string", "list", "set", "zset", "stream")
] + [
    ("defer_key", role, planted)
    for role, right in (("leased", "zset"), ("keyed", "hash"), ("windows", "zset"))
    for planted in ("string", "list", "hash", "set", "zset", "stream")
    if planted != right
] + [
    ("lease_rated", role, planted)
    for role, right in (("keyed", "hash"), ("windows", "zset"))
    for planted in ("string", "list", "hash", "set", "zset", "stream")
    if planted != right
]


@pytest.mark.parametrize(("variant", "role", "planted"), RATE_WRONG_TYPE_CASES)
@pytest.mark.parametrize("fair", [False, True])
def test_a_rate_script_finds_a_key_of_the_wrong_type_and_writes_nothing(
    r: redis.Redis, variant: str, role: str, planted: str, fair: bool
) -> None:
    q = Queue("q", r)
    g = {"group": "g"} if fair else {}
    q.enqueue_many([NewJob(b"", job_id=f"r{i}", rate_key="api", rate_limit="1/m", **g) for i in range(3)], now_ms=T0)
    (held,) = q.lease(now_ms=T0)  # r0 takes the permit; r1 and r2 wait in READY
    calls = {
        "set_rate_limit": ("set_rate_limit", ["api", "5/1000/1"]),
        "defer_key": ("defer_key", [T0, held.receipt, 5000]),
        "lease_rated": ("lease", [T0 + 1, "w", "c2", 2, 1000, 100, 1000]),  # defers r1 and r2
    }
    script, args = calls[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args)
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


@pytest.mark.parametrize("call", [
    lambda q: q.set_rate_limit("", "10/s"),
    lambda q: q.set_rate_limit("a\nb", "10/s"),
    lambda q: q.set_rate_limit("k", "ten a second"),
    lambda q: q.set_rate_limit("k", "10/fortnight"),
    lambda q: q.set_rate_limit("k", "-1/s"),
    lambda q: q.set_rate_limit("k", 10),
    lambda q: q.enqueue(b"x", rate_key="k"),  # a key without its limit
    lambda q: q.enqueue(b"x", rate_limit="10/s"),  # a limit without its key
    lambda q: q.enqueue(b"x", rate_key="k", rate_limit="10/s", cost=0),
    lambda q: q.enqueue(b"x", rate_key="k", rate_limit="10/s", cost=2),  # above the burst, 1
    lambda q: q.enqueue(b"x", rate_key="a\tb", rate_limit="10/s"),
    lambda q: q.enqueue(b"x", rate_key="k", rate_limit="0/s"),
    lambda q: q.enqueue(b"x", cost=2),
], ids=range(13))
def test_bad_rate_arguments_are_rejected_in_python_before_anything_is_sent(
    q: Queue, r: redis.Redis, call: Any
) -> None:
    with pytest.raises(InvalidArgument):
        call(q)
    assert r.keys("*") == []


#: The byte-budget calls on a queue with a budget and a sized job leased (and one ready),
#: and the keys each must prove before it writes: set_budget's `counters`; a sized send's
#: `keyed` (its size) and `counters` (the sum); an ack's `keyed`, which it reads the size
#: from.
BUDGET_WRONG_TYPE_CASES = [
    ("set_budget", "counters", planted) for planted in ("string", "list", "set", "zset", "stream")
] + [
    (variant, "keyed", planted)
    for variant in ("enqueue_sized", "ack_sized")
    for planted in ("string", "list", "set", "zset", "stream")
]


@pytest.mark.parametrize(("variant", "role", "planted"), BUDGET_WRONG_TYPE_CASES)
def test_a_budget_script_finds_a_key_of_the_wrong_type_and_writes_nothing(
    r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    q = Queue("q", r)
    q.set_budget(1000)
    q.enqueue_many([NewJob(b"abc", job_id="b0"), NewJob(b"de", job_id="b1")], now_ms=T0)
    (held,) = q.lease(now_ms=T0)
    calls = {
        "set_budget": ("set_budget", [500]),
        "enqueue_sized": ("enqueue", [T0, 1, "b2", b"fgh", 0, 1, "", "", "", ""]),
        "ack_sized": ("ack", [T0, 1000, held.receipt]),
    }
    script, args = calls[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args)
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


def test_a_corrupt_job_size_is_reported_and_nothing_written(q: Queue, r: redis.Redis) -> None:
    q.set_budget(1000)
    q.enqueue(b"abc", job_id="b0", now_ms=T0)
    (held,) = q.lease(now_ms=T0)
    r.hset(q.spec.keys.keyed, "b:b0", "three")
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"^PQ_CORRUPT unparsable job size in "):
        transport_of(q).run("ack", q.spec.keys, [T0, 1000, held.receipt])
    assert dump_all(r) == before


@pytest.mark.parametrize("max_bytes", [-1, 2**50 + 1, 1.5, "1MiB", True, math.nan], ids=repr)
def test_a_bad_budget_is_rejected_in_python_before_anything_is_sent(q: Queue, r: redis.Redis, max_bytes: Any) -> None:
    with pytest.raises(InvalidArgument):
        q.set_budget(max_bytes)
    assert r.keys("*") == []


#: The results-budget calls on a queue with a results budget, a sized result kept and a
#: job leased, and the keys each must prove before it writes: set_result_budget's
#: `counters`; an ack_result's `keyed`, which it reads the sizes from (and writes them to).
RESULT_BUDGET_WRONG_TYPE_CASES = [
    (variant, role, planted)
    for variant, role in (("set_result_budget", "counters"), ("ack_result_sized", "keyed"))
    for planted in ("string", "list", "set", "zset", "stream")
]


def result_budget_queue(r: redis.Redis) -> tuple[Queue, Job]:
    """Queue "q" with a results budget of 1000 bytes, the sized result of "k0" (expired
    at T0 + 10) and "k1" leased."""
    q = Queue("q", r)
    q.set_result_budget(1000)
    q.enqueue_many([NewJob(b"", job_id="k0"), NewJob(b"", job_id="k1")], now_ms=T0)
    first, held = q.lease(count=2, now_ms=T0)
    q.ack_result(first, b"abc", result_ttl_ms=10, now_ms=T0)
    return q, held


@pytest.mark.parametrize(("variant", "role", "planted"), RESULT_BUDGET_WRONG_TYPE_CASES)
def test_a_results_budget_script_finds_a_key_of_the_wrong_type_and_writes_nothing(
    r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    q, held = result_budget_queue(r)
    calls = {
        "set_result_budget": ("set_result_budget", [500]),
        "ack_result_sized": ("ack_result", [T0, 1000, 60_000, 100, held.receipt, b"bde"]),
    }
    script, args = calls[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args)
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


@pytest.mark.parametrize("corrupt", ["expired", "oldest", "sum"])
def test_a_corrupt_result_size_is_reported_and_nothing_written(r: redis.Redis, corrupt: str) -> None:
    """A size ack_result reads that does not parse: of a result it trims as expired, of
    one it would trim to stay within the budget, or the counter `result_bytes`."""
    q, held = result_budget_queue(r)
    now = T0 + 1 if corrupt == "oldest" else T0 + 100  # "k0" expired, or not yet
    if corrupt == "oldest":
        q.set_result_budget(20)  # a new result of 18 bytes takes the sum past it
    if corrupt == "sum":
        r.hset(q.spec.keys.counters, "result_bytes", "many")
    else:
        r.hset(q.spec.keys.keyed, "rb:k0", "three")
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"^PQ_CORRUPT unparsable result size in "):
        transport_of(q).run("ack_result", q.spec.keys, [now, 1000, 60_000, 100, held.receipt, b"bde"])
    assert dump_all(r) == before


@pytest.mark.parametrize("max_bytes", [-1, 2**50 + 1, 1.5, "1MiB", True, math.nan], ids=repr)
def test_a_bad_results_budget_is_rejected_in_python_before_anything_is_sent(
    q: Queue, r: redis.Redis, max_bytes: Any
) -> None:
    with pytest.raises(InvalidArgument):
        q.set_result_budget(max_bytes)
    assert r.keys("*") == []


#: The tombstone-limit calls on a queue with a limit of 1 and a tombstone kept (so each
#: call below takes `done` past it and trims the kept one, which expires first), and the keys each must prove before it
#: writes: set_tombstone_limit's `counters`; `done`, which every writer of tombstones
#: counts (ZCARD) and trims (ZREMRANGEBYRANK) under a limit.
TOMBSTONE_LIMIT_CALLS: dict[str, Any] = {
    "set_tombstone_limit": ("set_tombstone_limit", lambda h: [5]),
    "ack_limited": ("ack", lambda h: [T0, 600_000, h[0].receipt]),
    "ack_result_limited": ("ack_result", lambda h: [T0, 600_000, 60_000, 100, h[1].receipt, b"bde"]),
    "ack_and_lease_limited": ("lease", lambda h: [T0, "w", "c9", 1, 1000, 100, 600_000, h[2].receipt]),
    "cancel_limited": ("cancel", lambda h: [T0, "t4", 600_000]),
}
TOMBSTONE_LIMIT_WRONG_TYPE_CASES = [
    (variant, "counters" if variant == "set_tombstone_limit" else "done", planted)
    for variant in TOMBSTONE_LIMIT_CALLS
    for planted in ("string", "list", "hash", "set", "zset", "stream")
    if planted != ("hash" if variant == "set_tombstone_limit" else "zset")
]


def tombstone_limit_queue(r: redis.Redis) -> tuple[Queue, list[Job]]:
    """Queue "q" with a tombstone limit of 1, the tombstone of "t0" kept, "t1", "t2" and
    "t3" leased (in that order) and "t4" ready."""
    q = Queue("q", r)
    q.set_tombstone_limit(1)
    q.enqueue_many([NewJob(b"", job_id=f"t{i}") for i in range(5)], now_ms=T0)
    first, *held = q.lease(count=4, now_ms=T0)
    q.ack(first, now_ms=T0)
    return q, held


@pytest.mark.parametrize("variant", list(TOMBSTONE_LIMIT_CALLS))
def test_each_tombstone_limit_call_succeeds_and_keeps_the_limit(r: redis.Redis, variant: str) -> None:
    # Guards the table below: each call is valid, and past the limit it trims `done`.
    q, held = tombstone_limit_queue(r)
    script, args = TOMBSTONE_LIMIT_CALLS[variant]
    transport_of(q).run(script, q.spec.keys, args(held))
    if variant != "set_tombstone_limit":
        assert r.zcard(q.spec.keys.done) == 1 and r.zscore(q.spec.keys.done, "t0") is None


@pytest.mark.parametrize(("variant", "role", "planted"), TOMBSTONE_LIMIT_WRONG_TYPE_CASES)
def test_a_tombstone_limit_script_finds_a_key_of_the_wrong_type_and_writes_nothing(
    r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    q, held = tombstone_limit_queue(r)
    script, args = TOMBSTONE_LIMIT_CALLS[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args(held))
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


@pytest.mark.parametrize("max_count", [-1, 2**40 + 1, 1.5, "10", True, math.nan], ids=repr)
def test_a_bad_tombstone_limit_is_rejected_in_python_before_anything_is_sent(
    q: Queue, r: redis.Redis, max_count: Any
) -> None:
    with pytest.raises(InvalidArgument):
        q.set_tombstone_limit(max_count)
    assert r.keys("*") == []


#: A value of each Redis type, planted where another type belongs.
PLANTERS = {
    "string": lambda r, k: r.set(k, "planted"),
    "list": lambda r, k: r.rpush(k, "planted"),
    "hash": lambda r, k: r.hset(k, "planted", "1"),
    "set": lambda r, k: r.sadd(k, "planted"),
    "zset": lambda r, k: r.zadd(k, {"planted": 1}),
    "stream": lambda r, k: r.xadd(k, {"planted": "1"}),
}
ROLE_TYPES = {
    "jobs": "hash", "ready": "list", "scheduled": "zset", "leased": "zset", "owners": "zset",
    "dead": "zset", "errors": "hash", "counters": "hash", "wake": "zset", "done": "zset",
    "results": "hash", "result_expiry": "zset", "finished": "stream",
    "meta": "hash", "gready": "zset", "ring": "zset", "groups": "hash", "fwait": "zset", "fpending": "zset",
    "events": "stream", "steps": "hash", "waiting": "zset",
    "keyed": "hash", "windows": "zset", "expires": "zset", "expired": "zset", "sequenced": "zset",
    "index": "zset",
}
#: The fair-scheduling keys (lua/README.md section 2.1).
FAIR_ROLES = {"meta", "gready", "ring", "groups"}
WRONG_TYPE_CASES = [
    (variant, role, planted)
    for variant, script in {
        "enqueue": "enqueue", "lease": "lease", "ack_and_lease": "lease", "ack": "ack",
        "nack_to_scheduled": "nack", "nack_to_dead": "nack", "nack_final": "nack", "extend": "extend",
        "release": "release",
        "promote": "promote", "stats": "stats", "dead_list": "dead_list", "dead_replay": "dead_replay",
        "dead_purge": "dead_purge", "ack_result": "ack_result", "result": "result",
    }.items()
    for role in SCRIPT_KEYS[script]
    for planted in PLANTERS
    if planted != ROLE_TYPES[role]
]


#: The index calls on a queue that keeps indexes, with listed jobs ("i0" leased, "i1"
#: ready, "i2" scheduled, "i3" dead), and the keys each must prove before it writes (or,
#: read only, reads): set_indexes' `counters`; an indexed send's `keyed` (its entry) and
#: `index` (its members); the end of a listed job (ack, cancel, dead_purge): `keyed`,
#: which it reads the entry from, and `index`, which it removes the members from;
#: promote_now's keys; and every key search reads.
INDEX_CALLS: dict[str, tuple[str, Any]] = {
    "set_indexes": ("set_indexes", lambda held: [T0, 0]),
    "enqueue_indexed": ("enqueue", lambda held: [T0, 1, "i9", b"x", 0, 1, "", "g", "", "task|t"]),
    "ack_indexed": ("ack", lambda held: [T0, 1000, held.receipt]),
    "cancel_indexed": ("cancel", lambda held: [T0, "i1", 1000]),
    "dead_purge_indexed": ("dead_purge", lambda held: ["i3"]),
    "promote_now": ("promote_now", lambda held: [T0, "i2"]),
    "search_task": ("search", lambda held: [T0, "", "t", "", "", "", "", "", 10]),
    "search_dead": ("search", lambda held: [T0, "dead", "", "", "", "", "", "", 10]),
    "search_any": ("search", lambda held: [T0, "", "", "", "", "", "", "", 10]),
}
INDEX_WRONG_TYPE_CASES = [
    (variant, role, planted)
    for variant, roles in {
        "set_indexes": ("counters",),
        "enqueue_indexed": ("keyed", "index"),
        "ack_indexed": ("keyed", "index"),
        "cancel_indexed": ("keyed", "index"),
        "dead_purge_indexed": ("keyed", "index"),
        "promote_now": ("jobs", "scheduled", "waiting", "wake"),
        "search_task": ("jobs", "counters", "index", "keyed", "dead", "scheduled", "waiting", "leased"),
        "search_dead": ("jobs", "dead", "errors", "keyed", "scheduled", "waiting"),
        "search_any": ("jobs",),
    }.items()
    for role in roles
    for planted in ("string", "list", "hash", "set", "zset", "stream")
    if planted != ROLE_TYPES[role]
]


def indexed_queue(q: Queue) -> Job:
    """``q`` keeping indexes, with listed jobs in four states; answers i0's lease."""
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"x", job_id=f"i{i}", task="t", group="g", delay_ms=10_000 if i == 2 else 0,
                           max_attempts=1) for i in (0, 3, 1, 2)], now_ms=T0)
    held, dying = q.lease(count=2, now_ms=T0)
    assert (held.id, dying.id) == ("i0", "i3")
    q.nack(dying, "boom", now_ms=T0)
    return held


@pytest.mark.parametrize(("variant", "role", "planted"), INDEX_WRONG_TYPE_CASES)
def test_an_index_script_finds_a_key_of_the_wrong_type_and_writes_nothing(
    r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    q = Queue("q", r)
    held = indexed_queue(q)
    script, args = INDEX_CALLS[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args(held))
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


@pytest.mark.parametrize("variant", sorted(INDEX_CALLS))
def test_each_index_call_succeeds_on_the_indexed_queue(r: redis.Redis, variant: str) -> None:
    # Guards the table above: each call is valid, so the errors come from the planted key.
    q = Queue("q", r)
    held = indexed_queue(q)
    script, args = INDEX_CALLS[variant]
    transport_of(q).run(script, q.spec.keys, args(held))


@pytest.mark.parametrize("entry", ["garbage", "12\nno task line", "\ng\nt", "x1\ng\nt"])
def test_a_corrupt_index_entry_is_reported_and_nothing_written(q: Queue, r: redis.Redis, entry: str) -> None:
    held = indexed_queue(q)
    r.hset(q.spec.keys.keyed, "x:i0", entry)
    r.hset(q.spec.keys.keyed, "x:i1", entry)
    before = dump_all(r)
    for script, args in (("ack", [T0, 1000, held.receipt]), ("cancel", [T0, "i1", 1000])):
        with pytest.raises(redis.ResponseError, match=r"^PQ_CORRUPT unparsable index entry in "):
            transport_of(q).run(script, q.spec.keys, args)
        assert dump_all(r) == before


@pytest.mark.parametrize("call", [
    lambda q: q.set_indexes(1),
    lambda q: q.set_indexes("yes"),
    lambda q: q.search(state="done"),
    lambda q: q.search(task=""),
    lambda q: q.search(task="a\nb"),
    lambda q: q.search(group="a|b"),
    lambda q: q.search(error="Timeout: x"),
    lambda q: q.search(error=""),
    lambda q: q.search(state="ready", error="TimeoutError"),
    lambda q: q.search(since_ms=-1),
    lambda q: q.search(until_ms=2**50 + 1),
    lambda q: q.search(count=0),
    lambda q: q.search(count=501),
    lambda q: q.search(cursor=5),
    lambda q: q.search(scan_most=0),
    lambda q: q.promote_now(["a\nb"]),
    lambda q: q.promote_now([""]),
    lambda q: q.enqueue(b"x", task=""),
    lambda q: q.enqueue(b"x", task="t" * 257),
    lambda q: q.enqueue(b"x", task="a\tb"),
    lambda q: q.enqueue_many([NewJob(b"x", task="a\nb")]),
], ids=lambda c: "")
def test_bad_index_arguments_are_rejected_in_python_before_anything_is_sent(
    q: Queue, r: redis.Redis, call: Any
) -> None:
    with pytest.raises(InvalidArgument):
        call(q)
    assert r.keys("*") == []


#: On a queue without groups or priorities (busy_queue), the fair-scheduling keys a variant
#: reads: the meta of the jobs it ends or moves (one HMGET), and stats' counts. An ack (and
#: ack-and-lease) reads meta only when `counters` says the queue is fair (ack_settings).
FAIR_READ = {
    (variant, role) for variant in ("nack_to_scheduled", "nack_to_dead", "nack_final",
                                    "release", "promote", "dead_replay", "dead_purge") for role in ("meta",)
} | {("stats", "gready"), ("stats", "ring")}
#: On a fair queue (busy_queue(fair=True)), the fair-scheduling keys a variant does not
#: touch on its branch.
FAIR_UNTOUCHED: set[tuple[str, str]] = set()
#: Keys an ack touches only when it gives a parked group its slot back: the wake marker.
PLAIN_UNTOUCHED = {("ack", "wake"), ("ack_result", "wake")}
#: On a fair queue, what a variant touches beyond UNTOUCHED: a fair lease and a nack that
#: ends a grouped job's lease prove `wake` (they may raise it); and what it does not:
#: stats reads a record only for the head of the `ready` list, which is empty there.
FAIR_TOUCHED = {("ack_and_lease", "wake"), ("nack_to_dead", "wake"), ("nack_final", "wake")}
FAIR_MODE_UNTOUCHED = {("stats", "jobs")}


#: The durable-step keys (lua/README.md section 2.6): a queue without step data has no
#: `steps` flag, and only `stats` reads `waiting` there (test_steps.py plants them on a
#: queue with step data).
STEP_ROLES = {"steps", "waiting"}
STEP_READ = {("stats", "waiting")}
#: The flow-control keys (lua/README.md section 2.7): the busy queue has no keyed job and
#: no expiry, so no variant touches them (test_flow_control.py plants them where it does);
#: nor does it keep indexes (section 2.8: INDEX_WRONG_TYPE_CASES plants `index` where one
#: is written).
CONTROL_ROLES = {"keyed", "windows", "expires", "expired", "sequenced", "index"}
CONTROL_READ = {("stats", "sequenced")}


def untouched(variant: str, role: str, fair: bool) -> bool:
    """Whether ``variant`` leaves key ``role`` alone on the busy (or busy fair) queue."""
    if role in STEP_ROLES:
        return (variant, role) not in STEP_READ
    if role in CONTROL_ROLES:
        return (variant, role) not in CONTROL_READ
    if role in FAIR_ROLES:
        return (variant, role) in FAIR_UNTOUCHED if fair else (variant, role) not in FAIR_READ
    if fair:
        return (variant, role) in (UNTOUCHED - FAIR_TOUCHED) | FAIR_MODE_UNTOUCHED
    return (variant, role) in UNTOUCHED | PLAIN_UNTOUCHED


#: Keys a variant takes but, by design, does not touch on its branch: a busy ack-and-lease
#: raises no wake marker, a lease that acks nothing leaves the tombstones alone, and each
#: nack branch uses only its own destination keys.
UNTOUCHED = {
    ("ack_and_lease", "wake"),
    ("nack_to_dead", "scheduled"),
    ("nack_to_dead", "wake"),
    ("nack_to_scheduled", "dead"),
    ("nack_to_scheduled", "errors"),
    ("nack_to_scheduled", "finished"),
    ("nack_final", "scheduled"),
    ("nack_final", "wake"),
    # result of an id that is neither a job nor a kept result reads no more than it must.
    ("result", "dead"),
    ("result", "errors"),
    ("result", "results"),
    # An ack and a purge write `scheduled` (and a purge `wake`) only when a sequence's head
    # hands its key on (test_flow_control.py plants them where one does).
    ("ack", "scheduled"),
    ("ack_result", "scheduled"),
    ("dead_purge", "scheduled"),
    ("dead_purge", "wake"),
}


@pytest.mark.parametrize(("variant", "role", "planted"), WRONG_TYPE_CASES)
def test_a_key_of_the_wrong_type_is_an_error_and_every_key_stays_byte_identical(
    q: Queue, r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    check_wrong_type(q, r, variant, role, planted, fair=False)


@pytest.mark.parametrize(("variant", "role", "planted"), WRONG_TYPE_CASES)
def test_on_a_fair_queue_a_key_of_the_wrong_type_is_an_error_and_every_key_stays_byte_identical(
    r: redis.Redis, variant: str, role: str, planted: str
) -> None:
    # The same table on a queue with groups and priorities (the scripts' fair paths),
    # with the sync driver only: the scripts do not depend on the driver.
    check_wrong_type(Queue("q", r), r, variant, role, planted, fair=True)


def check_wrong_type(q: Queue, r: redis.Redis, variant: str, role: str, planted: str, *, fair: bool) -> None:
    """Plant a value of type ``planted`` at ``role``, run ``variant`` on the busy queue:
    WRONGTYPE and every key byte-identical, unless the variant leaves that key alone."""
    handles = busy_queue(q, fair)
    script, args = calls_touching_every_key(q, handles)[variant]
    key = q.spec.keys.role(role)
    r.delete(key)
    PLANTERS[planted](r, key)
    before = dump_all(r)
    if untouched(variant, role, fair):
        transport_of(q).run(script, q.spec.keys, args)
        assert r.dump(key) == before[key.encode()]
        return
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE") as info:
        transport_of(q).run(script, q.spec.keys, args)
    assert isinstance(map_redis_error(info.value), WrongTypeError)
    assert dump_all(r) == before


@pytest.mark.parametrize("variant", ["enqueue", "lease", "ack_and_lease", "ack", "nack_to_scheduled", "nack_to_dead",
                                     "nack_final", "extend", "release", "promote", "stats", "dead_list", "dead_replay",
                                     "dead_purge"])
@pytest.mark.parametrize("fair", [False, True])
def test_each_variant_succeeds_on_the_busy_queue(q: Queue, variant: str, fair: bool) -> None:
    # Guards the table above: each variant is a valid call, so the errors come from the planted key.
    script, args = calls_touching_every_key(q, busy_queue(q, fair))[variant]
    transport_of(q).run(script, q.spec.keys, args)


def test_the_driver_maps_a_planted_key_to_wrong_type_error(q: Queue, r: redis.Redis) -> None:
    r.set(q.spec.keys.ready, "not a list")
    with pytest.raises(WrongTypeError, match="ready"):
        q.enqueue(b"x")
    assert r.get(q.spec.keys.ready) == b"not a list" and r.hlen(q.spec.keys.jobs) == 0


def test_a_corrupt_job_record_is_reported_and_nothing_written(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="j", now_ms=T0)
    r.hset(q.spec.keys.jobs, "j", "garbage")
    before = dump_all(r)
    with pytest.raises(Exception, match="PQ_CORRUPT"):
        q.lease(now_ms=T0)
    assert dump_all(r) == before


BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, 2**64, True, "5", 1.0, None]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_bad_numbers_are_rejected_in_python_before_anything_is_sent(q: Queue, r: redis.Redis, value: Any) -> None:
    q.enqueue(b"x", job_id="j", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    before = dump_all(r)
    attempts = [
        lambda: q.enqueue(b"x", delay_ms=value),
        lambda: q.enqueue(b"x", max_attempts=value if value is not None else 0),
        lambda: q.lease(lease_ms=value),
        lambda: q.lease(count=value),
        lambda: q.extend([job], value),
        lambda: q.nack(job, delay_ms=value if value is not None else -1),
        lambda: q.nack(job, backoff_base_ms=value),
        lambda: q.promote(limit=value),
        lambda: q.dead_list(limit=value),
        lambda: q.stats(now_ms=value if value is not None else -1),
        lambda: q.ack(job, now_ms=value if value is not None else -1),
        lambda: Queue("q", r, keep_done_ms=value if value is not None else -1),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgument):
            attempt()
        with pytest.raises(ValueError):  # InvalidArgument is a ValueError
            attempt()
    assert dump_all(r) == before


@pytest.mark.parametrize("job_id", ["", "a\nb", "tab\there", "x" * 257, "é" * 129, "\x00", 5, b"bytes"])
def test_bad_job_ids_are_rejected_in_python(q: Queue, r: redis.Redis, job_id: Any) -> None:
    with pytest.raises(InvalidArgument):
        q.enqueue(b"x", job_id=job_id)
    with pytest.raises(InvalidArgument):
        q.enqueue_many([NewJob(b"ok", job_id="fine"), NewJob(b"x", job_id=job_id)])
    assert r.keys("*") == []


@pytest.mark.parametrize("job_id", ["{braces}", "}", "a|b|c", "order:123", "x" * 256, "ünïcødé", "sp ace"])
def test_unusual_but_valid_ids_work_through_the_whole_lifecycle(q: Queue, job_id: str) -> None:
    assert q.enqueue(b"x", job_id=job_id, now_ms=T0).added
    (job,) = q.lease(now_ms=T0)
    assert job.id == job_id
    assert q.ack(job)


def test_non_bytes_payloads_and_non_jobs_are_rejected(q: Queue, r: redis.Redis) -> None:
    with pytest.raises(InvalidArgument):
        q.enqueue({"a": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        q.ack("receipt")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        q.ack_many([])
    forged = Job("j", "q", b"", 1, 1, 1, 0, "not a receipt")
    with pytest.raises(InvalidArgument):
        q.ack(forged)
    assert r.keys("*") == []


@pytest.mark.parametrize("name", ["", "a{b", "b}", "with space", "x" * 129, "tab\t"])
def test_bad_queue_names_and_prefixes_are_rejected(r: redis.Redis, name: str) -> None:
    with pytest.raises(InvalidArgument):
        Queue(name, r)
    with pytest.raises(InvalidArgument):
        Queue("ok", r, prefix=name)
    with pytest.raises(InvalidArgument):
        Queue("ok", r, owner=name or "a|b")
