"""A digest of the token ids every built-in eval prompt becomes for a recipe's target: run it on two commits to see
whether a change to prompt encoding changed any input (docs/results.md, "Prompt encoding").

    python benchmarks/prompt_ids_digest.py --recipe recipes/gemma3_270m_dspark.yaml [--per_domain 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import warnings
from pathlib import Path

import yaml

from dspark_lightning.data.prompts.evalsets import eval_prompts
from dspark_lightning.targets import ChatFormat, chat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--per_domain", type=int, default=10)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from dspark_lightning.targets import resolve_target_path

    target = yaml.safe_load(Path(a.recipe).read_text())["target"]
    tok = AutoTokenizer.from_pretrained(resolve_target_path(target["name"]))
    fmt = ChatFormat(system_prompt=target.get("system_prompt"), template=target.get("chat_template"))
    out = {}
    for domain in ("math", "code", "chat"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ids = [chat.render_prompt(tok, [{"role": "user", "content": r.turns[0]}], fmt)
                   for r in eval_prompts(domain, a.per_domain)]  # fmt: skip
        out[domain] = {"prompts": len(ids), "tokens": sum(map(len, ids)), "first": ids[0][:6],
                       "sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]}  # fmt: skip
    print(json.dumps({"recipe": a.recipe, **out}, indent=1))


if __name__ == "__main__":
    main()
