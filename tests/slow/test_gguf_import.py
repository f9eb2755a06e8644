"""``dspark-lightning target import``: a GGUF becomes an HF directory that computes what the original model did.

The GGUF is written by llama.cpp's own converter (the pinned source) from a tiny random Llama with SmolLM2's
tokenizer, in F32, so the imported weights must equal the original ones exactly.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from dspark_lightning.export import llamacpp
    from dspark_lightning.targets.embedded import SMOLLM2, build_tiny_target, embedded_path

    d = tmp_path_factory.mktemp("gguf")
    build_tiny_target(d / "hf", num_layers=4, tokenizer_from=embedded_path(SMOLLM2))
    llamacpp.convert(d / "hf", d / "tiny.gguf", "f32")
    return d / "hf", d / "tiny.gguf"


def test_import_round_trips_the_model_and_its_tokenizer(tiny_gguf, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark_lightning import load_target
    from dspark_lightning.cli import main

    hf, gguf = tiny_gguf
    out = tmp_path / "imported"
    main(["target", "import", "--gguf", str(gguf), "--out", str(out)])
    assert capsys.readouterr().out.strip() == str(out)
    rec = json.loads((out / "dspark_import.json").read_text())
    assert rec["gguf"] == "tiny.gguf" and len(rec["sha256"]) == 64 and rec["architecture"] == "llama"
    ref = AutoModelForCausalLM.from_pretrained(hf).eval()
    target = load_target(str(out))
    ids = torch.tensor([[1, 50, 700, 3000, 12, 9]])
    assert torch.allclose(target.model(ids).logits, ref(ids).logits, atol=1e-5)
    text = "Hello world, 1+1=2.\n  def f(x): return x"
    assert target.tokenizer(text)["input_ids"] == AutoTokenizer.from_pretrained(hf)(text)["input_ids"]
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    main(["target", "import", "--gguf", str(gguf), "--out", str(out)])  # the same file again: kept as it is
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_import_refuses_bad_input_in_one_line(tiny_gguf, tmp_path, capsys):
    from dspark_lightning.cli import main

    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    cases = [
        (["--gguf", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "o")], "not found"),
        (["--gguf", str(not_gguf), "--out", str(tmp_path / "o")], "is not a GGUF file"),
        (["--gguf", str(tiny_gguf[1]), "--out", str(busy)], "exists (not an import of tiny.gguf); pass --overwrite"),
    ]
    for args, words in cases:
        with pytest.raises(SystemExit) as e:
            main(["target", "import", *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("dspark-lightning target: error: "), err
        assert words in err[0], err[0]
    assert (busy / "notes.txt").read_text() == "mine" and not (tmp_path / "o").exists()
