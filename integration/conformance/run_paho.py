#!/usr/bin/env python3
"""Run the Eclipse paho.mqtt.testing interoperability *client* suites
(client_test.py = MQTT 3.1.1, client_test5.py = MQTT 5) against a broker and
record pass/fail per test.

Why a wrapper: upstream client_test.py hands its own -h/-p options on to
unittest.main(), which rejects them, so it can only target localhost:1883.
This wrapper imports the suite module, sets the same module globals that the
suite's __main__ block sets (host, port, topics, ...), and runs it with a
result collector. Nothing in the suite is modified. Standard library only.

Usage:
  run_paho.py --paho-dir DIR --suite v311|v5 --port N [--host 127.0.0.1]
              [--label NAME] [--json OUT.json] [--per-test-timeout S]
              [--isolate] [--known-failures FILE] [test ...]
DIR is the path where the paho.mqtt.testing checkout lives (or set the
environment variable PAHO_TESTING_DIR).

With --isolate, --port may list several ports (N,M,...), one per broker: the
tests then run that many at a time, each on a broker no other test is using
(the suite's tests share client ids and topics, so two must never share a
broker at once). --known-failures names a file of "suite test_name  reason"
lines: those failures are reported as known and do not fail the run; any
other failure does, and a known failure that passes is reported (XPASS).
"""
import argparse
import json
import os
import signal
import sys
import time
import traceback
import unittest

SUITES = {"v311": "client_test", "v5": "client_test5"}


class TestTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeout("per-test timeout hit")


class Collector(unittest.TextTestResult):
    def __init__(self, *a, per_test_timeout=120, **kw):
        super().__init__(*a, **kw)
        self.per_test_timeout = per_test_timeout
        self.records = {}
        self._t0 = {}

    def _name(self, test):
        return getattr(test, "_testMethodName", str(test))

    def startTest(self, test):
        self._t0[self._name(test)] = time.monotonic()
        signal.alarm(self.per_test_timeout)
        super().startTest(test)

    def stopTest(self, test):
        signal.alarm(0)
        n = self._name(test)
        if n in self.records:
            self.records[n]["seconds"] = round(time.monotonic() - self._t0.get(n, time.monotonic()), 2)
        super().stopTest(test)

    def _rec(self, test, outcome, err=None):
        detail = ""
        if err is not None:
            lines = "".join(traceback.format_exception(*err)).strip().splitlines()
            detail = lines[-1][:300] if lines else ""
        self.records[self._name(test)] = {"outcome": outcome, "detail": detail}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._rec(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._rec(test, "fail", err)

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass errors arrive with a _ErrorHolder, not a test
        self._rec(test, "error", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.records[self._name(test)] = {"outcome": "skip", "detail": reason}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paho-dir", default=os.environ.get("PAHO_TESTING_DIR"),
                    help="path where the paho.mqtt.testing checkout lives (default: $PAHO_TESTING_DIR)")
    ap.add_argument("--suite", choices=sorted(SUITES), required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", required=True, help="broker port; with --isolate, a comma-separated list (one per broker)")
    ap.add_argument("--label", default="", help="broker label written into the JSON")
    ap.add_argument("--json", help="write per-test results to this file")
    ap.add_argument("--per-test-timeout", type=int, default=120, help="seconds before a single test is aborted")
    ap.add_argument("--isolate", action="store_true",
                    help="run every test in its own python process (fresh client state, no cascading failures)")
    ap.add_argument("--known-failures", help="file of 'suite test_name  reason' lines: failures that do not fail the run")
    ap.add_argument("tests", nargs="*", help="only these test method names")
    args = ap.parse_args()
    args.ports = [int(p) for p in args.port.split(",")]
    if args.isolate:
        return isolate(args)
    if len(args.ports) != 1:
        ap.error("several ports need --isolate")
    args.port = args.ports[0]
    if not args.paho_dir:
        ap.error("--paho-dir or PAHO_TESTING_DIR is required")
    interop = os.path.join(args.paho_dir, "interoperability")
    if not os.path.isfile(os.path.join(interop, SUITES[args.suite] + ".py")):
        ap.error("no %s.py under %s" % (SUITES[args.suite], interop))
    sys.path.insert(0, interop)
    mod = __import__(SUITES[args.suite])

    # Same globals the suites' __main__ blocks set.
    mod.host, mod.port = args.host, args.port
    mod.nosubscribe_topics = ("test/nosubscribe",)
    if args.suite == "v311":
        mod.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
        mod.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
    else:
        mod.topic_prefix = "client_test5/"
        mod.topics = [mod.topic_prefix + t for t in ["TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA"]]
        mod.wildtopics = [mod.topic_prefix + t for t in ["TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#"]]

    import logging
    logging.getLogger().setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _alarm)

    loader = unittest.TestLoader()
    if args.tests:
        suite = unittest.TestSuite(loader.loadTestsFromName("Test." + t, mod) for t in args.tests)
    else:
        suite = loader.loadTestsFromTestCase(mod.Test)
    all_names = [t._testMethodName for t in suite] if not args.tests else list(args.tests)

    runner = unittest.TextTestRunner(
        verbosity=2,
        resultclass=lambda *a, **kw: Collector(*a, per_test_timeout=args.per_test_timeout, **kw))
    t0 = time.monotonic()
    result = runner.run(suite)
    wall = round(time.monotonic() - t0, 1)

    recs = result.records
    for n in all_names:  # tests that never reported (e.g. setUpClass failed)
        recs.setdefault(n, {"outcome": "not-run", "detail": ""})
    passed = sum(1 for n in all_names if recs[n]["outcome"] == "pass")
    failed = len(all_names) - passed
    out = {"suite": args.suite, "module": SUITES[args.suite], "label": args.label, "mode": "suite",
           "host": args.host, "port": args.port, "passed": passed, "failed": failed,
           "total": len(all_names), "wall_s": wall,
           "tests": {n: recs[n] for n in sorted(all_names)}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    print(json.dumps({k: out[k] for k in ("suite", "label", "port", "passed", "failed", "total", "wall_s")}))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(0 if failed == 0 else 1)


def known_failures(path, suite):
    """The tests of suite listed in the known-failures file, with their reasons."""
    known = {}
    if not path:
        return known
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if parts[0] == suite:
                known[parts[1]] = parts[2] if len(parts) > 2 else ""
    return known


def isolate(args):
    """One subprocess per test, as many at once as there are ports (each port
    serving one test at a time); results merged into one JSON of the same shape."""
    import queue
    import subprocess
    import tempfile
    import threading
    names = list(args.tests)
    if not names:
        sys.path.insert(0, os.path.join(args.paho_dir, "interoperability"))
        mod = __import__(SUITES[args.suite])
        names = unittest.TestLoader().getTestCaseNames(mod.Test)
    recs = {}
    lock = threading.Lock()
    todo = queue.Queue()
    for n in names:
        todo.put(n)
    t0 = time.monotonic()

    def run_one(n, port):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            tmp = tf.name
        cmd = [sys.executable, os.path.abspath(__file__), "--paho-dir", args.paho_dir, "--suite", args.suite,
               "--host", args.host, "--port", str(port), "--per-test-timeout", str(args.per_test_timeout),
               "--json", tmp, n]
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=args.per_test_timeout + 60).stdout
            with open(tmp) as f:
                rec = json.load(f)["tests"][n]
        except Exception as e:  # crash / hang of the child
            out, rec = b"", {"outcome": "error", "detail": "isolated run failed: %r" % (e,)}
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        with lock:
            recs[n] = rec
            if rec["outcome"] != "pass":
                sys.stderr.buffer.write(out)  # the failing test's own output, whole
            print("ISOLATED %s (port %d): %s %s" % (n, port, rec["outcome"], rec.get("seconds", "")),
                  file=sys.stderr, flush=True)

    def worker(port):
        while True:
            try:
                n = todo.get_nowait()
            except queue.Empty:
                return
            run_one(n, port)

    threads = [threading.Thread(target=worker, args=(p,)) for p in args.ports]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    known = known_failures(args.known_failures, args.suite)
    passed = sum(1 for n in names if recs[n]["outcome"] == "pass")
    unexpected = [n for n in names if recs[n]["outcome"] != "pass" and n not in known]
    for n in names:
        if n in known:
            print("%s %s: %s (known: %s)" % ("XPASS" if recs[n]["outcome"] == "pass" else "KNOWN FAILURE",
                                            n, recs[n]["outcome"], known[n]), file=sys.stderr)
    for n in unexpected:
        print("FAILED %s: %s %s" % (n, recs[n]["outcome"], recs[n]["detail"]), file=sys.stderr)
    out = {"suite": args.suite, "module": SUITES[args.suite], "label": args.label, "mode": "isolated",
           "host": args.host, "port": args.port, "passed": passed, "failed": len(names) - passed,
           "unexpected": len(unexpected), "total": len(names), "wall_s": round(time.monotonic() - t0, 1),
           "tests": recs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    print(json.dumps({k: out[k] for k in ("suite", "label", "mode", "port", "passed", "failed", "unexpected", "total", "wall_s")}))
    print("%s: %d passed, %d failed (%d known)" % (args.suite, passed, len(names) - passed, len(names) - passed - len(unexpected)))
    sys.exit(0 if not unexpected else 1)


if __name__ == "__main__":
    main()
