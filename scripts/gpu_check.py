"""The accelerator check: losslessness, a short bf16 fit, throughput and the SPS profile on one device.

    bash scripts/gpu_check.sh                          (on a GPU machine; ≤ 8 minutes on one GPU)
    python scripts/gpu_check.py --device cpu --quick   (the same code paths on a CPU, in about a minute)

Targets are built from configs with random weights (nothing is downloaded): the tiny one for the correctness
checks, one of SmolLM2-135M's exact shape for the timings (random weights time like real ones). Prints one
markdown table and writes ``gpu_check.json`` / ``gpu_check.md`` to ``--out``. Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "infer"))  # chi2_pvalue / exact_marginals, HostReads: shared with the CPU tests

TINY_SHAPE = {"vocab_size": 260, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
TOY_SHAPE = {**TINY_SHAPE, "vocab_size": 8, "hidden_size": 32, "intermediate_size": 64}  # exact laws enumerable
SMOLLM2_SHAPE = {  # SmolLM2-135M's geometry (Llama)
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}


def random_llama(shape: dict, device, dtype, seed: int = 0, init: float = 0.3):
    """A random Llama target of ``shape`` with the tiny-debug byte-level tokenizer, on ``device`` in ``dtype``."""
    from dspark_lightning.testing import random_target

    rest = {k: v for k, v in shape.items() if k not in ("vocab_size", "hidden_size", "num_hidden_layers")}
    target = random_target(shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"], init, seed,
                           max_position_embeddings=2048, **rest)  # fmt: skip
    target.model.to(device=device, dtype=dtype)
    return target


def random_dspark(target, block_size: int = 4, seed: int = 0):
    from dspark_lightning import create

    torch.manual_seed(seed)
    d = create(
        "drafter",
        "dspark",
        target,
        block_size=block_size,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        mask_token_id=1,
    )
    return d.to(device=target.device, dtype=target.dtype).eval()


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def check_greedy(device, dtype, n_tokens: int) -> dict:
    """bf16 target + drafter: decode() equals HF generate() of the same bf16 model, token for token."""
    from dspark_lightning.infer import decode

    target = random_llama(TINY_SHAPE, device, dtype)
    drafter = random_dspark(target)
    prompts = [[5, 6, 7, 8], [40, 41, 42], [100, 3, 99, 7, 12], [9]]
    ok = 0
    for p in prompts:
        want = hf_greedy(target, p, n_tokens)
        for sched in ("static", "hardware_aware"):
            got = decode(target, drafter, [p], max_new_tokens=n_tokens, scheduler=sched, stop_token_ids=[]).token_ids[0]
            ok += int(got == want)
    total = 2 * len(prompts)
    return {"check": f"greedy == HF generate ({_dt(dtype)})", "ok": ok == total, "detail": f"{ok}/{total} equal"}


def hf_greedy(target, ids, n):
    """HF greedy continuation on the target's device, in the target's dtype."""
    out = target.model.generate(torch.tensor([ids], device=target.device), do_sample=False, max_new_tokens=n,
                                pad_token_id=0, eos_token_id=None)  # fmt: skip
    return out[0, len(ids) :].tolist()


def check_chi2(device, dtype, samples: int) -> dict:
    """T = 1 output law of decode() with a random drafter against the exact law of the target (vocab 8)."""
    from infer_helpers import chi2_pvalue, exact_marginals

    from dspark_lightning.infer import SamplingParams, decode

    target = random_llama(TOY_SHAPE, device, dtype, seed=1, init=0.15)
    prompt = [1, 2, 3, 4]
    law = exact_marginals(_on_cpu_fp32(target), prompt, 4, SamplingParams(1.0))
    res = decode(target, random_dspark(target, 3), [prompt] * samples, max_new_tokens=4, temperature=1.0, seed=3,
                 stop_token_ids=[])  # fmt: skip
    out = torch.tensor(res.token_ids)
    pv = [chi2_pvalue(torch.bincount(out[:, k], minlength=8).double(), law[k]) for k in (1, 3)]
    # the exact law is the fp32 copy's; a bf16 target's own law differs by rounding, so the bar is loose (1e-4)
    return {"check": f"χ² output law, T = 1 ({_dt(dtype)}, {samples} samples)", "ok": min(pv) > 1e-4,
            "detail": "p = " + ", ".join(f"{v:.3g}" for v in pv)}  # fmt: skip


def _on_cpu_fp32(target):
    import copy

    from dspark_lightning import load_target

    model = copy.deepcopy(target.model).to("cpu", torch.float32)
    return load_target(model, layer_ids=target.geometry.layer_ids, tokenizer=target.tokenizer)


def check_fit(device, steps: int, precision: str, work: Path) -> dict:
    """A short ``fit`` of the tiny recipe on the device (data prepared first, as on a cluster)."""
    acc = "gpu" if torch.device(device).type == "cuda" else "cpu"
    # python_stdlib prompts need no dataset package (the device machine has no registry to install them from);
    # no TensorBoard logger or rich progress bar for the same reason
    common = ["--config", str(ROOT / "recipes" / "tiny_debug.yaml"), f"--data.work_dir={work}/data",
              "--data.sources=[{class_path: python_stdlib, init_args: {limit: 24}}]"]  # fmt: skip
    fit = [sys.executable, "-m", "dspark_lightning.cli", "fit", *common, f"--trainer.max_steps={steps}",
           f"--trainer.precision={precision}", f"--trainer.accelerator={acc}", f"--trainer.default_root_dir={work}",
           f"--trainer.val_check_interval={max(1, steps // 2)}", "--trainer.logger=false", "--trainer.callbacks=[]",
           f"--export.dir={work}/drafter"]  # fmt: skip
    prepare = [sys.executable, "-m", "dspark_lightning.cli", "prepare", *common]
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    runs = [subprocess.run(c, capture_output=True, text=True, env=env, cwd=work) for c in (prepare, fit)]
    wall = time.perf_counter() - t0
    bad = next((r for r in runs if r.returncode != 0), None)
    if bad is not None:
        tail = (bad.stderr or bad.stdout).strip().splitlines()[-3:]
        return {"check": f"fit {steps} steps ({precision})", "ok": False, "detail": " · ".join(tail).replace("|", "/")}
    exported = sorted(work.glob("**/drafter/model.safetensors"))
    return {"check": f"fit {steps} steps ({precision})", "ok": bool(exported),
            "detail": f"{wall:.0f} s wall (prepare + fit), export {'written' if exported else 'MISSING'}"}  # fmt: skip


def time_decode(target, drafter, prompts, n_tokens, **kw) -> float:
    from dspark_lightning.infer import decode

    sync(target.device)
    t0 = time.perf_counter()
    res = decode(target, drafter, prompts, max_new_tokens=n_tokens, stop_token_ids=[], **kw)
    sync(target.device)
    return sum(len(t) for t in res.token_ids) / (time.perf_counter() - t0)


def time_generate(target, prompts, n_tokens) -> float:
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long, device=target.device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, L - len(p) :] = torch.tensor(p)
        mask[i, L - len(p) :] = 1
    sync(target.device)
    t0 = time.perf_counter()
    target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_tokens,
                          min_new_tokens=n_tokens, pad_token_id=0, eos_token_id=None)  # fmt: skip
    sync(target.device)
    return len(prompts) * n_tokens / (time.perf_counter() - t0)


def check_throughput(device, dtype, shape: dict, batches: list[int], n_tokens: int) -> list[dict]:
    """tok/s of HF generate(), plain decode() and decode() with a random DSpark drafter (τ ≈ 1: overhead only)."""
    target = random_llama(shape, device, dtype)
    drafter = random_dspark(target, block_size=7)
    rows = []
    for b in batches:
        prompts = [[(7 * i + j) % 250 + 3 for j in range(32 + i)] for i in range(b)]
        time_decode(target, None, prompts[:1], 4)  # warm-up (allocations, kernels)
        time_generate(target, prompts[:1], 4)
        hf = time_generate(target, prompts, n_tokens)
        plain = time_decode(target, None, prompts, n_tokens)
        spec = time_decode(target, drafter, prompts, n_tokens, scheduler="static")
        rows.append({"check": f"tok/s, batch {b}, {n_tokens} tokens", "ok": True,
                     "detail": f"HF generate {hf:.1f} · plain decode() {plain:.1f} ({plain / hf:.2f}x) · "
                               f"random DSpark γ=7 {spec:.1f}"})  # fmt: skip
    return rows


def check_syncs(device, dtype, shape: dict, batches: list[int], rounds: int) -> list[dict]:
    """Device -> host synchronisations per decoding round (budget 2) and the round's time split, random DSpark
    drafter, static γ = 7: counted by CUDA's own sync debug mode on a GPU and by HostReads everywhere."""
    import warnings

    from host_reads import HostReads

    from dspark_lightning.infer import Engine, SamplingParams, make_proposer

    target = random_llama(shape, device, dtype)
    drafter = random_dspark(target, block_size=7)
    rows = []
    for b in batches:
        eng = Engine(target, make_proposer(drafter), params=SamplingParams(1.0), scheduler="static",
                     stop_token_ids=[])  # fmt: skip
        eng.add([[(7 * i + j) % 250 + 3 for j in range(32 + i)] for i in range(b)], rounds * 8 + 8)
        eng.step()
        eng.settle_timings()
        before = dict(eng.time_s)
        cuda_syncs, counted = 0, 0
        for _ in range(rounds):
            with warnings.catch_warnings(record=True) as caught, HostReads() as h:
                warnings.simplefilter("always")
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    eng.step()
                finally:
                    if device.type == "cuda":
                        torch.cuda.set_sync_debug_mode(0)
            cuda_syncs += sum("synchroniz" in str(w.message) for w in caught)
            counted += h.count
        eng.settle_timings()
        ms = {k: 1000 * (eng.time_s[k] - before[k]) / rounds for k in ("draft", "schedule", "verify", "accept")}
        per = counted / rounds
        cuda = f" · CUDA sync debug mode {cuda_syncs / rounds:.1f}" if device.type == "cuda" else ""
        rows.append({"check": f"syncs per round, batch {b} (budget 2)", "ok": per <= 2 and cuda_syncs <= 2 * rounds,
                     "detail": f"HostReads {per:.1f}{cuda} · ms per round: "
                               + " ".join(f"{k} {v:.2f}" for k, v in ms.items())})  # fmt: skip
    return rows


def check_sps(device, dtype, shape: dict, max_tokens: int) -> dict:
    from dspark_lightning.infer import profile_sps

    target = random_llama(shape, device, dtype)
    t = profile_sps(target, max_tokens=max_tokens, context_len=512, repeats=5)
    pick = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= t.max_tokens]
    ms = {b: 1000.0 / t.raw_sps[t.tokens.index(b)] for b in pick if b in t.tokens}
    ratio = ms.get(8, float("nan")) / ms[1]
    return {"check": "SPS profile (ms per forward, 512-token context)", "ok": True,
            "detail": " ".join(f"B={b}: {v:.2f}" for b, v in ms.items()) + f" · 8/1 = {ratio:.2f}"}  # fmt: skip


def _dt(dtype) -> str:
    from dspark_lightning.devices import dtype_name

    return dtype_name(dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes, few samples and steps")
    ap.add_argument("--out", default=os.environ.get("OUT", "outputs/gpu_check"))
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dspark_lightning.devices import resolve_device, resolve_dtype

    device = resolve_device(a.device)
    dtype = resolve_dtype(a.dtype, device)
    shape = TINY_SHAPE if a.quick else SMOLLM2_SHAPE
    rows = []
    t_start = time.perf_counter()
    steps = [
        lambda: [check_greedy(device, dtype, 12 if a.quick else 48)],
        lambda: [check_chi2(device, dtype, 300 if a.quick else 4000)],
        lambda: [check_fit(device, 3 if a.quick else 50, "bf16-mixed", Path(tempfile.mkdtemp(prefix="gpu_fit_")))],
        lambda: check_throughput(device, dtype, shape, [1] if a.quick else [1, 16], 8 if a.quick else 128),
        lambda: check_syncs(device, dtype, shape, [1] if a.quick else [1, 8], 3 if a.quick else 20),
        lambda: [check_sps(device, dtype, shape, 8 if a.quick else 64)],
    ]
    for step in steps:
        t0 = time.perf_counter()
        try:
            new = step()
        except Exception as exc:  # a crash is a failed check, reported with the others
            new = [{"check": getattr(step, "__name__", "step"), "ok": False, "detail": f"{type(exc).__name__}: {exc}"}]
        for r in new:
            r["s"] = round(time.perf_counter() - t0, 1)
        rows.extend(new)
        print(json.dumps(new), flush=True)
    from dspark_lightning.devices import device_tag

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device_tag(device)
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": str(device), "dtype": _dt(dtype), "name": name,
            "torch": torch.__version__, "quick": a.quick}  # fmt: skip
    info["total_s"] = round(time.perf_counter() - t_start, 1)
    lines = [f"gpu_check {info['date']} on {info['name']} ({info['device']}, {info['dtype']}, torch {info['torch']}), "
             f"{info['total_s']} s", "", "| check | result | detail | s |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['check']} | {'PASS' if r['ok'] else 'FAIL'} | {r['detail']} | {r['s']} |" for r in rows]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps({"run": info, "rows": rows}, indent=1) + "\n")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
