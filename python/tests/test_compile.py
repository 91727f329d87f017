"""Targets, plans and ahead-of-time compiles: no GPU needed. The compiles
use NVRTC, or the stand-in $KILN_NVRTC names (the ctest does), and skip
on a machine with neither."""
import os

import pytest

import kiln
from helpers import nvrtc_or_skip

OPTS = dict(capture=[1, 16], max_tokens=32)


def small_graph(rng, fmt="q8_0"):
    g = kiln.Graph()
    x = g.input("x", 256)
    g.output(g.linear("y", x, g.weight("w", rng.standard_normal((128, 256)), fmt)))
    return g


def test_named_targets():
    t = kiln.Target.from_name("h200")
    assert (t.name, t.sm, t.alias_of, t.wgmma, t.tma) == ("sm_90a", 90, "h200", True, True)
    assert t.sm_count > 0
    assert "sm_80" in kiln.Target.names()
    with pytest.raises(kiln.Error) as ei:
        kiln.Target.from_name("sm_99z")
    assert ei.value.status == kiln.Status.ERR_NOT_FOUND and "sm_80" in ei.value.message


def test_plan_buckets_backends_and_signatures(rng):
    p = kiln.plan(small_graph(rng), "sm_90a", **OPTS)
    assert p.buckets == [1, 16, 32]
    assert p.bucket_for(2) == 1 and p.bucket_for(33) is None
    lin = p.linears(0)
    assert len(lin) == 1 and lin[0].node == "y" and lin[0].format == "q8_0"
    assert (lin[0].n, lin[0].k) == (128, 256) and lin[0].backend
    assert p.signatures and all(isinstance(s, str) and s for s in p.signatures)
    assert p.arena_bytes(2) > 0


def test_an_unknown_backend_is_refused_by_name(rng):
    with pytest.raises(kiln.Error) as ei:
        kiln.plan(small_graph(rng), "sm_90a", backend="nope")
    assert ei.value.status == kiln.Status.ERR_NOT_FOUND and "nope" in ei.value.message


def test_compile_then_everything_is_cached(rng, cache):
    g = small_graph(rng)
    try:
        first = kiln.compile(g, "sm_90a", cache=cache, **OPTS)
    except kiln.Error as e:
        nvrtc_or_skip(e)
    assert first.signatures > 0 and first.compiled + first.cached == first.signatures
    assert first.writable and os.path.exists(cache)
    again = kiln.compile(g, "sm_90a", cache=cache, **OPTS)
    assert (again.compiled, again.cached) == (0, first.signatures)


def test_export_ships_a_cache_that_serves_offline(rng, cache, tmp_path):
    g = small_graph(rng)
    p = kiln.plan(g, "h200", **OPTS)
    try:
        kiln.compile(p, cache=cache)
    except kiln.Error as e:
        nvrtc_or_skip(e)
    shipped = str(tmp_path / "model.kiln")
    kiln.export(p, shipped, cache=cache)
    r = kiln.compile(p, shipped=[shipped], no_writable=True, offline=True)
    assert (r.cached, r.compiled, r.writable) == (len(p.signatures), 0, False)
    with pytest.raises(kiln.Error) as ei:
        kiln.export(p, shipped, cache=cache)
    assert ei.value.status == kiln.Status.ERR_IO


def test_offline_with_an_empty_cache_names_the_missing_kernel(rng, cache):
    with pytest.raises(kiln.Error) as ei:
        kiln.compile(small_graph(rng), "sm_90a", cache=cache, offline=True, **OPTS)
    assert ei.value.status == kiln.Status.ERR_OFFLINE_MISS
    assert ei.value.name == "KILN_ERR_OFFLINE_MISS" and "q8_0" in ei.value.message


def test_a_plan_fixes_its_options(rng):
    p = kiln.plan(small_graph(rng), "sm_90a")
    with pytest.raises(TypeError):
        kiln.compile(p, "sm_80")
    with pytest.raises(TypeError):
        kiln.compile(small_graph(rng))


@pytest.mark.skipif("fake_nvrtc" not in os.environ.get("KILN_NVRTC", ""),
                    reason="needs the stand-in NVRTC (tests/harness/fake_nvrtc.c)")
def test_a_kernel_nvrtc_rejects_is_kiln_error_compile(rng, cache, monkeypatch):
    monkeypatch.setenv("KT_FAKE_NVRTC", "compile")
    with pytest.raises(kiln.Error) as ei:
        kiln.compile(small_graph(rng), "sm_90a", cache=cache, **OPTS)
    assert ei.value.status == kiln.Status.ERR_COMPILE
