"""How the package finds libkiln: each case in a fresh interpreter, since a
process loads the library once."""
import ctypes.util
import os
import shutil
import subprocess
import sys

import pytest

import kiln

PACKAGE = os.path.dirname(os.path.abspath(kiln.__file__))


def python(code, env, cwd):
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_LIBRARY", "KILN_BUILD_DIR", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(extra)
    return env


def test_kiln_library_is_used_and_a_bad_one_is_not_passed_over(tmp_path):
    lib = kiln.library_path()
    r = python("import kiln; print(kiln.library_path())",
               clean_env(KILN_LIBRARY=lib, PYTHONPATH=os.path.dirname(PACKAGE)), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == lib
    bad = str(tmp_path / "libkiln-missing.so")
    r = python("import kiln; kiln.formats()",
               clean_env(KILN_LIBRARY=bad, PYTHONPATH=os.path.dirname(PACKAGE)), tmp_path)
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and f"$KILN_LIBRARY ({bad})" in r.stderr


def test_a_library_next_to_the_package_is_found(tmp_path):
    copy = tmp_path / "site" / "kiln"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "libkiln.so*"))
    shutil.copy(kiln.library_path(), copy / "libkiln.so")
    r = python("import kiln; print(kiln.library_path())",
               clean_env(PYTHONPATH=str(copy.parent)), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(copy / "libkiln.so")


@pytest.mark.skipif(bool(ctypes.util.find_library("kiln")),
                    reason="a libkiln is installed on this machine: the loader finds it")
def test_nowhere_lists_every_place_searched(tmp_path):
    copy = tmp_path / "site" / "kiln"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "libkiln.so*"))
    r = python("import kiln; kiln.formats()", clean_env(PYTHONPATH=str(copy.parent)), tmp_path)
    assert r.returncode != 0
    for place in ("$KILN_LIBRARY: not set", "next to the package", "the system loader"):
        assert place in r.stderr, r.stderr
