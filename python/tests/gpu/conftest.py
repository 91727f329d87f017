"""The torch and GPU tests skip, saying why, where torch or a GPU is missing.
A run in which no test passed and none failed exits 77, which the ctest
(label gpu) reports as skipped rather than passed."""
import pytest

SKIPPED = 77
_passed = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _passed.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and not _passed:
        session.exitstatus = SKIPPED
