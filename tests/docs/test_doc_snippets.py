"""Every Python snippet of README.md and docs/*.md runs as written, one case per snippet (id ``file:line``).

Which blocks are Python:

- a fenced block whose language is ``python`` / ``py`` / ``python3``;
- an indented code block (4 spaces, after a blank line, outside a fence; blank lines inside continue it) whose first
  line, comments aside, is a Python import (``import x``, ``from x import y``). Shell commands and YAML never begin
  that way (``export: {servers: [...]}`` even parses as Python, so parsing alone cannot tell); a Python snippet opens
  with its imports, a complete example; one that opens so but is not Python (shell lines left in it) fails its case.

Each snippet runs in its own interpreter (``sys.executable -c``), offline, in a folder that holds what the docs'
snippets name, built once per session without training:

- ``outputs/smollm2_dspark/tb/version_0/drafter``: what ``make run`` exports, in the shape of
  ``recipes/smollm2_dspark.yaml`` (its ``target`` and ``model`` sections: the dense backbone, the vanilla Markov head,
  the confidence head, γ = 7, the 8192-token draft vocabulary, taps [1, 8, 14, 21, 28]) with untrained weights,
  written by ``save_drafter`` as ``fit``'s export callback writes it;
- ``Qwen/Qwen3-4B`` in an offline HF cache (``HF_HUB_CACHE``): a tiny random Qwen3 of Qwen3-4B's depth (36 layers);
- ``dspark_qwen3_4b_block7``: a DeepSpec-layout (``Qwen3DSparkModel``) drafter for it, written by the ``dspark-hf``
  export, tapping [1, 9, 17, 25, 33].

Their acceptance does not matter, only that the code runs; their confidence heads say so (a logit of -8 at every
position), so the schedulers verify few of their drafts and a snippet costs about what plain decoding costs.

The snippets measure this machine as ``decode()`` does for any user (kernels, rooflines, SPS tables), in a cache of
their own (``DSPARK_CACHE``): the embedded targets, the machine's kernel and roofline tables and the drafting costs
are the user's, the per-target SPS tables a copy, so the stand-in never leaves an SPS table named ``Qwen/Qwen3-4B``
in the user's cache. The snippets load the real SmolLM2 target: ``slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_FENCES = {"python", "py", "python3"}
RECIPE = ROOT / "recipes" / "smollm2_dspark.yaml"
DRAFTER = Path("outputs/smollm2_dspark/tb/version_0/drafter")  # what README.md and the docs load
QWEN = "Qwen/Qwen3-4B"
QWEN_TAPS = [1, 9, 17, 25, 33]
QWEN_DRAFTER = "dspark_qwen3_4b_block7"
TIMEOUT_S = 600  # a hung snippet fails its case instead of the session

pytestmark = pytest.mark.slow


IMPORT = re.compile(r"(import\s+[\w.]+|from\s+[\w.]+\s+import\s)")


def is_python(code: str) -> bool:
    """An indented block is Python when its first line, comments aside, is an import (see the module docstring)."""
    first = next((ln.strip() for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return IMPORT.match(first) is not None


def snippets(page: Path) -> list[tuple[int, str]]:
    """(first line, code) of each Python snippet of a Markdown page."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
        if fence:
            mark, lang, start = fence.group(1), fence.group(2).lower(), i + 1
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(mark):
                i += 1
            if lang in PYTHON_FENCES:
                found.append((start + 1, textwrap.dedent("\n".join(lines[start:i]))))
            i += 1
            continue
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            start = i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            code = textwrap.dedent("\n".join(lines[start:i])).strip("\n")
            if is_python(code):
                found.append((start + 1, code))
            continue
        i += 1
    return found


CASES = [(page, line, code) for page in PAGES for line, code in snippets(page)]


def test_the_snippets_are_found():
    """README.md's five lines are among the cases: the extraction itself is checked."""
    readme = [code for page, _, code in CASES if page.name == "README.md"]
    assert any("load_drafter" in code and "decode(" in code for code in readme)
    assert len({page for page, _, _ in CASES}) >= 3


def make_run_drafter(out: Path) -> None:
    """An untrained drafter of ``recipes/smollm2_dspark.yaml``'s shape, exported as ``fit`` exports it."""
    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.data.features.vocab import frequent_tokens
    from dspark_lightning.drafters import build_drafter
    from dspark_lightning.lightning.config import TargetConfig

    recipe = yaml.safe_load(RECIPE.read_text())
    model = recipe["model"]
    target = TargetConfig(**recipe["target"]).load()  # as fit loads it: name, taps, chat format
    torch.manual_seed(0)
    drafter = build_drafter(target, model["block_size"], backbone=model["backbone"], seq_head=model["seq_head"],
                            conf_head=model["conf_head"], draft_vocab_size=model["draft_vocab_size"])  # fmt: skip
    V = target.geometry.vocab_size
    counts = torch.arange(V, 0, -1)  # stands for the training responses' token counts: the lowest ids first
    drafter.set_draft_vocab(frequent_tokens(counts, model["draft_vocab_size"], always=target.stop_token_ids))
    unconfident(drafter)
    save_drafter(drafter, out, target)


@torch.no_grad()
def unconfident(drafter) -> None:
    """An untrained drafter's confidence head as it should be: every draft judged unlikely to survive."""
    drafter.conf_head.proj.weight.zero_()
    drafter.conf_head.proj.bias.fill_(-8.0)


def qwen3_4b_stand_in(hub: Path, drafter_dir: Path) -> None:
    """``Qwen/Qwen3-4B`` in an offline HF cache (a tiny random Qwen3, 36 layers, the tiny-debug tokenizer) and a
    DeepSpec-layout drafter for it tapping QWEN_TAPS."""
    from dspark_lightning import create, load_target
    from dspark_lightning.export.convert import export_serving
    from dspark_lightning.testing import random_target

    snapshot = hub / ("models--" + QWEN.replace("/", "--")) / "snapshots" / ("0" * 40)
    t = random_target(vocab=260, hidden=64, layers=36, family="qwen3", max_position_embeddings=4096, seed=0)
    t.model.save_pretrained(snapshot)
    load_target("tiny-debug").tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    t.tap(QWEN_TAPS)
    torch.manual_seed(0)
    drafter = create(
        "drafter", "dspark", t, block_size=7, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
    )
    unconfident(drafter)
    vocab = {"class_path": "dspark-hf", "init_args": {"with_target_vocab": True}}
    export_serving(drafter, t, vocab, drafter_dir, dtype="fp32")


def snippet_cache(root: Path) -> Path:
    """The snippets' ``DSPARK_CACHE``: the user's embedded targets, kernel and roofline tables and drafting costs
    (keyed by an exported drafter's weights hash); a copy of the user's SPS tables of the embedded targets."""
    from dspark_lightning.targets import cache_root, embedded_names

    user, cache = cache_root(), root / "cache"
    for shared in ("targets", "kernels", "roofs", "sps/draft_cost"):
        (user / shared).mkdir(parents=True, exist_ok=True)
        (cache / shared).parent.mkdir(parents=True, exist_ok=True)
        (cache / shared).symlink_to(user / shared, target_is_directory=True)
    for table in (user / "sps").glob("*.json"):
        if any(table.name.startswith(name + "-") for name in embedded_names()):
            shutil.copyfile(table, cache / "sps" / table.name)
    return cache


@pytest.fixture(scope="session")
def docs_folder(tmp_path_factory) -> Path:
    """The folder the snippets run in (see the module docstring)."""
    root = tmp_path_factory.mktemp("docs")
    make_run_drafter(root / DRAFTER)
    qwen3_4b_stand_in(root / "hub", root / QWEN_DRAFTER)
    snippet_cache(root)
    return root


@pytest.mark.parametrize(
    ("page", "line", "code"), CASES, ids=[f"{page.relative_to(ROOT)}:{line}" for page, line, _ in CASES]
)
def test_snippet_runs(docs_folder, page, line, code):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(docs_folder / "hub"),
           "DSPARK_CACHE": str(docs_folder / "cache"), "TQDM_DISABLE": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=docs_folder, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)  # fmt: skip
    assert proc.returncode == 0, f"{page.relative_to(ROOT)}:{line} failed:\n{code}\n---\n{proc.stderr[-3000:]}"
