"""Torch tensors through kiln.Session and kiln.Linear; on the GPU when there
is one (the CPU executor otherwise)."""
import numpy as np
import pytest

import kiln
from helpers import gpu_or_skip

torch = pytest.importorskip("torch", reason="torch is not importable")


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


# kiln's GPU kernels read and write BF16 activations: on a GPU session an F32
# weight's product is as close as BF16 inputs and outputs allow.
BF16_TOL = 2.0 ** -7


def tolerance(lin, tol):
    return tol if lin.session.device == "cpu" else max(tol, BF16_TOL)


@pytest.mark.parametrize("fmt,tol", [("f32", 1e-4), ("bf16", 2e-2), ("q8_0", 2e-2)])
def test_linear_computes_what_nn_linear_computes(fmt, tol):
    torch.manual_seed(0)
    ref = torch.nn.Linear(256, 96).to(device())
    lin = kiln.Linear.from_linear(ref, format=fmt)
    x = torch.randn(2, 5, 256, device=device())
    y = lin(x)
    assert y.shape == (2, 5, 96) and y.device == x.device and y.dtype == x.dtype
    want = ref(x).detach()
    tol = tolerance(lin, tol)
    assert (y - want).abs().max().item() < tol * want.abs().max().item()


def test_a_batch_past_the_largest_bucket_runs_in_chunks():
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 32, bias=False)
    lin = kiln.Linear.from_linear(ref, format="f32", capture=[1, 4], max_tokens=8)
    x = torch.randn(21, 64)
    want = ref(x).detach().numpy()
    tol = tolerance(lin, 1e-4)
    np.testing.assert_allclose(lin(x).numpy(), want, rtol=tol, atol=tol * np.abs(want).max())


def test_session_returns_torch_in_the_inputs_dtype_and_device():
    g = kiln.Graph()
    x = g.input("x", 64)
    g.output(g.linear("y", x, g.weight("w", np.eye(64, dtype=np.float32), "bf16")))
    s = kiln.Session(g)
    xt = torch.randn(3, 64, device=device(), dtype=torch.bfloat16)
    y = s.run(xt)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.device == xt.device
    assert torch.equal(y, xt)  # identity in BF16: exact


def test_a_gpu_session_matches_the_cpu_executor():
    gpu_or_skip()
    rng = np.random.default_rng(0)
    g = kiln.Graph()
    x = g.input("x", 256)
    g.output(g.linear("y", x, g.weight("w", rng.standard_normal((128, 256)), "q8_0")))
    gpu = kiln.Session(g, device="cuda:0", capture=[1, 16], max_tokens=32)
    cpu = kiln.Session(g, device="cpu")
    assert gpu.device == "cuda:0" and gpu.stats.kernels > 0
    for m in (1, 7, 32):
        xs = rng.standard_normal((m, 256)).astype(np.float32)
        want = cpu.run(xs)
        # BF16 activations on the device: 2^-8 of the scale, with room
        assert np.abs(gpu.run(xs) - want).max() < 2e-2 * np.abs(want).max()
    with pytest.raises(kiln.Error) as ei:
        gpu.run(np.zeros((33, 256), np.float32))
    assert ei.value.status == kiln.Status.ERR_SHAPE


def _gpu_linear_session(rng, fmt="q8_0"):
    g = kiln.Graph()
    x = g.input("x", 256)
    g.output(g.linear("y", x, g.weight("w", rng.standard_normal((128, 256)), fmt)))
    return kiln.Session(g, device="cuda:0", capture=[1, 16], max_tokens=32)


def test_cuda_tensors_stay_on_the_device_and_match_the_host_path():
    gpu_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    rng = np.random.default_rng(1)
    s = _gpu_linear_session(rng)
    big = torch.randn(40, 300, device="cuda:0", dtype=torch.bfloat16)
    for m in (1, 7, 32):
        x = big[:m, 10:266]  # a strided slice: rows 300 elements apart
        y = s.run(x)
        assert y.device == x.device and y.dtype == torch.bfloat16 and y.shape == (m, 128)
        want = s.run(x.float().cpu().numpy())  # the host path, same BF16 inputs
        np.testing.assert_array_equal(y.float().cpu().numpy(), want)
    y32 = s.run(big[:5, :256].float())
    assert y32.dtype == torch.float32 and y32.is_cuda


def test_a_torch_cuda_graph_captures_the_run():
    gpu_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    rng = np.random.default_rng(2)
    s = _gpu_linear_session(rng, "bf16")
    x = torch.randn(9, 256, device="cuda:0", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        s.run(x)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = s.run(x)
    for _ in range(2):
        x.copy_(torch.randn(9, 256, device="cuda:0", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(y.float().cpu().numpy(), s.run(x.float().cpu().numpy()))


def test_a_session_reloads_another_checkpoint_as_a_fresh_one_runs_it(tmp_path):
    """kiln_session_reload from a second checkpoint of the same shape: the
    reloaded session's outputs equal a fresh session's on that checkpoint."""
    gpu_or_skip()
    from safetensors.numpy import save_file
    rng = np.random.default_rng(5)
    paths = []
    for i in range(2):
        d = tmp_path / f"m{i}"
        d.mkdir()
        ws = {f"model.layers.0.mlp.{p}_proj.weight": rng.standard_normal(s).astype(np.float32)
              .astype(np.float16) for p, s in (("gate", (256, 128)), ("up", (256, 128)),
                                               ("down", (128, 256)))}
        ws["model.layers.0.post_attention_layernorm.weight"] = np.ones(128, np.float16)
        save_file(ws, str(d / "model.safetensors"))
        (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], '
                                       '"num_hidden_layers": 1, "hidden_size": 128}')
        paths.append(str(d))
    a, b = kiln.Model.open(paths[0]), kiln.Model.open(paths[1])
    x = rng.standard_normal((3, 128)).astype(np.float32)
    reloaded = kiln.Session(a.graph("ffn"), device="cuda:0", capture=[1, 16, 64], max_tokens=64)
    reloaded.reload(b)
    fresh = kiln.Session(b.graph("ffn"), device="cuda:0", capture=[1, 16, 64], max_tokens=64)
    for m in (1, 3):
        np.testing.assert_array_equal(reloaded.run(x[:m]), fresh.run(x[:m]))


def test_an_entry_on_torch_tensors_gives_what_the_whole_run_gives():
    rng = np.random.default_rng(5)
    g = kiln.Graph()
    a, b = g.input("a", 128), g.input("b", 128)
    ya = g.linear("ya", a, g.weight("wa", rng.standard_normal((64, 128)).astype(np.float32),
                                    "q8_0"))
    yb = g.linear("yb", b, g.weight("wb", rng.standard_normal((96, 128)).astype(np.float32),
                                    "nvfp4"))
    g.output(ya, yb)
    s = kiln.Session(g)
    xa = torch.randn(7, 128, device=device(), dtype=torch.bfloat16)
    xb = torch.randn(7, 128, device=device(), dtype=torch.bfloat16)
    whole_a, whole_b = s.run(xa, xb)
    alone_b = s.run_entry("yb", xb)
    alone_a = s.run_entry("ya", xa)
    assert alone_b.device == xb.device and alone_b.dtype == torch.bfloat16
    assert torch.equal(alone_a, whole_a) and torch.equal(alone_b, whole_b)
