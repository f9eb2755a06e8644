"""The bad-input table, shared by ``tests/e2e/test_fuzz.py`` and ``scripts/fuzz_report.py``.

Every case is an argv for ``dspark-lightning`` run from a scratch workspace (:func:`make_workspace`) that holds a tiny
exported drafter, corrupted copies of it under ``bad/`` and a few good and bad input files. Each must end with exit
code 2, one ``dspark-lightning <cmd>: error: ...`` line, no traceback and no pre-existing file changed.
Paths in the argv are relative to the workspace; ``{TINY}`` is the tiny-debug recipe.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny_debug.yaml")
ERROR_LINE = re.compile(r"^dspark-lightning [a-z-]+: error: \S")
ANY_ERROR_LINE = re.compile(r"^dspark-lightning( [a-z-]+)?: error: \S")  # the figures count the old prefix too


def _drafter_variants() -> dict[str, object]:
    """``bad/<name>`` -> a config.json edit (a function of the parsed config) or raw bytes for a file."""

    def drop(*keys):
        return lambda c: {k: v for k, v in c.items() if k not in keys}

    def put(path, value):
        def edit(c):
            node = c
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            return c

        return edit

    return {
        "trunc_config": ("config.json", lambda raw: raw[: len(raw) // 2]),
        "trunc_weights": ("model.safetensors", lambda raw: raw[: len(raw) // 3]),
        "weights_garbage": ("model.safetensors", lambda raw: b"\x00garbage" * 64),
        "weights_empty": ("model.safetensors", lambda raw: b""),
        "config_not_json": ("config.json", lambda raw: b"not json at all {"),
        "config_list": ("config.json", lambda raw: b"[1, 2, 3]\n"),
        "config_empty": ("config.json", lambda raw: b""),
        "no_geometry": drop("geometry"),
        "no_block_size": drop("block_size"),
        "no_weights_sha": drop("weights_sha256"),
        "no_target": drop("target"),
        "no_backbone": drop("backbone"),
        "mask_oob": put(["mask_token_id"], 10**6),
        "mask_neg": put(["mask_token_id"], -1),
        "mask_str": put(["mask_token_id"], "x"),
        "block_huge": put(["block_size"], 100000),
        "block_zero": put(["block_size"], 0),
        "block_neg": put(["block_size"], -3),
        "block_str": put(["block_size"], "four"),
        "rank_neg": put(["seq_head", "init_args", "rank"], -1),
        "layers_neg": put(["backbone", "init_args", "num_layers"], -2),
        "unknown_backbone": put(["backbone", "class_path"], "nope"),
        "unknown_seq_head": put(["seq_head", "class_path"], "nope"),
        "bad_format_version": put(["format_version"], 99),
        "target_unknown": put(["target", "name"], "no-such-target"),
        "geometry_str": put(["geometry"], "wide"),
        "vocab_mismatch": put(["geometry", "vocab_size"], 7),
    }


def make_workspace(root: Path) -> Path:
    """A tiny drafter in ``drafter/``, its corrupted copies in ``bad/<name>/`` and the input files the cases name."""
    import shutil

    import torch

    from dspark_lightning import create, load_target
    from dspark_lightning.checkpoint import save_drafter

    root.mkdir(parents=True, exist_ok=True)
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    good = save_drafter(
        create(
            "drafter", "dspark", target, block_size=2, backbone={"class_path": "dense", "init_args": {"num_layers": 1}}
        ),
        root / "drafter",
        target,
    )
    for name, edit in _drafter_variants().items():
        bad = root / "bad" / name
        shutil.copytree(good, bad)
        if isinstance(edit, tuple):
            file, fn = edit
            (bad / file).write_bytes(fn((bad / file).read_bytes()))
        else:
            cfg = edit(json.loads((bad / "config.json").read_text()))
            (bad / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "bad" / "no_weights").mkdir()
    shutil.copy(good / "config.json", root / "bad" / "no_weights" / "config.json")
    (root / "emptydir").mkdir()
    (root / "adir").mkdir()
    (root / "adir" / "keep.txt").write_text("keep")
    (root / "existing.txt").write_text("precious\n")
    (root / "prompts.jsonl").write_text('{"turns": ["What is 2+2?"]}\n{"turns": ["Say hi."]}\n')
    (root / "empty.jsonl").write_text("")
    (root / "garbage.jsonl").write_text("{not json\n")
    (root / "noturns.jsonl").write_text('{"x": 1}\n')
    (root / "garbage.json").write_text("{]")
    (root / "sps_empty.json").write_text('{"tokens": [], "sps": []}')
    (root / "garbage.pt").write_bytes(b"\x80\x04garbage" * 10)
    (root / "garbage.ckpt").write_bytes(b"PK\x03\x04garbage" * 10)
    (root / "garbage.yaml").write_text("trainer: [unclosed\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    return root


_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime_ns) -> sha256: unchanged files are hashed once


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _DIGESTS:
                _DIGESTS[key] = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(root))] = _DIGESTS[key]
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Pre-existing files that were modified or removed."""
    return [k for k, v in before.items() if after.get(k) != v]


def classify(code: int | None, err: str) -> str:
    """``clean`` (exit 2, a one-line ``dspark-lightning [cmd]: error:`` last) | ``messy`` (exit 2, but a usage text, a
    multi-line message or a progress bar last) | ``traceback`` | ``hang`` (``code`` None) | ``silent`` (exit 0)."""
    if code is None:
        return "hang"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == 2:
        return "clean" if lines and ANY_ERROR_LINE.match(lines[-1]) else "messy"
    return "silent" if code == 0 else "traceback"


def _cases() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []

    def add(prefix: str, base: list[str], variants: dict[str, list[str]]) -> None:
        out.extend((f"{prefix}-{k}", base + v) for k, v in variants.items())

    dec = ["decode", "--target", "tiny-debug", "--prompt", "hi", "--max_new_tokens", "4"]
    add("decode", dec, {
        "batch_size=-1": ["--batch_size", "-1"],
        "batch_size=0": ["--batch_size", "0"],
        "batch_size=x": ["--batch_size", "x"],
        "max_new_tokens=0": ["--max_new_tokens", "0"],
        "max_new_tokens=-5": ["--max_new_tokens", "-5"],
        "max_new_tokens=1e9": ["--max_new_tokens", "1000000000"],
        "max_new_tokens=1.5": ["--max_new_tokens", "1.5"],
        "temperature=-1": ["--temperature", "-1"],
        "temperature=nan": ["--temperature", "nan"],
        "temperature=inf": ["--temperature", "inf"],
        "temperature=abc": ["--temperature", "abc"],
        "top_p=1.5": ["--top_p", "1.5"],
        "top_p=-0.1": ["--top_p", "-0.1"],
        "top_p=nan": ["--top_p", "nan"],
        "top_p=0": ["--top_p", "0"],
        "top_k=0": ["--top_k", "0"],
        "top_k=-3": ["--top_k", "-3"],
        "limit=-1": ["--prompts", "prompts.jsonl", "--limit", "-1"],
        "prompts-missing": ["--prompts", "missing.jsonl"],
        "prompts-dir": ["--prompts", "adir"],
        "prompts-garbage": ["--prompts", "garbage.jsonl"],
        "prompts-empty": ["--prompts", "empty.jsonl"],
        "prompts-noturns": ["--prompts", "noturns.jsonl"],
        "json_out-dir": ["--json_out", "adir"],
        "json_out-under-file": ["--json_out", "existing.txt/out.json"],
        "json_out-missing-parent": ["--json_out", "missing/sub/out.json"],
        "gamma=-1": ["--drafter", "drafter", "--scheduler", "{class_path: static, init_args: {gamma: -1}}"],
        "threshold=1.5": ["--drafter", "drafter",
                          "--scheduler", "{class_path: threshold, init_args: {threshold: 1.5}}"],
        "threshold=nan": ["--drafter", "drafter",
                          "--scheduler", "{class_path: threshold, init_args: {threshold: .nan}}"],
        "scheduler-bad-argument": ["--drafter", "drafter", "--scheduler", "static:depth=3"],
        "scheduler-unknown": ["--drafter", "drafter", "--scheduler", "nope"],
        "sps-missing": ["--drafter", "drafter", "--sps", "missing.json"],
        "sps-garbage": ["--drafter", "drafter", "--sps", "garbage.json"],
        "sps-empty": ["--drafter", "drafter", "--sps", "sps_empty.json"],
        "batching-unknown": ["--batching", "nope"],
        "verifier-unknown": ["--verifier", "nope"],
        "device-unknown": ["--device", "nope"],
        "dtype-unknown": ["--dtype", "nope"],
        "drafter_dtype-unknown": ["--drafter", "drafter", "--drafter_dtype", "nope"],
        "stop-empty": ["--stop", ""],
        "unknown-flag": ["--no_such_flag", "1"],
        "drafter-missing": ["--drafter", "missing"],
        "drafter-file": ["--drafter", "prompts.jsonl"],
        "drafter-emptydir": ["--drafter", "emptydir"],
        "prompt-empty-no_chat": ["--prompt", "", "--no_chat", "true"],
        "prompt-200k": ["--prompt", "x " * 100_000],
        "prompt-near-limit": ["--no_chat", "true", "--prompt", "a" * 2045],
    })  # fmt: skip
    add("decode", ["decode", "--prompt", "hi", "--max_new_tokens", "4"], {
        "target-unknown": ["--target", "nope"],
        "target-missing-dir": ["--target", "/nonexistent/model"],
        "target-emptydir": ["--target", "emptydir"],
    })  # fmt: skip
    out.append(("decode-no-prompts", ["decode", "--target", "tiny-debug"]))
    for name in _drafter_variants() | {"no_weights": None}:
        out.append((f"decode-drafter-{name}", dec + ["--drafter", f"bad/{name}"]))

    ev = ["eval", "--drafter", "drafter", "--out", "evalout", "--prompts_per_domain", "1", "--max_new_tokens", "4"]
    add("eval", ev, {
        "batch_size=-1": ["--batch_size", "-1"],
        "batch_size=0": ["--batch_size", "0"],
        "prompts_per_domain=-1": ["--prompts_per_domain", "-1"],
        "prompts_per_domain=0": ["--prompts_per_domain", "0"],
        "max_new_tokens=0": ["--max_new_tokens", "0"],
        "temperature=-1": ["--temperature", "-1"],
        "temperature=nan": ["--temperature", "nan"],
        "domain-unknown": ["--domains", "nope"],
        "domain-mixed": ["--domains", "[math,nope]"],
        "dataset-missing": ["--dataset", "x=missing.jsonl"],
        "dataset-no-name": ["--dataset", "prompts.jsonl"],
        "dataset-garbage": ["--dataset", "x=garbage.jsonl"],
        "dataset-domain-unknown": ["--dataset", "x=prompts.jsonl:nope"],
        "out-file": ["--out", "existing.txt"],
        "out-under-file": ["--out", "existing.txt/sub"],
        "scheduler-unknown": ["--scheduler", "nope"],
        "sps-garbage": ["--scheduler", "hardware_aware", "--sps", "garbage.json"],
        "drafter-dup": ["--drafter+", "drafter"],
        "seed-str": ["--seed", "x"],
    })  # fmt: skip
    out.append(("eval-no-drafter", ["eval", "--out", "evalout"]))
    out.append(("eval-no-out", ["eval", "--drafter", "drafter"]))
    for name in ("trunc_config", "trunc_weights", "no_geometry", "mask_oob", "block_huge", "target_unknown"):
        out.append((f"eval-drafter-{name}", ["eval", "--drafter", f"bad/{name}", "--out", "evalout"]))

    be = ["bench", "--drafter", "drafter", "--out", "benchout", "--prompts_per_domain", "1", "--max_new_tokens", "4"]
    add("bench", be + ["--repeats", "1"], {
        "batches=0": ["--batches", "0"],
        "batches=-1": ["--batches", "1", "-1"],
        "temperatures=-1": ["--temperatures", "-1"],
        "temperatures=nan": ["--temperatures", "[0,nan]"],
        "prompt_lookup_tokens=-1": ["--prompt_lookup_tokens", "-1"],
        "prompts_per_domain=0": ["--prompts_per_domain", "0"],
        "domain-unknown": ["--domains", "nope"],
        "out-file": ["--out", "existing.txt"],
        "max_new_tokens=-1": ["--max_new_tokens", "-1"],
        "drafter-missing": ["--drafter", "missing"],
        "drafter-trunc_weights": ["--drafter", "bad/trunc_weights"],
    })  # fmt: skip
    add("bench", be, {"repeats=0": ["--repeats", "0"], "repeats=-1": ["--repeats", "-1"]})

    cal = ["calibrate", "--drafter", "drafter", "--prompts_per_domain", "2", "--max_new_tokens", "8"]
    add("calibrate", cal, {
        "batch_size=-1": ["--batch_size", "-1"],
        "batch_size=0": ["--batch_size", "0"],
        "temperature=-1": ["--temperature", "-1"],
        "temperature=nan": ["--temperature", "nan"],
        "temperature=inf": ["--temperature", "inf"],
        "heldout_fraction=1.5": ["--heldout_fraction", "1.5"],
        "heldout_fraction=-0.1": ["--heldout_fraction", "-0.1"],
        "heldout_fraction=nan": ["--heldout_fraction", "nan"],
        "prompts_per_domain=0": ["--prompts_per_domain", "0"],
        "prompts_per_domain=-1": ["--prompts_per_domain", "-1"],
        "max_new_tokens=0": ["--max_new_tokens", "0"],
        "min_rows=-1": ["--min_rows", "-1"],
        "min_class=-1": ["--min_class", "-1"],
        "rollouts-garbage": ["--rollouts", "garbage.pt"],
        "rollouts-missing": ["--rollouts", "missing.pt"],
        "rollouts-dir": ["--rollouts", "adir"],
        "rollouts-json": ["--rollouts", "prompts.jsonl"],
        "report_dir-file": ["--report_dir", "existing.txt"],
        "report_dir-under-file": ["--report_dir", "existing.txt/r"],
        "domain-unknown": ["--domains", "nope"],
    })  # fmt: skip
    for name in ("trunc_config", "trunc_weights", "no_weights_sha", "mask_oob", "block_huge", "rank_neg"):
        out.append((f"calibrate-drafter-{name}", ["calibrate", "--drafter", f"bad/{name}"]))
    out.append(("calibrate-drafter-missing", ["calibrate", "--drafter", "missing"]))

    sw = [
        "threshold-sweep",
        "--drafter",
        "drafter",
        "--out",
        "sw",
        "--prompts_per_domain",
        "1",
        "--max_new_tokens",
        "4",
    ]
    add("threshold-sweep", sw, {
        "thresholds=1.5": ["--thresholds", "[0.5,1.5]"],
        "thresholds=-0.1": ["--thresholds", "-0.1"],
        "thresholds=nan": ["--thresholds", "nan"],
        "mode-unknown": ["--mode", "nope"],
        "temperature=-1": ["--temperature", "-1"],
        "batch_size=-1": ["--batch_size", "-1"],
        "batch_size=0": ["--batch_size", "0"],
        "domain-unknown": ["--domains", "nope"],
        "out-file": ["--out", "existing.txt"],
        "two-drafters": ["--drafter+", "b=drafter"],
    })  # fmt: skip
    out.append(("threshold-sweep-no-drafter", ["threshold-sweep", "--out", "sw"]))

    sb = ["serve-bench", "--drafter", "drafter", "--out", "sb", "--prompts_per_domain", "1", "--max_new_tokens", "4"]
    add("serve-bench", sb + ["--window_s", "0.5"], {
        "concurrency=0": ["--concurrency", "0"],
        "concurrency=-1": ["--concurrency", "1", "-1"],
        "methods-unknown": ["--methods", "nope"],
        "methods-static-neg": ["--methods", "static:-1"],
        "methods-static-str": ["--methods", "static:x"],
        "methods-threshold-2": ["--methods", "{class_path: threshold, init_args: {threshold: 2}}"],
        "repeats=0": ["--repeats", "0"],
        "batching-unknown": ["--batching", "nope"],
        "temperature=-1": ["--temperature", "-1"],
        "out-file": ["--out", "existing.txt"],
        "sps-garbage": ["--sps", "garbage.json"],
        "max_new_tokens=0": ["--max_new_tokens", "0"],
    })  # fmt: skip
    add("serve-bench", sb, {
        "window_s=-1": ["--window_s", "-1"],
        "window_s=0": ["--window_s", "0"],
        "window_s=nan": ["--window_s", "nan"],
    })  # fmt: skip

    pr = ["profile", "--target", "tiny-debug", "--repeats", "1", "--max_tokens", "4", "--context_len", "8"]
    add("profile", pr, {
        "max_tokens=0": ["--max_tokens", "0"],
        "max_tokens=-1": ["--max_tokens", "-1"],
        "context_len=-1": ["--context_len", "-1"],
        "context_len=1e6": ["--context_len", "1000000"],
        "repeats=0": ["--repeats", "0"],
        "repeats=-1": ["--repeats", "-1"],
        "out-dir": ["--out", "adir"],
        "out-under-file": ["--out", "existing.txt/sps.json"],
        "plot-dir": ["--plot", "adir"],
        "verifier-unknown": ["--verifier", "nope"],
        "target-unknown": ["--target", "nope"],
    })  # fmt: skip

    ex = ["export", "--drafter", "drafter", "--out", "exp"]
    add("export", ex, {
        "layout-unknown": ["--layout", "nope"],
        "out-file": ["--out", "existing.txt"],
        "out-nonempty": ["--out", "adir"],
        "dtype-unknown": ["--dtype", "nope"],
        "num_anchors=-1": ["--layout", "{class_path: dspark-hf, init_args: {num_anchors: -1}}"],
        "num_anchors=0": ["--layout", "{class_path: dspark-hf, init_args: {num_anchors: 0}}"],
        "layout-argument": ["--layout", "{class_path: dspark-hf, init_args: {colour: 1}}"],
        "layout-not-yaml": ["--layout", "{class_path: [dspark-hf"],
        "target-unknown": ["--target", "nope"],
    })  # fmt: skip
    for name in ("trunc_config", "trunc_weights", "no_geometry", "config_list", "mask_oob", "block_huge"):
        out.append((f"export-drafter-{name}", ["export", "--drafter", f"bad/{name}", "--out", "exp"]))
    out.append(("export-drafter-missing", ["export", "--drafter", "missing", "--out", "exp"]))

    prep = ["prepare", "--config", "{TINY}"]
    add("prepare", prep, {
        "batch_size=-1": ["--data.batch_size=-1"],
        "batch_size=0": ["--data.batch_size=0"],
        "max_length=0": ["--data.max_length=0"],
        "max_length=-1": ["--data.max_length=-1"],
        "heldout_fraction=1.5": ["--data.heldout_fraction=1.5"],
        "heldout_fraction=-0.1": ["--data.heldout_fraction=-0.1"],
        "max_anchors=0": ["--data.max_anchors=0"],
        "source-unknown": ["--data.sources=[nope]"],
        "target-unknown": ["--target.name=nope"],
        "feature_dtype-unknown": ["--data.feature_dtype=nope"],
        "regen-max_new_tokens=-1": ["--data.regen.max_new_tokens=-1"],
        "regen-batch_size=0": ["--data.regen.batch_size=0"],
        "regen-answers_per_prompt=0": ["--data.regen.answers_per_prompt=0"],
        "regen-backend-unknown": ["--data.regen.backend={class_path: nope}"],
        "regen-backend-argument": ["--data.regen.backend={class_path: hf, init_args: {colour: 1}}"],
        "regen-backend-missing": ["--data.regen.backend=openai"],
        "regen-backend-not-yaml": ["--data.regen.backend={class_path: [hf"],
        "min_supervised=-1": ["--data.min_supervised=-1"],
        "rank=-1": ["--rank", "-1", "--world_size", "2"],
        "world_size=0": ["--world_size", "0"],
        "rank>=world": ["--rank", "3", "--world_size", "2"],
    })  # fmt: skip
    out.append(("prepare-config-missing", ["prepare", "--config", "missing.yaml"]))
    out.append(("prepare-config-garbage", ["prepare", "--config", "garbage.yaml"]))

    fit = ["fit", "--config", "{TINY}"]
    add("fit", fit, {
        "block_size=100000": ["--model.block_size=100000"],
        "block_size=0": ["--model.block_size=0"],
        "block_size=-1": ["--model.block_size=-1"],
        "rank=-1": ["--model.seq_head.init_args.rank=-1"],
        "mask_token_id=1e6": ["--model.mask_token_id=1000000"],
        "mask_token_id=-1": ["--model.mask_token_id=-1"],
        "max_anchors=0": ["--data.max_anchors=0"],
        "batch_size=-1": ["--data.batch_size=-1"],
        "batch_size=0": ["--data.batch_size=0"],
        "max_length=0": ["--data.max_length=0"],
        "heldout_fraction=2": ["--data.heldout_fraction=2"],
        "lr=-1": ["--model.optim.lr=-1"],
        "lr=nan": ["--model.optim.lr=.nan"],
        "lr=inf": ["--model.optim.lr=.inf"],
        "optimizer": ["--optimizer=Adam"],
        "lr_scheduler": ["--lr_scheduler=StepLR", "--lr_scheduler.step_size=1"],
        "ckpt_path-garbage": ["--ckpt_path=garbage.ckpt"],
        "ckpt_path-missing": ["--ckpt_path=missing.ckpt"],
        "ckpt_path-dir": ["--ckpt_path=adir"],
        "target-unknown": ["--target.name=nope"],
        "export_dir-file": ["--export.dir=existing.txt"],
        "export_dir-nonempty": ["--export.dir=adir"],
        "unknown-key": ["--model_typo=3"],
        "trainer-max_steps=-5": ["--trainer.max_steps=-5"],
    })  # fmt: skip
    out.append(("fit-config-missing", ["fit", "--config", "missing.yaml"]))
    out.append(("fit-config-garbage", ["fit", "--config", "garbage.yaml"]))
    out.append(("fit-config-list", ["fit", "--config", "list.yaml"]))
    out.append(("predict", ["predict", "--config", "{TINY}"]))
    return out


CASES: list[tuple[str, list[str]]] = _cases()


def argv_for(argv: list[str]) -> list[str]:
    return [a.replace("{TINY}", TINY) for a in argv]
