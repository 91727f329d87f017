#!/usr/bin/env python3
"""Run `kiln inspect`, `kiln plan` and `kiln compile --offline` (with an
empty cache) on every file hostile_models.py writes, each with a time limit.

Every run must end by itself within LIMIT seconds, with no signal (exit
status below 128; under the sanitizers, no report), print no control
character a terminal would act on (a name is data, printed escaped), and do
what the table of hostile_models.py says: "refused" exits 1 with a message
on stderr naming the path given; "ok" exits 0; "offline" exits 1 because
the kernels are in no cache. Prints a line per failure and a summary; exits
1 when anything failed.

Usage: hostile_cli.py KILN (the files go to a new temporary directory,
removed at the end)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_models  # noqa: E402

LIMIT = 10
# What a terminal acts on: C0 controls but tab and newline, and DEL.
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


def run(argv, env):
    start = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.monotonic() - start
    return p.returncode, out, err, time.monotonic() - start


def check(path, cmd, want, rc, out, err, took):
    """What is wrong with one run, or None."""
    text = err.decode(errors="replace").strip()
    if rc is None:
        return f"no end after {LIMIT} s"
    if rc < 0 or rc >= 128:
        return f"killed by signal {-rc if rc < 0 else rc - 128}: {text[-400:]}"
    if b"Sanitizer" in err or b"runtime error:" in err:
        return f"a sanitizer report: {text[-800:]}"
    if CONTROL.search(out) or CONTROL.search(err):
        return "printed a control character: " + repr(CONTROL.search(out + err).group())
    if want == "ok" and rc != 0:
        return f"exit {rc}, want 0: {text}"
    if want in ("refused", "offline") and rc != 1:
        return f"exit {rc}, want 1: {text or out.decode(errors='replace')[-300:]}"
    if want == "refused" and path not in text:
        return f"the message does not name {path}: {text}"
    if want == "offline" and "offline, and kernel" not in text:
        return f"not the offline miss of a fine file: {text}"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hostile_cli.py KILN")
    kiln = sys.argv[1]
    top = tempfile.mkdtemp(prefix="kiln-hostile-")
    try:
        failures = run_all(kiln, top)
    finally:
        shutil.rmtree(top)
    sys.exit(1 if failures else 0)


def run_all(kiln, top):
    made = hostile_models.make(os.path.join(top, "models"))
    cache = os.path.join(top, "empty.kiln")
    env = dict(os.environ, KILN_NVRTC="/nonexistent/libnvrtc.so", KILN_CACHE=cache,
               ASAN_OPTIONS="abort_on_error=1:detect_leaks=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    commands = {
        "inspect": lambda p: [kiln, "inspect", p],
        "plan": lambda p: [kiln, "plan", p, "--target", "sm_90a"],
        "compile": lambda p: [kiln, "compile", p, "--offline", "--target", "sm_90a",
                              "--cache", cache, "--quiet"],
    }
    failures, runs, slowest, start = [], 0, (0.0, ""), time.monotonic()
    for path, wants in made:
        for (cmd, argv), want in zip(commands.items(), wants):
            rc, out, err, took = run(argv(path), env)
            runs += 1
            if took > slowest[0]:
                slowest = (took, f"{cmd} {os.path.basename(path)}")
            wrong = check(path, cmd, want, rc, out, err, took)
            if wrong:
                failures.append(f"kiln {cmd} {path}: {wrong}")
    for f in failures:
        print(f)
    print(f"hostile models: {len(made)} files, {runs} runs in {time.monotonic() - start:.1f} s "
          f"(slowest {slowest[0]:.2f} s: {slowest[1]}), {len(failures)} not as they should be")
    return failures


if __name__ == "__main__":
    main()
