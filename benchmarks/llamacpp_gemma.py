"""Does llama.cpp's draft-dspark take a Gemma 3 target? Asked of llama.cpp itself, not of our reading of its source.

    .venv/bin/python benchmarks/llamacpp_gemma.py --drafter outputs/gemma3_270m_dspark/tb/version_0/drafter \
        --out benchmarks/results/data/llamacpp_gemma          (make llamacpp-gemma; needs make llamacpp-tools)

`export --server llamacpp` refuses a Gemma 3 target before any work (its graph records no layer inputs). This script
goes past that refusal on purpose: it writes the drafter's generic layout, converts it with llama.cpp's own converter
against the imported Gemma directory (its SentencePiece ``tokenizer.model`` included), then runs
``llama-speculative-simple --spec-type draft-dspark`` on the original Q4_K_M GGUF. It records each exit code and the
last lines llama.cpp printed into ``<out>/report.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

PROMPT = "Question: What is 17*23?\nAnswer:"


def run(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    lines = [ln for ln in (r.stdout + "\n" + r.stderr).splitlines() if ln.strip()]
    return {"cmd": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd)), "returncode": r.returncode,
            "log_tail": lines[-12:]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from dspark_lightning import load_target
    from dspark_lightning.atomic import atomic_write
    from dspark_lightning.checkpoint import load_drafter, read_config, recorded_target_args
    from dspark_lightning.devices import cpu_model
    from dspark_lightning.export import llamacpp as lc
    from dspark_lightning.export.common import write_hf
    from dspark_lightning.export.dspark_hf import dspark_config, dspark_state
    from dspark_lightning.targets.embedded import gemma3_gguf
    from dspark_lightning.targets.gguf_import import write_sentencepiece

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = read_config(Path(a.drafter))
    target = load_target(cfg["target"]["name"], **recorded_target_args(a.drafter))
    drafter = load_drafter(a.drafter, target, dtype=torch.float32)
    gguf = gemma3_gguf()
    report: dict = {"cpu": cpu_model(), "llamacpp": lc.RELEASE, "target_gguf": gguf.name}
    with tempfile.TemporaryDirectory() as tmp:
        tdir = Path(tmp) / "target"  # the imported directory, plus tokenizer.model for the converter
        tdir.mkdir()
        for f in lc.target_dir(target).iterdir():
            if f.name != "model.safetensors":  # the converter reads the target's config and tokenizer only
                (tdir / f.name).symlink_to(f)
        write_sentencepiece(gguf, tdir)
        hf = Path(tmp) / "draft_hf"
        write_hf(hf, dspark_config(drafter, target, torch.float32, 512), dspark_state(drafter))
        draft = out / "draft.gguf"
        try:
            lc.convert(hf, draft, "f32", tdir, what="the drafter")
            report["convert"] = {"returncode": 0, "draft_gguf_bytes": draft.stat().st_size}
        except Exception as exc:  # noqa: BLE001 - what the converter said is the result
            report["convert"] = {"returncode": 1, "error": str(exc)}
    if report["convert"]["returncode"] == 0:
        spec = lc.speculative_command(gguf, draft, PROMPT, 32, n_max=drafter.block_size, threads=2)
        report["draft_dspark"] = run(spec)
        draft.unlink()  # a 300 MB artefact of this check, not kept
    atomic_write(out / "report.json", json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v.get("returncode") if isinstance(v, dict) else v for k, v in report.items()}, indent=1))


if __name__ == "__main__":
    if shutil.which("cmake") is None:
        raise SystemExit("cmake is needed to build llama.cpp's tools (make llamacpp-tools)")
    main()
