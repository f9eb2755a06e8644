"""``dspark-lightning export``: an exported drafter (any layout we read) to a layout servers load.

    dspark-lightning export --drafter outputs/.../drafter --format dspark-hf --out serving/dspark
    dspark-lightning export --drafter outputs/.../eagle3 --format eagle3-hf --out serving/eagle3 --dtype fp32

``native`` re-saves our own format; ``dspark-hf`` writes ``Qwen3DSparkModel``; ``eagle3-hf`` writes
``LlamaForCausalLMEagle3``; ``--server vllm|sglang|deepspec|llamacpp|all`` makes it exact for that server
(servers.py; llamacpp also writes llama.cpp's GGUF, llamacpp.py).
A drafter a layout or server cannot represent is refused with the reason (exit code 2).
"""

from __future__ import annotations

from .. import checks
from ..export.convert import export_drafter


def export_parser():
    from jsonargparse import ArgumentParser

    p = ArgumentParser(prog="dspark-lightning export", description="Write a drafter in a layout servers load.",
                       exit_on_error=False)  # fmt: skip
    p.add_argument("--drafter", type=str, required=True, help="exported drafter directory (ours or Qwen3DSparkModel)")
    p.add_argument("--format", type=str, default="dspark-hf", help="native | dspark-hf | eagle3-hf")
    p.add_argument("--out", type=str, required=True, help="output directory")
    p.add_argument("--dtype", type=str | None, default=None, help="bf16 | fp32 (default: bf16; native: as stored)")
    p.add_argument("--overwrite", type=bool, default=False, help="replace an existing export in --out")
    p.add_argument("--target", type=str | None, default=None, help="target name or HF directory (default: recorded)")
    p.add_argument("--num_anchors", type=int | None, default=None, help="training anchors per sequence (config only)")
    p.add_argument(
        "--with_target_vocab", type=bool, default=False, help="also write the target's embed_tokens/lm_head copies"
    )
    p.add_argument(
        "--server",
        type=str | None,
        default=None,
        help="a registered server: vllm | sglang | deepspec | llamacpp (or a plugin's), or all (default: the generic "
        "layout); llamacpp adds draft.gguf",
    )
    p.add_argument(
        "--target_gguf", type=bool, default=False, help="with llamacpp: also write the target as target.gguf"
    )
    return p


def run_export(argv: list[str]) -> None:
    a = export_parser().parse_args(argv)
    checks.drafter_config(a.drafter)
    checks.output_dir("--out", a.out)
    checks.at_least("--num_anchors", a.num_anchors, 1)
    res = export_drafter(a.drafter, a.format, a.out, dtype=a.dtype, overwrite=a.overwrite, target=a.target,
                         num_anchors=a.num_anchors, with_target_vocab=a.with_target_vocab, server=a.server,
                         target_gguf=a.target_gguf)  # fmt: skip
    print(f"exported {a.drafter} -> {res.path} ({res.format}, {res.dtype}, {res.tensors} tensors)")
    for note in res.notes:
        print(f"note: {note}")
