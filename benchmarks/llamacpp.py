"""The drafter in llama.cpp, the server CPU users serve with, side by side with our runtime (docs/serving.md).

Builds llama.cpp's tools from the pinned source once (``dspark-lightning llamacpp build``, cached per CPU), converts
the target (F32, so its weights are our runtime's) and the drafter (``export --server llamacpp``, fp32) with
llama.cpp's own converter, then on the built-in eval prompts (T = 0, batch 1):

1. llama.cpp plain greedy (``llama-completion``) against llama.cpp with the drafter (``llama-speculative-simple
   --spec-type draft-dspark``, static block γ): equal text on every prompt, drafts accepted per round;
2. our ``decode()`` with the same drafter and static γ: accepted drafts per round (τ - 1) beside llama.cpp's;
   Both on the F32 target (our runtime's weights) and on the shipped Q4_1 GGUF (what CPU users run);
3. speeds: llama-bench's plain decode and prompt processing of 1 / 2 / 4 / 8 tokens (what verifying a block costs),
   llama.cpp with the drafter at γ = 1..7 with and without ``--spec-draft-p-min`` (its confidence cut), our plain
   and DSpark ``decode()``.

    python benchmarks/llamacpp.py --drafter outputs/smollm2_dspark/tb/version_0/drafter \
        --out benchmarks/results/data/llamacpp

Run alone on the machine. Writes <out>/llamacpp.json and llamacpp.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from matrix import commit, cpu_model  # noqa: E402

from dspark_lightning.checkpoint import recorded_target_args  # noqa: E402
from dspark_lightning.eval.prompts import eval_prompts  # noqa: E402
from dspark_lightning.export import export_drafter  # noqa: E402
from dspark_lightning.export import llamacpp as lc  # noqa: E402
from dspark_lightning.targets import load_target  # noqa: E402
from dspark_lightning.targets.embedded import SMOLLM2, SMOLLM2_GGUF, embedded_path, smollm2_gguf_dir  # noqa: E402

THREADS = str(min(2, os.cpu_count() or 1))


def run(cmd: list[str], timeout: int = 900) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
    return r.stdout + "\n" + r.stderr


def llama_plain(gguf: Path, prompt: str, n: int) -> tuple[str, float]:
    """llama.cpp's plain greedy continuation of ``prompt`` and its decode tokens/s."""
    cmd = [str(lc.tool("llama-completion")), "-m", str(gguf), "-p", prompt, "-n", str(n), "--temp", "0", "-t", THREADS,
           "-no-cnv", "--no-display-prompt", "-c", "4096", "--no-warmup"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"llama-completion failed: {r.stderr[-1500:]}")
    speed = re.search(r"eval time =.*?([\d.]+) tokens per second", r.stderr.split("prompt eval time")[-1])
    return r.stdout, float(speed.group(1)) if speed else float("nan")


def llama_spec(target: Path, draft: Path, prompt: str, n: int, gamma: int, p_min: float = 0.0) -> dict:
    """llama.cpp with the DSpark drafter: generated text, draft counts and decode tokens/s."""
    r = subprocess.run(lc.speculative_command(target, draft, prompt, n, gamma, p_min, int(THREADS)),
                       capture_output=True, text=True, errors="replace", timeout=900)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"llama-speculative-simple failed: {r.stderr[-1500:]}")
    log = r.stdout + "\n" + r.stderr
    out = {k: int(m.group(1)) for k in ("n_predict", "n_drafted", "n_accept")
           if (m := re.search(rf"\b{k}\s*=\s*(\d+)", log))}  # fmt: skip
    sp = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log)
    out["tok_s"] = float(sp.group(1)) if sp else float("nan")
    # stdout: the prompt's pieces, then the generated pieces (no EOG piece), then blank lines
    at = r.stdout.find(prompt)
    out["text"] = (r.stdout[at + len(prompt) :] if at >= 0 else r.stdout).rstrip()
    return out


def bench_plain(gguf: Path) -> dict:
    """llama-bench: decode of 128 tokens and prompt processing of 1, 2, 4 and 8 tokens (tokens/s)."""
    cmd = [str(lc.tool("llama-bench")), "-m", str(gguf), "-t", THREADS, "-p", "1,2,4,8", "-n", "128", "-o", "json"]
    rows = json.loads(_json_part(run(cmd)))
    res = {}
    for row in rows:
        key = f"tg{row['n_gen']}" if row["n_gen"] else f"pp{row['n_prompt']}"
        res[key] = round(row["avg_ts"], 1)
    return res


def _json_part(text: str) -> str:
    start, end = text.index("["), text.rindex("]")
    return text[start : end + 1]


def ours(target, drafter_dir: str, prompts: list[list[int]], n: int, gamma: int) -> dict:
    """Our decode(): plain and with the drafter at a static γ (T = 0, batch 1): texts, τ and tokens/s."""
    from dspark_lightning.infer import decode

    res = {}
    for name, drafter in (("plain", None), ("dspark", drafter_dir)):
        kw = {"scheduler": {"class_path": "static", "init_args": {"gamma": gamma}}} if drafter else {}
        decode(target, drafter, [prompts[0]], max_new_tokens=8, **kw)  # warm-up (kernels, the drafter's load)
        t0, rows = time.perf_counter(), []
        for p in prompts:
            r = decode(target, drafter, [p], max_new_tokens=n, batch_size=1, **kw)
            rows.append(r)
        wall = time.perf_counter() - t0
        toks = sum(len(r.token_ids[0]) for r in rows)
        rounds = sum(r.requests[0]["rounds"] for r in rows)
        res[name] = {"tok_s": round(toks / wall, 2), "tokens": toks, "rounds": rounds,
                     "tau": round(toks / rounds, 3) if rounds else None,
                     "token_ids": [r.token_ids[0] for r in rows]}  # fmt: skip
    return res


def prefixed(a: str, b: str) -> bool:
    """One text continues the other (the two loops stop at different lengths), ignoring surrounding whitespace."""
    a, b = a.strip(), b.strip()
    return bool(a and b) and (a.startswith(b) or b.startswith(a))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=str(ROOT / "outputs/smollm2_dspark/tb/version_0/drafter"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/llamacpp"))
    ap.add_argument("--prompts_per_domain", type=int, default=10)
    ap.add_argument("--sweep_per_domain", type=int, default=3, help="prompts per set for the γ / p-min sweep")
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--p_min", type=float, default=0.5, help="the --spec-draft-p-min of the sweep's second column")
    a = ap.parse_args(argv)
    out, work = Path(a.out), ROOT / "outputs" / "llamacpp"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    print("[llamacpp] tools ...", flush=True)
    lc.build()
    target_gguf = work / "target-f32.gguf"
    if not target_gguf.is_file():
        print("[llamacpp] converting the target (F32) ...", flush=True)
        lc.convert(embedded_path(SMOLLM2), target_gguf, "f32")
    print("[llamacpp] exporting the drafter ...", flush=True)
    exp = export_drafter(a.drafter, "dspark-hf", work / "draft", dtype="fp32", server="llamacpp", overwrite=True)
    draft_gguf = exp.path / lc.GGUF_FILE

    target = load_target(SMOLLM2, **recorded_target_args(a.drafter))
    sets = {d: [r.turns[0] for r in eval_prompts(d, a.prompts_per_domain)] for d in ("math", "code", "chat")}
    ids = {d: [target.encode_prompt(p) for p in ps] for d, ps in sets.items()}
    texts = {d: [target.tokenizer.decode(x, skip_special_tokens=False) for x in xs] for d, xs in ids.items()}

    ggufs = {"f32": target_gguf, "q4_1": smollm2_gguf_dir() / SMOLLM2_GGUF}  # ours in F32; the one users run
    rows, per_prompt = {}, []
    for dom in sets:
        print(f"[llamacpp] {dom}: ours plain / DSpark ...", flush=True)
        o = ours(target, a.drafter, ids[dom], a.max_new_tokens, a.gamma)
        ours_text = [target.tokenizer.decode(t, skip_special_tokens=True) for t in o["dspark"]["token_ids"]]
        for name, gguf in ggufs.items():
            print(f"[llamacpp] {dom}: llama.cpp plain / DSpark on the {name} target ...", flush=True)
            plain_speeds, spec, equal = [], [], 0
            for i, text in enumerate(texts[dom]):
                # the speculative loop may overshoot its -n by up to γ tokens: plain decodes past that, and the
                # drafted text must be a prefix of it (both cut before trailing whitespace)
                plain_text, ts = llama_plain(gguf, text, a.max_new_tokens + a.gamma + 1)
                s = llama_spec(gguf, draft_gguf, text, a.max_new_tokens, a.gamma)
                same = bool(s["text"]) and plain_text.rstrip().startswith(s["text"])
                equal += same
                plain_speeds.append(ts)
                spec.append(s)
                counts = {k: s[k] for k in ("n_predict", "n_drafted", "n_accept")}
                per_prompt.append({"target": name, "set": dom, "i": i, "equal": same, **counts})
            pred, acc = sum(s["n_predict"] for s in spec), sum(s["n_accept"] for s in spec)
            rows[f"{name}/{dom}"] = {
                "target": name, "set": dom, "prompts": len(texts[dom]),
                "llama_greedy_equal": f"{equal}/{len(texts[dom])}",
                "llama_tau": round(pred / (pred - acc), 3),  # tokens per target step: accepted + the bonus token
                "ours_tau": o["dspark"]["tau"],
                "llama_plain_tok_s": round(sum(plain_speeds) / len(plain_speeds), 1),
                "llama_dspark_tok_s": round(sum(s["tok_s"] for s in spec) / len(spec), 1),
                "ours_plain_tok_s": o["plain"]["tok_s"],
                "ours_dspark_tok_s": o["dspark"]["tok_s"],
                "ours_dspark_equals_ours_plain": o["plain"]["token_ids"] == o["dspark"]["token_ids"],
                "llama_text_continues_ours": sum(prefixed(s["text"], t) for s, t in zip(spec, ours_text, strict=True)),
            }  # fmt: skip
            print(json.dumps(rows[f"{name}/{dom}"]), flush=True)

    print("[llamacpp] llama-bench ...", flush=True)
    bench = {name: bench_plain(gguf) for name, gguf in ggufs.items()}

    print("[llamacpp] γ / p-min sweep on the q4_1 target ...", flush=True)
    sweep = []
    sub = [t for d in sets for t in texts[d][: a.sweep_per_domain]]
    plain_sub = [llama_plain(ggufs["q4_1"], t, a.max_new_tokens)[1] for t in sub]
    sweep.append({"gamma": 0, "p_min": 0.0, "tau": 1.0, "tok_s": round(sum(plain_sub) / len(plain_sub), 1)})
    for gamma in range(1, a.gamma + 1):
        for p_min in (0.0, a.p_min):
            runs = [llama_spec(ggufs["q4_1"], draft_gguf, t, a.max_new_tokens, gamma, p_min) for t in sub]
            pred, acc = sum(r["n_predict"] for r in runs), sum(r["n_accept"] for r in runs)
            sweep.append({"gamma": gamma, "p_min": p_min, "tau": round(pred / (pred - acc), 3),
                          "tok_s": round(sum(r["tok_s"] for r in runs) / len(runs), 1)})  # fmt: skip
            print(json.dumps(sweep[-1]), flush=True)

    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_model(), "cores": os.cpu_count(), "threads": THREADS,
           "commit": commit(), "llama_cpp": lc.RELEASE, "drafter": a.drafter, "gamma": a.gamma,
           "max_new_tokens": a.max_new_tokens, "sets": rows, "llama_bench": bench, "sweep": sweep,
           "per_prompt": per_prompt, "wall_min": round((time.perf_counter() - t_start) / 60, 1)}  # fmt: skip
    (out / "llamacpp.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "llamacpp.md").write_text(markdown(doc))
    print(markdown(doc))


def markdown(doc: dict) -> str:
    lines = [
        f"Measured {doc['date']} on {doc['cpu']} ({doc['cores']} cores, {doc['threads']} threads), llama.cpp "
        f"{doc['llama_cpp']}, commit {doc['commit']}; T = 0, batch 1, γ = {doc['gamma']}, {doc['max_new_tokens']} "
        "new tokens, fp32 draft GGUF; targets: F32 (our runtime's weights) and the shipped Q4_1 GGUF.",
        "",
        "| target GGUF | set | llama.cpp DSpark = llama.cpp plain | τ llama.cpp | τ ours | llama.cpp plain tok/s "
        "| llama.cpp DSpark tok/s | ours plain tok/s | ours DSpark tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["sets"].values():
        lines.append(
            f"| {r['target']} | {r['set']} | {r['llama_greedy_equal']} | {r['llama_tau']} | {r['ours_tau']} | "
            f"{r['llama_plain_tok_s']} | {r['llama_dspark_tok_s']} | {r['ours_plain_tok_s']} | "
            f"{r['ours_dspark_tok_s']} |"
        )
    lines += [
        "",
        "llama-bench, tokens/s (pp_k: prompt processing of k tokens, what verifying k - 1 drafts costs; "
        "tg128: plain decode):",
        "",
        "| GGUF | pp1 | pp2 | pp4 | pp8 | tg128 |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in doc["llama_bench"].items():
        cells = " | ".join(str(r.get(k, "–")) for k in ("pp1", "pp2", "pp4", "pp8", "tg128"))
        lines.append(f"| {name} | {cells} |")
    lines += ["", "llama.cpp on the Q4_1 target with the drafter, by γ and --spec-draft-p-min (γ 0: plain):", "",
              "| γ | p-min | τ | tok/s |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {s['gamma']} | {s['p_min']:g} | {s['tau']} | {s['tok_s']} |" for s in doc["sweep"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
