"""A pytest plugin (`-p outcomes`) that writes every test's outcome, by node id, as JSON to the
file named by SUITE_OUTCOMES: {"outcomes": {id: "passed" | "failed" | "skipped"}, "why": {id:
the failure's last line}}. A test fails in its call, setup or teardown. engine/tests/llama_suite.rs
compares the outcomes with the list of tests that cannot pass, and shows why only for the
failures the list does not explain (pytest itself is told to print no failure, so that a run's
log does not read as failing where every failure is expected)."""
import json
import os

_outcomes = {}
_why = {}


def _last_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return f"{crash.path}:{crash.lineno}: {crash.message}"
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
        _why.setdefault(report.nodeid, f"{report.when}: {_last_line(report)}"[:2000])
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_collectreport(report):
    # A module that cannot be collected (an import or conftest error) runs no test: say why.
    if report.failed:
        _why[report.nodeid or "collection"] = f"collect: {_last_line(report)}"[:2000]


def pytest_sessionfinish(session, exitstatus):
    path = os.environ["SUITE_OUTCOMES"]
    with open(path + ".partial", "w") as out:
        json.dump({"outcomes": _outcomes, "why": _why}, out, indent=1, sort_keys=True)
    os.replace(path + ".partial", path)
