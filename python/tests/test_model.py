"""kiln.Model on a Hugging Face Llama directory written by conftest."""
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
