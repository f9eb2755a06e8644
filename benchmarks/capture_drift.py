"""How far the features regeneration captures (the bf16 copy that answers) sit from the fp32 target's features.

    python benchmarks/capture_drift.py --out benchmarks/results/data/capture_drift          # (make capture-drift)

Takes the first ``--prompts`` training prompts of ``--recipe`` (make run's by default), regenerates them with capture
(the recipe's regeneration settings and precision), then runs the fp32 target over exactly the captured tokens (the
feature pass) and compares, on every position the capture ran: the tapped context and the last hidden state (relative
RMS error and cosine), and at supervised positions the target-law summary computed from each (argmax agreement,
|Δ log-sum-exp|). For scale it gives the same numbers for fp32 features rounded to the cache's bf16, the rounding
every cached feature already takes. A drafter trained on captured features is also decoded (make-run-acceptance);
this file bounds the input drift. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from dspark_lightning.cli.prepare import check_cache, parse_recipe
from dspark_lightning.data.features.extract import captured_sample, extract_features, target_law_summary
from dspark_lightning.data.regen.regenerate import load_captured, regenerate
from dspark_lightning.devices import cpu_model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/smollm2_dspark.yaml")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--out", default="benchmarks/results/data/capture_drift")
    a = ap.parse_args()
    dm, _ = parse_recipe("prepare", ["--config", a.recipe], check_cache)
    job = dm.prepare_job(progress=True)
    prompts = job.prompts["train"][: a.prompts]
    target = job.load_target()  # the features' target, in target.dtype (fp32 on a CPU)
    regen_target = job.load_regen_target() if job.load_regen_target is not None else target
    settings = job.regen.settings()
    with tempfile.TemporaryDirectory() as tmp:
        st = regenerate(regen_target, prompts, Path(tmp) / "r.jsonl", seed=job.seed, capture_dir=Path(tmp) / "cap",
                        **settings)  # fmt: skip
        caps = {k: v for part in load_captured(Path(tmp) / "cap") for k, v in part.items()}
    samples = []
    for sid, c in caps.items():  # the rendered prompt is the row's own: build the sample from the capture alone
        row = {"id": sid, "input_ids": c["tokens"], "loss_mask": [0] * c["prompt_len"]}
        s = captured_sample(row, c, max_length=dm.max_length)
        if s is not None:
            samples.append(s)
    rows = [
        {"id": s["id"], "input_ids": s["input_ids"].tolist(), "loss_mask": s["loss_mask"].tolist()} for s in samples
    ]
    full = {s["id"]: s for s in extract_features(target, rows, feature_dtype="float32", progress=True)}
    cap_c, ref_c, cap_h, ref_h, sup_cap, sup_ref = [], [], [], [], [], []
    for s in samples:
        n = len(s["input_ids"]) - 1  # the last position was never run
        r = full[s["id"]]
        cap_c.append(s["context"][:n].float())
        ref_c.append(r["context"][:n])
        cap_h.append(s["hidden"][:n].float())
        ref_h.append(r["hidden"][:n])
        m = s["loss_mask"][:n].bool()
        sup_cap.append(s["hidden"][:n][m].float())
        sup_ref.append(r["hidden"][:n][m])
    cap_c, ref_c, cap_h, ref_h = map(torch.cat, (cap_c, ref_c, cap_h, ref_h))
    lse_c, top_c = target_law_summary(target, torch.cat(sup_cap))
    lse_r, top_r = target_law_summary(target, torch.cat(sup_ref))
    lse_b, top_b = target_law_summary(target, torch.cat(sup_ref).bfloat16().float())
    res = {
        "captured": {"context_rel_rms": _rel(cap_c, ref_c), "hidden_rel_rms": _rel(cap_h, ref_h),
                     "context_cos": _cos(cap_c, ref_c), "hidden_cos": _cos(cap_h, ref_h),
                     "argmax_agree": float((top_c == top_r).float().mean()),
                     "lse_abs_mean": float((lse_c - lse_r).abs().mean())},
        "fp32_rounded_to_bf16": {"context_rel_rms": _rel(ref_c.bfloat16().float(), ref_c),
                                 "hidden_rel_rms": _rel(ref_h.bfloat16().float(), ref_h),
                                 "context_cos": _cos(ref_c.bfloat16().float(), ref_c),
                                 "hidden_cos": _cos(ref_h.bfloat16().float(), ref_h),
                                 "argmax_agree": float((top_b == top_r).float().mean()),
                                 "lse_abs_mean": float((lse_b - lse_r).abs().mean())},
    }  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"recipe": a.recipe, "prompts": len(prompts), "samples": len(samples), "positions": int(cap_c.shape[0]),
            "supervised_positions": int(top_r.numel()), "regen_dtype": str(next(regen_target.parameters()).dtype),
            "target_dtype": str(target.dtype), "new_tokens": st["tokens"], "cpu": cpu_model(),
            "machine": platform.machine(), "threads": torch.get_num_threads(), "commit": commit,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capture_drift.json").write_text(json.dumps({"info": info, "drift": res}, indent=2) + "\n")
    lines = [f"Captured features ({info['regen_dtype']} regeneration) against the {info['target_dtype']} target's "
             f"feature pass over the same tokens: {info['samples']} conversations, {info['positions']} positions "
             f"({info['supervised_positions']} supervised); {info['cpu']}, commit {commit}, {info['date']}", "",
             "| features | context rel. RMS | hidden rel. RMS | context cos | hidden cos | target argmax agree "
             "(supervised) | mean abs Δ logsumexp |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, d in res.items():
        lines.append(f"| {name} | {d['context_rel_rms']:.4f} | {d['hidden_rel_rms']:.4f} | {d['context_cos']:.5f} | "
                     f"{d['hidden_cos']:.5f} | {d['argmax_agree']:.4f} | {d['lse_abs_mean']:.4f} |")  # fmt: skip
    (out / "capture_drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
