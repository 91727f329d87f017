"""kiln.Model on a Hugging Face Llama directory written by conftest."""
import json

import numpy as np
import pytest

import kiln
from helpers import D, F, LAYERS, VOCAB, ffn_reference


def test_metadata_and_tensors(llama):
    path, w = llama
    with kiln.Model.open(path) as m:
        assert m.container == "safetensors" and m.arch == "LlamaForCausalLM"
        info = m.info
        assert (info.n_layers, info.d_model, info.d_ffn, info.vocab) == (LAYERS, D, F, VOCAB)
        assert m.metadata() == {} and m.warnings == []
        ts = {t.name: t for t in m.tensors()}
        assert set(ts) == set(w)
        gate = ts["model.layers.0.mlp.gate_proj.weight"]
        assert gate.format == "f32" and gate.shape == (F, D) and gate.ne == (D, F)
        assert gate.bytes == F * D * 4
        q = m.weight("model.layers.1.mlp.down_proj.weight")
        assert np.array_equal(q.dequantize(), w["model.layers.1.mlp.down_proj.weight"])
        with pytest.raises(kiln.Error) as ei:
            m.weight("model.layers.9.mlp.up_proj.weight")
        assert ei.value.status == kiln.Status.ERR_NOT_FOUND


@pytest.mark.parametrize("layers", [0, 1])
def test_ffn_graph_runs_on_the_cpu_as_float64_does(llama, rng, layers):
    path, w = llama
    m = kiln.Model.open(path)
    s = kiln.Session(m.graph("ffn", layers=layers), device="cpu")
    x = rng.standard_normal((4, D))
    y = s.run(x)
    want = ffn_reference(x, w, layers or LAYERS)
    # f32 arithmetic over K <= 128 terms: well under 1e-4 of the scale
    assert np.abs(y - want).max() < 1e-4 * np.abs(want).max()


def test_linears_graph_holds_every_linear_and_the_head(llama):
    m = kiln.Model.open(llama[0])
    g = m.graph("linears")
    assert sum(t.op == "linear" for t in g.tensors) == 7 * LAYERS + 1
    assert len(g.inputs) == len(g.outputs) == 7 * LAYERS + 1


def gate_up_reference(x, w, layer, gelu=False):
    """act(gate(x)) * up(x) of a layer, in float64."""
    p = f"model.layers.{layer}.mlp."
    g = x.astype(np.float64) @ w[p + "gate_proj.weight"].T.astype(np.float64)
    u = x.astype(np.float64) @ w[p + "up_proj.weight"].T.astype(np.float64)
    if gelu:
        a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    else:
        a = g / (1 + np.exp(-g))
    return a * u


def test_engine_graph_adds_each_layers_gate_and_up_as_one_entry(llama, rng):
    path, w = llama
    m = kiln.Model.open(path)
    g = m.graph("engine")
    groups = [f"blk.{l}.ffn_gate_up.out" for l in range(LAYERS)]
    linears = [t.name for t in m.graph("linears").outputs]
    assert [t.name for t in g.outputs] == [
        n for l in range(LAYERS) for n in linears[7 * l:7 * l + 7] + [groups[l]]] + linears[-1:]
    assert sum(t.op == "linear" for t in g.tensors) == 9 * LAYERS + 1
    s = kiln.Session(g, device="cpu")
    assert set(groups) <= set(s.entries)
    x = rng.standard_normal((3, D)).astype(np.float32)
    for l in range(LAYERS):
        assert [t.name for t in g.entry_inputs(groups[l])] == [f"blk.{l}.ffn_gate_up.in"]
        y = s.run_entry(groups[l], x)
        want = gate_up_reference(x, w, l)
        assert y.shape == (3, F)
        assert np.abs(y - want).max() < 1e-4 * np.abs(want).max()
        # the same as the layer's two linear entries and silu * mul
        p = f"model.layers.{l}.mlp."
        gate = s.run_entry(p + "gate_proj.weight.out", x)
        up = s.run_entry(p + "up_proj.weight.out", x)
        assert np.abs(y - gate / (1 + np.exp(-gate)) * up).max() < 1e-5 * np.abs(want).max()


def test_engine_graph_runs_a_group_as_two_kernels(llama):
    """The group's up linear carries the act*mul epilogue: two kernels, the
    layer's standalone gate and up linears as they were."""
    g = kiln.Model.open(llama[0]).graph("engine", layers=1)
    p = kiln.plan(g, "sm_90a")
    by_node = {pl.node: pl for pl in p.linears(0)}
    assert by_node["blk.0.ffn_gate_up.up"].epilogue == "silu_mul"
    assert by_node["blk.0.ffn_gate_up.gate"].epilogue == "none"
    assert by_node["model.layers.0.mlp.up_proj.weight.out"].epilogue == "none"


def test_engine_graph_takes_the_familys_activation(tmp_path, rng):
    from helpers import write_llama
    w = write_llama(str(tmp_path), rng)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["GemmaForCausalLM"]
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg_path.write_text(json.dumps(cfg))
    s = kiln.Session(kiln.Model.open(str(tmp_path)).graph("engine", layers=1), device="cpu")
    x = rng.standard_normal((2, D)).astype(np.float32)
    y = s.run_entry("blk.0.ffn_gate_up.out", x)
    want = gate_up_reference(x, w, 0, gelu=True)
    assert np.abs(y - want).max() < 1e-4 * np.abs(want).max()
    assert np.abs(y - gate_up_reference(x, w, 0)).max() > 1e-2 * np.abs(want).max()
    # a family kiln does not know: the linears alone still build, the groups
    # (whose activation it would guess) are refused as the FFN is
    cfg["architectures"] = ["FooForCausalLM"]
    cfg_path.write_text(json.dumps(cfg))
    m = kiln.Model.open(str(tmp_path))
    assert len(m.graph("linears").outputs) == 7 * LAYERS + 1
    with pytest.raises(kiln.Error) as ei:
        m.graph("engine")
    assert ei.value.status == kiln.Status.ERR_UNSUPPORTED and "FooForCausalLM" in ei.value.message


def test_closing_the_model_closes_its_graphs_and_sessions(llama):
    m = kiln.Model.open(llama[0])
    g = m.graph("ffn")
    s = kiln.Session(g, device="cpu")
    m.close()
    assert g.closed and s.closed
    with pytest.raises(ValueError, match="model is closed"):
        m.graph("ffn")


def test_a_missing_file_names_itself(tmp_path):
    path = str(tmp_path / "absent.gguf")
    with pytest.raises(kiln.Error) as ei:
        kiln.Model.open(path)
    assert ei.value.status == kiln.Status.ERR_IO and path in ei.value.message


def test_an_unknown_graph_kind_is_a_value_error(llama):
    with pytest.raises(ValueError, match="'ffn', 'linears'"):
        kiln.Model.open(llama[0]).graph("attention")


def test_a_cpu_session_cannot_reload(llama):
    m = kiln.Model.open(llama[0])
    s = kiln.Session(m.graph("ffn"), device="cpu")
    with pytest.raises(kiln.Error, match="CPU executor reads the graph's weights") as ei:
        s.reload(m)
    assert ei.value.status == kiln.Status.ERR_STATE
