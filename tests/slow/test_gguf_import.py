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
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("dspark-lightning target import: error: "), err
        assert words in err[0], err[0]
    assert (busy / "notes.txt").read_text() == "mine" and not (tmp_path / "o").exists()


def test_a_second_writer_is_refused_and_a_failed_import_keeps_the_previous(tiny_gguf, tmp_path, capsys, monkeypatch):
    import os
    import subprocess
    import sys

    from dspark_lightning.cli import main
    from dspark_lightning.targets import gguf_import

    out = tmp_path / "targets" / "tiny"
    hold = (
        "import sys, time; from dspark_lightning import locks; locks.acquire(sys.argv[1], 'x'); "
        "print('ok', flush=True); time.sleep(300)"
    )
    proc = subprocess.Popen([sys.executable, "-c", hold, str(out.parent)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ok"
        with pytest.raises(SystemExit) as e:
            main(["target", "import", "--gguf", str(tiny_gguf[1]), "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f"pid {proc.pid}" in err[0] and "in use" in err[0], err
        assert not out.exists()
    finally:
        proc.kill()
        proc.wait()
    main(["target", "import", "--gguf", str(tiny_gguf[1]), "--out", str(out)])
    capsys.readouterr()
    record = out / "dspark_import.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))  # another file's import
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")  # the disk fills while the new folder is written

    monkeypatch.setattr(gguf_import, "write_sentencepiece", broken)
    with pytest.raises(SystemExit):
        main(["target", "import", "--gguf", str(tiny_gguf[1]), "--out", str(out), "--overwrite", "true"])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [ln for ln in err if "error:" in ln]  # transformers' progress bars come first
    assert (
        errors == err[-1:] and err[-1].startswith("dspark-lightning target import: error: ") and str(out) in err[-1]
    ), err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the previous import, whole
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tiny.")]  # no temp folder left
