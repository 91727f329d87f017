"""The ctypes structs of kiln._capi against include/kiln.h: every size and
offset, as a C compiler lays them out."""
import ctypes
import os
import shutil
import subprocess

import pytest

from kiln import _capi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.environ.get("KILN_HEADER") or os.path.join(ROOT, "include", "kiln.h")


def c_layout(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        pytest.skip("no C compiler")
    if not os.path.isfile(HEADER):
        pytest.skip(f"no kiln.h at {HEADER} (set KILN_HEADER)")
    lines = ['#include "kiln.h"', "#include <stddef.h>", "#include <stdio.h>",
             "int main(void) {"]
    for cname, st in _capi.STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for f, *_ in st._fields_:
            lines.append(f'printf("{cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


def test_every_struct_matches_the_header(tmp_path):
    want = c_layout(tmp_path)
    for cname, st in _capi.STRUCTS.items():
        assert ctypes.sizeof(st) == int(want[cname]), cname
        for f, *_ in st._fields_:
            assert getattr(st, f).offset == int(want[f"{cname}.{f}"]), f"{cname}.{f}"
