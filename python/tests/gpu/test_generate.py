"""examples/transformers_generate.py on a small Llama trained and written by
transformers: kiln's greedy tokens equal transformers' for every step of
every prompt, in BF16 and against the dequantized reference of an FP8 copy."""
import importlib.util
import os

import pytest

from helpers import gpu_or_skip

torch = pytest.importorskip("torch", reason="torch is not importable")
pytest.importorskip("transformers", reason="transformers is not importable")

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                       "examples", "transformers_generate.py")


def example():
    spec = importlib.util.spec_from_file_location("transformers_generate", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_kiln_generates_transformers_tokens(tmp_path, capsys, fmt):
    gpu_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    rc = example().main(["--make-trained", str(tmp_path / "llama"), "--format", fmt,
                         "--cache", str(tmp_path / "cache.kiln")])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    assert "tokens: all equal" in out
