"""A pytest plugin (`-p outcomes`) that writes every test's outcome, by node id, as JSON to the
file named by SUITE_OUTCOMES: "passed", "failed" (in its call, setup or teardown) or "skipped".
engine/tests/llama_suite.rs compares them with the list of tests that cannot pass."""
import json
import os

_outcomes = {}


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session, exitstatus):
    path = os.environ["SUITE_OUTCOMES"]
    with open(path + ".partial", "w") as out:
        json.dump(_outcomes, out, indent=1, sort_keys=True)
    os.replace(path + ".partial", path)
