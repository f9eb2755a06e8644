"""What llama.cpp's own code reports of our GGUFs (tests/slow/test_llamacpp.py): a test aid, beside its tests.

:func:`load_report` loads a draft GGUF with its target in llama.cpp's loader (``llama-speculative-simple``, built by
``dspark-lightning llamacpp build``) and parses what the loader printed; :func:`gguf_tensors` reads a GGUF's tensor
names and shapes with llama.cpp's in-tree ``gguf-py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from dspark_lightning.export.common import InteropError
from dspark_lightning.export.llamacpp import source_dir, speculative_command

_KV = re.compile(r"llama_model_loader: - kv\s+\d+:\s+(\S+)\s+\S+(?:\[[^\]]*\])?\s+=\s+(.*)$")
_PATTERNS = {
    "draft_vocab_size": re.compile(r"d2t mapping \(draft_vocab_size = (\d+)\)"),
    "markov_rank": re.compile(r"DSpark markov head \(rank = (\d+)\)"),
    "n_drafted": re.compile(r"\bn_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"\bn_accept\s*=\s*(\d+)"),
    "n_predict": re.compile(r"\bn_predict\s*=\s*(\d+)"),
}
_SPEC = re.compile(r"block_size=(\d+), mask_token_id=(-?\d+), n_extract=(\d+), sample_from_anchor=(\w+)")


def load_report(target_gguf: Path, draft_gguf: Path, n_predict: int = 8, prompt: str = "Hello") -> dict[str, Any]:
    """Load ``draft_gguf`` with ``target_gguf`` in llama.cpp's own loader and draft a few tokens greedily; return what
    llama.cpp reported: the draft's GGUF metadata (``kv``), its tensor count, the Markov rank and d2t size its loader
    found, the speculative settings it derived (``spec``), the draft counts and the exit code. The loader refuses a
    tensor of a wrong shape and a tensor it did not use, so a clean exit means every tensor matched."""
    cmd = speculative_command(target_gguf, draft_gguf, prompt, n_predict, n_max=64, threads=1) + ["-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    log = (r.stdout + "\n" + r.stderr).splitlines()
    rep: dict[str, Any] = {"returncode": r.returncode, "kv": {}, "log_tail": log[-15:]}
    in_draft = False
    for line in log:
        if "loaded meta data with" in line:
            src = re.search(r"tensors from (.+?) \(version", line)
            in_draft = src is not None and src.group(1) == str(draft_gguf)
            if in_draft:
                rep["n_tensors"] = int(re.search(r"and (\d+) tensors", line).group(1))
        elif in_draft and (m := _KV.search(line)):
            rep["kv"][m.group(1)] = m.group(2).strip()
        for key, pat in _PATTERNS.items():
            if m := pat.search(line):
                rep[key] = int(m.group(1))
        if m := _SPEC.search(line):
            rep["spec"] = {"block_size": int(m.group(1)), "mask_token_id": int(m.group(2)),
                           "n_extract": int(m.group(3)), "sample_from_anchor": m.group(4) == "true"}  # fmt: skip
    return rep


def gguf_tensors(path: Path) -> dict[str, list[int]]:
    """Tensor names and shapes (PyTorch order) of a GGUF, read by llama.cpp's own ``gguf-py`` in a subprocess (the
    in-tree package would shadow PyPI's ``gguf`` in this one)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import gguf; "
        "r = gguf.GGUFReader(sys.argv[2]); "
        "print(json.dumps({t.name: [int(x) for x in reversed(t.shape)] for t in r.tensors}))"
    )
    r = subprocess.run([sys.executable, "-c", code, str(source_dir() / "gguf-py"), str(path)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise InteropError(f"llamacpp: gguf-py cannot read {path}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)
