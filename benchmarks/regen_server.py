"""Regeneration through a real server (llama.cpp's llama-server, pinned release) against our own, on this CPU.

Builds llama-server from the pinned source (once per CPU), converts the target to a GGUF, serves it on the loopback
and regenerates the same prompts (the make-run mixture's first chat and code requests, T = 0) three ways: our engine
(``data.regen.backend: dspark``, in the dtype make run uses) and the server at two concurrencies
(``backend: openai``). Reports conversations and generated tokens per second, and how many responses are the same
text as our engine's (greedy text may differ at near-ties: another kernel and precision). Run alone on the machine.

    python benchmarks/regen_server.py --out benchmarks/results/data/regen_server          (make regen-server)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import matrix  # noqa: E402
import torch  # noqa: E402

from dspark_lightning.data.prompts.mixture import mixture  # noqa: E402
from dspark_lightning.data.regen.regenerate import regenerate  # noqa: E402
from dspark_lightning.devices import decode_bf16_faster  # noqa: E402
from dspark_lightning.export import llamacpp  # noqa: E402
from dspark_lightning.targets import load_target, resolve_target_path  # noqa: E402

SOURCES = [
    {
        "class_path": "sharegpt_v3",
        "init_args": {"domains": ["chat"], "language": "en", "max_tokens": 192, "sample": 40, "seed": 5},
    },
    {
        "class_path": "sharegpt_v3",
        "init_args": {"domains": ["code"], "language": "en", "max_tokens": 192, "sample": 24, "seed": 5},
    },
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(gguf: Path, slots: int, ctx: int, threads: int) -> tuple[subprocess.Popen, str, Path]:
    """Start llama-server on the loopback; returns (process, base URL, log file) once /health answers."""
    port = _free_port()
    logf = ROOT / "outputs" / "regen_server" / f"llama-server-np{slots}.log"
    cmd = [str(llamacpp.tool(llamacpp.SERVER)), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-np", str(slots), "-c", str(ctx * slots), "--jinja", "--no-webui"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=open(logf, "w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, f"http://127.0.0.1:{port}/v1", logf
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"llama-server did not come up; see {logf}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--gguf_type", default="f32", help="the served target's GGUF type (f32 = the target's weights)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/data/regen_server"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    work = ROOT / "outputs" / "regen_server"
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    llamacpp.build((llamacpp.SERVER,))
    gguf = ROOT / "outputs" / "llamacpp" / f"target-{a.gguf_type}.gguf"  # shared with benchmarks/llamacpp.py
    gguf.parent.mkdir(parents=True, exist_ok=True)
    if not gguf.is_file():
        llamacpp.convert(Path(resolve_target_path(a.target)), gguf, a.gguf_type)
    target = load_target(a.target)
    prompts = mixture(SOURCES, "all", 0.0, tokenizer=target.tokenizer)
    kw = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": a.max_new_tokens, "max_turns": 1, "progress": True}
    rows: list[dict] = []

    def run(name: str, path: Path, on=None, **extra) -> dict:
        path.unlink(missing_ok=True)
        t0 = time.perf_counter()
        st = regenerate(on or target, prompts, path, **kw, **extra)
        wall = time.perf_counter() - t0
        row = {"backend": name, "conversations": st["written"], "tokens": st["tokens"], "wall_s": round(wall, 1),
               "conv_per_s": round(st["written"] / wall, 3), "tok_per_s": round(st["tokens"] / wall, 1)}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
        return row

    regen_dtype = "bf16" if decode_bf16_faster("cpu") else None  # what make run's `dtype: fastest` picks here
    ours = work / "ours.jsonl"  # our engine on the target copy make run regenerates with
    run_with = load_target(a.target, dtype=torch.bfloat16) if regen_dtype else target
    run(f"dspark (ours, concurrency 32, {regen_dtype or 'fp32'})", ours, backend="dspark", concurrency=32, on=run_with)
    mine = {r["id"]: r["turns"][1]["content"] for r in map(json.loads, ours.read_text().splitlines())}
    for c in a.concurrency:
        proc, url, logf = serve(gguf, c, 4096, os.cpu_count() or 2)
        try:
            path = work / f"server-c{c}.jsonl"
            settings = {"base_url": url, "model": "target", "timeout_s": 600, "retries": 2}
            srv = {"class_path": "openai", "init_args": settings}
            name = f"llama-server {llamacpp.RELEASE} ({a.gguf_type}, {c} slots, concurrency {c})"
            row = run(name, path, backend=srv, concurrency=c)
            theirs = {r["id"]: r["turns"][1]["content"] for r in map(json.loads, path.read_text().splitlines())}
            row["same_text_as_ours"] = sum(theirs.get(k) == v for k, v in mine.items())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    info = {"date": time.strftime("%Y-%m-%d"), "cpu": matrix.cpu_model(), "cores": os.cpu_count(),
            "commit": matrix.commit(), "target": a.target, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
            "temperature": 0.0, "rows": rows}  # fmt: skip
    (out / "regen_server.json").write_text(json.dumps(info, indent=2) + "\n")
    lines = [f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}: "
             f"{len(prompts)} ShareGPT chat and code requests, one turn each, T = 0, up to {a.max_new_tokens} new "
             "tokens.", "", "| backend | conversations/s | generated tokens/s | wall s | same text as ours |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        same = r.get("same_text_as_ours")
        lines.append(f"| {r['backend']} | {r['conv_per_s']:.2f} | {r['tok_per_s']:.1f} | {r['wall_s']:.0f} | "
                     + ("-" if same is None else f"{same}/{r['conversations']}") + " |")  # fmt: skip
    (out / "regen_server.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
