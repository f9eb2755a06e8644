"""``dspark-lightning export``: an exported drafter (any layout we read) to a layout servers load.

    dspark-lightning export --drafter outputs/.../drafter --layout dspark-hf --out serving/dspark
    dspark-lightning export --drafter outputs/.../eagle3 --layout eagle3-hf --out serving/eagle3 --dtype fp32
    dspark-lightning export --drafter DIR --layout '{class_path: dspark-hf, init_args: {num_anchors: 256}}' --out DIR

``native`` re-saves our own layout; ``dspark-hf`` writes ``Qwen3DSparkModel``; ``eagle3-hf`` writes
``LlamaForCausalLMEagle3``; ``--server vllm|sglang|deepspec|llamacpp|all`` makes it exact for that server
(export/servers.py; llamacpp also writes llama.cpp's GGUF, export/llamacpp.py).
A drafter a layout or server cannot represent is refused with the reason (exit code 2).
"""

from __future__ import annotations

from .. import checks
from ..export.convert import export_drafter


def export(
    drafter: str,
    out: str,
    layout: str = "dspark-hf",
    dtype: str | None = None,
    overwrite: bool = False,
    target: str | None = None,
    server: str | None = None,
    target_gguf: bool = False,
) -> None:
    """Write a drafter in a layout servers load.

    Args:
        drafter: exported drafter directory (ours or Qwen3DSparkModel)
        out: output directory
        layout: native (ours) | dspark-hf (Qwen3DSparkModel) | eagle3-hf (LlamaForCausalLMEagle3) | a plugin's
            registered layout, or {class_path: NAME, init_args: {...}} with its settings (dspark-hf: num_anchors,
            written to config.json, default the drafter's own or 512; with_target_vocab: also write the target's
            embed_tokens / lm_head copies)
        dtype: bf16 | fp32 (default: bf16; native: as stored)
        overwrite: replace an existing export in --out
        target: target name or HF directory (default: recorded)
        server: a registered server: vllm | sglang | deepspec | llamacpp (or a plugin's), or all (default: the
            generic layout); llamacpp adds draft.gguf
        target_gguf: with llamacpp: also write the target as target.gguf
    """
    checks.drafter_config(drafter)
    checks.output_dir("--out", out)
    res = export_drafter(drafter, layout, out, dtype=dtype, overwrite=overwrite, target=target, server=server,
                         target_gguf=target_gguf)  # fmt: skip
    print(f"exported {drafter} -> {res.path} ({res.layout}, {res.dtype}, {res.tensors} tensors)")
    for note in res.notes:
        print(f"note: {note}")
