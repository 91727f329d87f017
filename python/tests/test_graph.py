"""Formats, graphs and the CPU executor through the package, against numpy."""
import numpy as np
import pytest

import kiln


def test_format_table():
    names = kiln.formats()
    assert names[:3] == ["f32", "f16", "bf16"]
    assert "q4_k" in names and "nvfp4" in names
    q4k = kiln.format_info("q4_k")
    assert (q4k.block, q4k.block_bytes) == (256, 144)


def test_q4_1_is_an_affine_fit_of_16_levels(rng):
    info = kiln.format_info("q4_1")
    assert (info.block, info.block_bytes) == (32, 20)
    w = (rng.standard_normal((4, 128)) + 1.5).astype(np.float32)
    q = kiln.quantize(w, "q4_1")
    assert q.shape == (4, 128) and q.data.size == 4 * 4 * 20
    # d = (max - min) / 15 and m = min, both f16: half a step, 15 times
    # d's f16 rounding (2^-11 of it) and m's (2^-11 of |min|)
    b = w.reshape(4, 4, 32)
    lo, hi = b.min(axis=2, keepdims=True), b.max(axis=2, keepdims=True)
    step = (hi - lo) / 15
    err = np.abs(q.dequantize().reshape(4, 4, 32) - b)
    assert (err <= (0.5 + 15 * 2.0**-11) * step + 2.0**-11 * np.abs(lo)).all()


def test_quantize_round_trips_within_the_format(rng):
    w = rng.standard_normal((8, 256)).astype(np.float32)
    assert np.array_equal(kiln.quantize(w, "f32").dequantize(), w)
    q = kiln.quantize(w, "q8_0")
    assert q.shape == (8, 256) and q.scale is None
    # Q8_0: 8-bit values times max|x|/127 per 32, that scale stored as f16:
    # half a step, and 127 times the f16 rounding of the step (2^-11 of it)
    step = np.abs(w).reshape(8, 8, 32).max(axis=2, keepdims=True) / 127
    err = np.abs(q.dequantize() - w).reshape(8, 8, 32)
    assert (err <= (0.5 + 127 * 2.0**-11) * step).all()
    nv = kiln.quantize(w, "nvfp4")
    assert nv.scale is not None and nv.global_scale > 0


def test_integer_groups_quantize_per_group(rng):
    w = rng.standard_normal((5, 256)).astype(np.float32)
    q = kiln.quantize(w, "int4_group_zp", group=64)
    assert q.group == 64 and q.scale.size == 5 * 4 * (4 + 1)  # f32 scales, then int8 zero points
    # int4 with a zero point: at most half of one of 15 steps of each group's range
    x = w.reshape(5, 4, 64)
    step = (np.maximum(x.max(axis=2), 0) - np.minimum(x.min(axis=2), 0)) / 15
    err = np.abs(q.dequantize() - w).reshape(5, 4, 64)
    assert (err <= 0.5001 * step[:, :, None]).all()
    assert kiln.format_info("int8_group").block == 4
    with pytest.raises(kiln.Error) as ei:
        kiln.quantize(w, "int4_group", group=12)
    assert ei.value.status == kiln.Status.ERR_SHAPE


def test_a_k_that_breaks_the_block_rule_is_kiln_error_shape(rng):
    with pytest.raises(kiln.Error) as ei:
        kiln.quantize(rng.standard_normal((4, 100)), "q4_k")
    assert ei.value.status == kiln.Status.ERR_SHAPE


def linear_graph(rng, n=48, k=64, fmt="f32", bias=True):
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    g = kiln.Graph()
    x = g.input("x", k)
    wt = g.weight("w", w, fmt)
    bt = g.param("b", b) if bias else None
    g.output(g.linear("y", x, wt, bt))
    return g, w, b


def test_graph_views(rng):
    g, _, _ = linear_graph(rng)
    assert [(t.name, t.op, t.shape) for t in g.tensors] == [
        ("x", "input", (None, 64)), ("w", "weight", (48, 64)), ("b", "param", (48,)),
        ("y", "linear", (None, 48))]
    y = g.find("y")
    assert g.outputs == [y] and y.src(1).name == "w" and y.src(2).name == "b"
    assert g.find("nope") is None


@pytest.mark.parametrize("m", [1, 3, 17])
def test_cpu_session_runs_a_linear_as_numpy_does(rng, m):
    g, w, b = linear_graph(rng)
    with kiln.Session(g, device="cpu", threads=2) as s:
        assert s.device == "cpu" and s.threads == 2 and s.stats is None
        x = rng.standard_normal((m, 64))
        y = s.run(x)
        assert y.dtype == np.float32 and y.shape == (m, 48)
        np.testing.assert_allclose(y, x @ w.T.astype(np.float64) + b, rtol=1e-4, atol=1e-4)


E4M3 = np.array([(-1) ** (c >> 7) * ((c & 7) / 8 * 2.0**-6 if (c >> 3) & 15 == 0 else
                  (1 + (c & 7) / 8) * 2.0 ** (((c >> 3) & 15) - 7)) for c in range(256)])
E4M3_POS = np.sort(np.unique(np.abs(E4M3[np.isfinite(E4M3)])))[:-1]  # 0 to 448, not 480


def test_a_static_input_scale_quantizes_the_linear_input(rng):
    k, n, s = 64, 48, np.float32(2 / 448)
    w = rng.standard_normal((n, k)).astype(np.float32)
    g = kiln.Graph()
    x = g.input("x", k)
    y = g.linear("y", x, g.weight("w", w, "f32"), input_scale=float(s))
    g.output(y)
    assert y.input_scale == s and x.input_scale == 0.0
    with pytest.raises(kiln.Error) as ei:
        g.linear("z", x, g.find("w"), input_scale=-1.0)
    assert ei.value.status == kiln.Status.ERR_INVALID_ARG and "static activation scale" in ei.value.message
    xv = rng.standard_normal((5, k)).astype(np.float32)
    with kiln.Session(g, device="cpu") as sess:
        got = sess.run(xv)
    # the nearest E4M3 value of x / s, saturated at 448 (no ties in random data)
    q = np.clip(xv / s, -448, 448).astype(np.float64)
    near = E4M3_POS[np.abs(np.abs(q)[..., None] - E4M3_POS).argmin(axis=-1)] * np.sign(q)
    want = (near.astype(np.float32) * s).astype(np.float64) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(got - xv.astype(np.float64) @ w.T).max() > 1e-2, "the quantization shows"


def test_auto_falls_back_to_the_cpu_executor_without_a_gpu(rng):
    g, _, _ = linear_graph(rng)
    s = kiln.Session(g)
    try:
        kiln.Target.live(0)
    except kiln.Error as e:
        assert e.status == kiln.Status.ERR_NO_DEVICE
        assert s.device == "cpu" and s.fallback_reason
    else:
        assert s.device == "cuda:0"
    with pytest.raises(kiln.Error) as ei:
        if s.device == "cpu":
            kiln.Session(g, device="cuda:0")
        else:
            raise kiln.Error(kiln.Status.ERR_NO_DEVICE, "a GPU is here")
    assert ei.value.status == kiln.Status.ERR_NO_DEVICE


def test_an_mlp_with_several_outputs(rng):
    k, f = 64, 96
    g = kiln.Graph()
    x = g.input("x", k)
    norm = rng.uniform(0.5, 1.5, k).astype(np.float32)
    wg, wu = (rng.standard_normal((f, k)).astype(np.float32) for _ in range(2))
    h = g.rms_norm("h", x, g.param("norm", norm), eps=1e-6)
    gate = g.linear("gate", h, g.weight("wg", wg))
    up = g.linear("up", h, g.weight("wu", wu))
    act = g.mul("act", g.silu("s", gate), up)
    g.output(act, gate)
    xs = rng.standard_normal((5, k))
    got_act, got_gate = kiln.Session(g, device="cpu").run(xs)
    hh = xs / np.sqrt((xs * xs).mean(axis=1, keepdims=True) + 1e-6) * norm
    gg = hh @ wg.T.astype(np.float64)
    uu = hh @ wu.T.astype(np.float64)
    np.testing.assert_allclose(got_gate, gg, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_act, gg / (1 + np.exp(-gg)) * uu, rtol=1e-4, atol=1e-4)


def test_each_output_runs_alone_as_an_entry(rng):
    k, n = 64, 48
    g = kiln.Graph()
    a, b = g.input("a", k), g.input("b", k)
    wa, wb = (rng.standard_normal((n, k)).astype(np.float32) for _ in range(2))
    ya = g.linear("ya", a, g.weight("wa", wa))
    yb = g.linear("yb", b, g.weight("wb", wb))
    g.output(ya, yb)
    assert [t.name for t in g.entry_inputs("yb")] == ["b"]
    s = kiln.Session(g, device="cpu")
    assert s.entries == ["ya", "yb"]
    xa, xb = rng.standard_normal((5, k)), rng.standard_normal((5, k))
    whole_a, whole_b = s.run(xa, xb)
    # the entry reads its own input only, and gives what the whole run gives
    assert np.array_equal(s.run_entry("yb", xb), whole_b)
    assert np.array_equal(s.run_entry("ya", xa), whole_a)
    with pytest.raises(ValueError, match=r"'yb' reads 1 inputs \['b'\], got 2"):
        s.run_entry("yb", xa, xb)
    with pytest.raises(KeyError, match="no output 'wa'"):
        s.run_entry("wa", xa)


def test_inputs_that_do_not_fit_are_refused_before_kiln_sees_them(rng):
    g, _, _ = linear_graph(rng)
    s = kiln.Session(g, device="cpu")
    with pytest.raises(ValueError, match=r"wants \[M, 64\]"):
        s.run(np.zeros((2, 63)))
    with pytest.raises(ValueError, match="1 inputs, got 2"):
        s.run(np.zeros((2, 64)), np.zeros((2, 64)))
    with pytest.raises(kiln.Error) as ei:  # M = 0 is kiln's to refuse
        s.run(np.zeros((0, 64)))
    assert ei.value.status == kiln.Status.ERR_INVALID_ARG


def test_closing_a_graph_closes_its_sessions_first(rng):
    g, _, _ = linear_graph(rng)
    s = kiln.Session(g, device="cpu")
    g.close()
    assert s.closed and g.closed
    with pytest.raises(ValueError, match="is closed"):
        s.run(np.zeros((1, 64)))
    g.close()  # twice is fine
