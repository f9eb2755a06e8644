"""The fuzz suite grows by class, not by case.

Each class below is a generator: the product of its types x ranges x entry points (every command that takes the
option, a recipe key, an input file of that kind, a writer x fault) as :class:`~.test_fuzz_harness.Case` objects.
The suite runs a seeded sample of every class in-process (``DSPARK_FUZZ_N`` cases each, default 3, drawn with
``DSPARK_FUZZ_SEED``, default 20: a CI job that sets a new seed per run draws cases the project has not seen, and a
failure names the seed that reproduces it; ``DSPARK_FUZZ_N=0`` runs them all);
``scripts/fuzz_report.py --classes`` runs every case in a subprocess and writes the table in docs/safety.md.
"""

from __future__ import annotations

import os
import random

import pytest

from .fuzz_cases import make_workspace
from .test_fuzz_harness import FIFO, Case, extend_workspace, fresh_copy, run_in_process, run_subprocess

SEED = int(os.environ.get("DSPARK_FUZZ_SEED", "20"))
PER_CLASS = int(os.environ.get("DSPARK_FUZZ_N", "3"))
LIMIT = 2048  # tiny-debug's max_position_embeddings
BIG = str(10**30)
BAD = {  # values outside each kind of range, of every type the parser could take
    "int>=1": ["0", "-1", f"-{BIG}", "1.5", "x", "nan", "inf", "[1]", "true"],
    "int>=0": ["-1", f"-{BIG}", "2.5", "x", "nan", "{}"],
    "int>=2": ["1", "0", "-3", "1.5", "x"],
    "int": ["1.5", "x", "nan", "[]", "1e400"],
    "prob": ["-0.1", "1.5", "2", "nan", "inf", "-inf", "x", f"{BIG}"],
    "prob_open": ["0", "-0.5", "1.01", "nan", "x"],
    "temp": ["-1", "-1e-9", "nan", "inf", "-inf", "x", "[0.5]"],
    "pos": ["0", "-1", "nan", "inf", "x"],
    "block": ["0", "-1", "129", "100000", BIG, "2.5", "x"],
}
DEC = ["decode", "--target", "tiny-debug", "--prompt", "hi", "--max_new_tokens", "4"]
DEC_D = ["decode", "--target", "tiny-debug", "--drafter", "drafter", "--prompt", "hi", "--max_new_tokens", "4"]
EVAL = ["eval", "--drafter", "drafter", "--out", "evalout", "--prompts_per_domain", "1", "--max_new_tokens", "3",
        "--domains", "math"]  # fmt: skip
BENCH = [
    "bench",
    "--drafter",
    "drafter",
    "--out",
    "benchout",
    "--prompts_per_domain",
    "1",
    "--max_new_tokens",
    "3",
    "--domains",
    "math",
    "--batches",
    "1",
    "--repeats",
    "1",
    "--temperatures",
    "0",
    "--scheduler",
    "static",
]
SWEEP = ["threshold-sweep", "--drafter", "drafter", "--out", "sw", "--prompts_per_domain", "1", "--domains", "math",
         "--max_new_tokens", "3", "--thresholds", "0.5"]  # fmt: skip
SERVE = ["serve-bench", "--drafter", "drafter", "--out", "sb", "--prompts_per_domain", "1", "--domains", "math",
         "--max_new_tokens", "3", "--concurrency", "1", "--methods", "plain", "--window_s", "0.2"]  # fmt: skip
CAL = ["calibrate", "--drafter", "cal", "--rollouts", "rollouts.pt", "--min_rows", "10", "--min_class", "1"]
PROFILE = ["profile", "--target", "tiny-debug", "--repeats", "1", "--max_tokens", "2", "--context_len", "4"]
EXPORT = ["export", "--drafter", "drafter", "--out", "exp", "--overwrite", "true"]
FIT = ["fit", "--config", "{TINY}"]
PREP = ["prepare", "--config", "{TINY}"]
RANGED = [  # (entry point, option, kind): "--a.b" options take "=value", the others a separate value
    (DEC, "--max_new_tokens", "int>=1"), (DEC, "--batch_size", "int>=1"), (DEC, "--top_k", "int>=1"),
    (DEC, "--temperature", "temp"), (DEC, "--top_p", "prob_open"), (DEC, "--seed", "int"),
    (DEC + ["--prompts", "prompts.jsonl"], "--limit", "int>=0"),
    (EVAL, "--batch_size", "int>=1"), (EVAL, "--prompts_per_domain", "int>=1"), (EVAL, "--max_new_tokens", "int>=1"),
    (EVAL, "--temperature", "temp"), (EVAL, "--seed", "int"),
    (BENCH, "--batches", "int>=1"), (BENCH, "--repeats", "int>=1"), (BENCH, "--prompt_lookup_tokens", "int>=1"),
    (BENCH, "--temperatures", "temp"),
    (CAL, "--batch_size", "int>=1"), (CAL, "--temperature", "temp"), (CAL, "--heldout_fraction", "prob"),
    (CAL, "--prompts_per_domain", "int>=1"), (CAL, "--max_new_tokens", "int>=1"), (CAL, "--min_rows", "int>=0"),
    (CAL, "--min_class", "int>=0"),
    (SWEEP, "--thresholds", "prob"), (SWEEP, "--batch_size", "int>=1"), (SWEEP, "--temperature", "temp"),
    (SERVE, "--concurrency", "int>=1"), (SERVE, "--repeats", "int>=1"), (SERVE, "--window_s", "pos"),
    (SERVE, "--temperature", "temp"),
    (PROFILE, "--max_tokens", "int>=1"), (PROFILE, "--context_len", "int>=1"), (PROFILE, "--repeats", "int>=1"),
    (PREP, "--data.batch_size", "int>=1"), (PREP, "--data.max_length", "int>=2"),
    (PREP, "--data.heldout_fraction", "prob"), (PREP, "--data.max_anchors", "int>=1"),
    (PREP, "--data.regen.max_new_tokens", "int>=1"), (PREP, "--data.regen.batch_size", "int>=1"),
    (PREP, "--data.regen.temperature", "temp"), (PREP, "--data.regen.top_p", "prob_open"),
    (PREP, "--data.min_supervised", "int>=0"), (PREP, "--data.regen.concurrency", "int>=1"),
    (FIT, "--model.block_size", "block"), (FIT, "--data.batch_size", "int>=1"), (FIT, "--model.optim.lr", "pos"),
]  # fmt: skip
SCHEDULER_RANGED = [("static", "int>=0"), ("threshold", "prob")]
TRAINER = {  # Lightning options that must be >= 1 (or > 0, or -1 for "no limit")
    "val_check_interval": ["0", "0.0", "-1", "1.5", "nan"], "accumulate_grad_batches": ["0", "-1", "2.5"],
    "max_steps": ["0", "-2", "-5"], "max_epochs": ["0", "-3"], "log_every_n_steps": ["0", "-1"],
    "check_val_every_n_epoch": ["0", "-1"], "devices": ["0", "[]", "-2"], "num_nodes": ["0"],
    "limit_val_batches": ["-1", "1.5"], "gradient_clip_val": ["-1", "nan"], "min_steps": ["-1"],
    "num_sanity_val_steps": ["-2"],
}  # fmt: skip
OUT_FILES = [(DEC, "--json_out"), (PROFILE, "--out"), (PROFILE, "--plot")]
OUT_DIRS = [(EVAL, "--out"), (BENCH, "--out"), (SWEEP, "--out"), (SERVE, "--out"), (CAL, "--report_dir"),
            (EXPORT, "--out"), (FIT, "--export.dir"), (FIT, "--trainer.default_root_dir"), (FIT, "--data.work_dir"),
            (PREP, "--data.work_dir")]  # fmt: skip
IN_FILES = [(DEC, "--prompts", ""), (DEC_D, "--sps", ""), (EVAL, "--dataset", "x="), (CAL, "--rollouts", ""),
            (["fit"], "--config", ""), (["prepare"], "--config", ""), (FIT, "--ckpt_path", "")]  # fmt: skip
IN_DIRS = [(DEC, "--drafter"), (["decode", "--prompt", "hi"], "--target"), (["eval", "--out", "e"], "--drafter"),
           (["export", "--out", "e"], "--drafter"), (FIT, "--target.name")]  # fmt: skip


def opt(option: str, value: str) -> list[str]:
    return [f"{option}={value}"] if option.count(".") else [option, value]


def _cmd(base: list[str]) -> str:
    return base[0] + ("+drafter" if base[0] == "decode" and "--drafter" in base else "")


def gen_ranges(rng: random.Random) -> list[Case]:
    cases = [Case("ranges", f"{_cmd(b)}{o}={v}", b + opt(o, v)) for b, o, k in RANGED for v in BAD[k]]
    for name, kind in SCHEDULER_RANGED:  # a scheduler's argument, as every command names it: --scheduler name:value
        cases += [Case("ranges", f"decode+drafter--scheduler={name}:{v}", DEC_D + ["--scheduler", f"{name}:{v}"])
                  for v in BAD[kind]]  # fmt: skip
    return cases


def gen_trainer(rng: random.Random) -> list[Case]:
    return [Case("trainer", f"fit-trainer.{k}={v}", FIT + [f"--trainer.{k}={v}"]) for k, vs in TRAINER.items()
            for v in vs]  # fmt: skip


def gen_nulls(rng: random.Random) -> list[Case]:
    """``null`` for every recipe key typed without None (read from the signatures, so new keys are covered)."""
    import dataclasses
    import inspect
    import typing

    from dspark_lightning.lightning.config import TargetConfig
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule
    from dspark_lightning.lightning.recipe_checks import _admits_none, _dataclass_of

    keys = []

    def walk(prefix, cls):
        fn = cls if dataclasses.is_dataclass(cls) else cls.__init__
        hints = typing.get_type_hints(fn)
        for name in inspect.signature(cls).parameters:
            hint = hints.get(name)
            if hint is not None and not _admits_none(hint):
                keys.append((f"{prefix}.{name}", hint))
            sub = _dataclass_of(hint)
            if sub is not None:
                walk(f"{prefix}.{name}", sub)

    walk("target", TargetConfig)
    walk("model", DSparkModule)
    walk("data", DSparkDataModule)
    linked = {"model.target", "data.target"}  # set from the target section
    keys = [(k, h) for k, h in keys if k not in linked]
    cases = []
    for k, hint in keys:  # null in a recipe file (on the command line a str option takes "null" as the string "null")
        parts = k.split(".")
        text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
        text += f"{'  ' * (len(parts) - 1)}{parts[-1]}: null\n"
        cases.append(Case("nulls", f"fit-{k}=null", FIT + ["--config", "n.yaml"], files={"n.yaml": text}))
        if k.startswith("data."):
            cases.append(Case("nulls", f"prepare-{k}=null", PREP + ["--config", "n.yaml"], files={"n.yaml": text}))
            if hint is not str:
                cases.append(Case("nulls", f"prepare-arg-{k}=null", PREP + [f"--{k}=null"]))
    return cases + [Case("nulls", "fit-backbone.num_layers=null", FIT + ["--model.backbone.init_args.num_layers=null"])]


def _bad_paths(rng: random.Random, kind: str) -> list[tuple[str, str, dict, list]]:
    """(label, path, files to create, read-only folders) of each kind of bad path."""
    long_name = "n" * rng.randint(256, 2000)
    seg = "d" * rng.randint(100, 250)
    long_path = "/".join([seg] * (4200 // (len(seg) + 1) + rng.randint(1, 20)))  # over PATH_MAX (4096)
    out = [("name-too-long", long_name, {}, []), ("path-too-long", long_path, {}, []),
           ("non-utf8", f"o\udcff{rng.randint(0, 99)}", {}, [])]  # fmt: skip
    if kind == "out":
        out += [("read-only", "ro/x", {}, ["ro"]), ("under-a-file", "existing.txt/x", {}, []),
                ("fifo", "f.fifo", {"f.fifo": FIFO}, []), ("device", "/dev/null", {}, [])]  # fmt: skip
    else:
        out += [("fifo", "in.fifo", {"in.fifo": FIFO}, []), ("device", "/dev/null", {}, []), ("dir", "adir", {}, []),
                ("missing", "missing-file", {}, [])]  # fmt: skip
    return out


def gen_paths(rng: random.Random) -> list[Case]:
    cases = []
    for kind, table in (("out", OUT_FILES + OUT_DIRS), ("in", [(b, o) for b, o, _ in IN_FILES])):
        for base, option in table:
            prefix = next((p for b, o, p in IN_FILES if b is base and o == option), "")
            for label, path, files, ro in _bad_paths(rng, kind):
                if kind == "out" and label == "device" and (base, option) in OUT_DIRS:
                    path = "/dev/null/sub"
                cases.append(Case("paths", f"{_cmd(base)}{option}-{label}", base + opt(option, prefix + path),
                                  files=files, readonly=ro))  # fmt: skip
    for base, option in IN_DIRS:  # a folder a loader opens file by file: a FIFO inside it would block the loader
        for label, path, files in (("fifo", "d.fifo", {"d.fifo": FIFO}),
                                   ("fifo-inside", "fd", {"fd/config.json": FIFO, "fd/model.safetensors": b""}),
                                   ("name-too-long", "t" * rng.randint(256, 999), {})):  # fmt: skip
            cases.append(Case("paths", f"{_cmd(base)}{option}-{label}", base + opt(option, path), files=files))
    return cases


def _deep(rng: random.Random) -> str:
    d = rng.choice([3000, 30000, 300000])
    return "[" * d + "]" * d if rng.random() < 0.5 else '{"a":' * d + "1" + "}" * d


def gen_encoding(rng: random.Random) -> list[Case]:
    bad = f"caf\udce9{rng.randint(0, 9)}"  # the surrogate Python makes of the byte 0xe9 (Latin-1 é)
    cases = [Case("encoding", f"{_cmd(b)}-arg-{o}", b + opt(o, bad)) for b, o, _ in RANGED[::6]]
    cases += [Case("encoding", "decode-prompt-arg", DEC + ["--prompt", bad]),
              Case("encoding", "fit-config-arg", ["fit", "--config", f"r{bad}.yaml"])]  # fmt: skip
    files = {  # file contents: lone surrogates as JSON escapes, Latin-1 bytes, a UTF-16 file
        "sur.jsonl": '{"turns": ["\\ud800 hi"]}\n', "lat.jsonl": b'{"turns": ["caf\xe9"]}\n',
        "u16.jsonl": '{"turns": ["hi"]}\n'.encode("utf-16"), "lat.yaml": b"model:\n  block_size: 4 # \xe9\n",
        "ed/config.json": b'{"format_version": 1, "x": "\xff"}', "ed/model.safetensors": b"",
    }  # fmt: skip
    for name in ("sur.jsonl", "lat.jsonl", "u16.jsonl"):
        cases += [Case("encoding", f"decode-prompts-{name}", DEC + ["--prompts", name], files={name: files[name]}),
                  Case("encoding", f"eval-dataset-{name}", EVAL + ["--dataset", f"x={name}"],
                       files={name: files[name]})]  # fmt: skip
    cases.append(Case("encoding", "fit-config-latin1", FIT + ["--config", "lat.yaml"],
                      files={"lat.yaml": files["lat.yaml"]}))  # fmt: skip
    cases.append(Case("encoding", "decode-drafter-config-bytes", DEC + ["--drafter", "ed"],
                      files={k: v for k, v in files.items() if k.startswith("ed/")}))  # fmt: skip
    return cases


def gen_depth(rng: random.Random) -> list[Case]:
    deep = _deep(rng)
    return [Case("json-depth", "decode-prompts", DEC + ["--prompts", "deep.jsonl"],
                 files={"deep.jsonl": f'{{"turns": {deep}}}\n'}),
            Case("json-depth", "eval-dataset", EVAL + ["--dataset", "x=deep.jsonl"], files={"deep.jsonl": deep + "\n"}),
            Case("json-depth", "decode-sps", DEC_D + ["--sps", "deep.json"], files={"deep.json": deep}),
            Case("json-depth", "serve-bench-sps", SERVE + ["--sps", "deep.json"], files={"deep.json": deep}),
            Case("json-depth", "decode-drafter-config", DEC + ["--drafter", "dd"],
                 files={"dd/config.json": deep, "dd/model.safetensors": b""}),
            Case("json-depth", "fit-recipe", FIT + ["--config", "deep.yaml"], files={"deep.yaml": f"data: {deep}\n"}),
            Case("json-depth", "prepare-sources", PREP + [f"--data.sources={deep}"])]  # fmt: skip


def _recipes(rng: random.Random) -> dict[str, str]:
    """Recipe overlays that hang or exhaust a YAML reader: recursive aliases, alias bombs, deep nesting."""
    w = rng.randint(6, 10)
    levels = rng.randint(7, 9)  # w ** levels > 200000 values once expanded
    bomb = "".join(f"  - &l{i} [{', '.join([f'*l{i - 1}'] * w) if i else ', '.join(['lol'] * w)}]\n"
                   for i in range(levels))  # fmt: skip
    d = rng.choice([65, 500, 50000])
    return {
        "self-alias-sources": "data:\n  sources: &s [{class_path: mtbench, init_args: {limit: 2}}, *s]\n",
        "self-alias-map": "model:\n  optim: &o {lr: 0.001, extra: *o}\n",
        "self-alias-top": "trainer: &t\n  max_steps: 2\n  callbacks: [*t]\n",
        "alias-bomb": f"data:\n  sources:\n{bomb}",
        "deep-nesting": "data:\n  sources: " + "[" * d + "]" * d + "\n",
    }


def gen_yaml(rng: random.Random) -> list[Case]:
    cases = []
    for label, text in _recipes(rng).items():
        files = {"r.yaml": text}
        cases += [Case("yaml", f"fit-{label}", FIT + ["--config", "r.yaml"], files=files),
                  Case("yaml", f"prepare-{label}", PREP + ["--config", "r.yaml"], files=files),
                  Case("yaml", f"verify-{label}", ["verify", "--config", "{TINY}", "--config", "r.yaml"], files=files),
                  Case("yaml", f"fit-inline-{label}", FIT + ["--config", text])]  # fmt: skip
    cases.append(Case("yaml", "fit-arg-self-alias", FIT + ["--data.sources=&s [mtbench, *s]"]))
    cases.append(Case("yaml", "fit-config-fifo", ["fit", "--config", "r.fifo"], files={"r.fifo": FIFO}))
    cases.append(Case("yaml", "prepare-c-fifo", ["prepare", "-c", "r.fifo"], files={"r.fifo": FIFO}))
    return cases


def gen_positions(rng: random.Random) -> list[Case]:
    new = [str(LIMIT), str(rng.randint(LIMIT + 1, 10**6)), str(10**9)]
    cases = [Case("positions", f"{_cmd(b)}-max_new_tokens={v}", b + ["--max_new_tokens", v])
             for b in (DEC, DEC_D, EVAL, BENCH, SWEEP, SERVE) for v in new]  # fmt: skip
    long_prompt = "z" * rng.randint(2100, 9000)
    cases.append(Case("positions", "decode-long-prompt", DEC + ["--no_chat", "true", "--prompt", long_prompt]))
    longer = [str(LIMIT + 1), *new[1:]]  # max_length may equal the limit, max_new_tokens leaves room for a prompt
    cases += [Case("positions", f"prepare-{k}={v}", PREP + [f"--data.{k}={v}"])
              for k, vs in (("max_length", longer), ("regen.max_new_tokens", new)) for v in vs]  # fmt: skip
    cases += [Case("positions", f"fit-max_length={v}", FIT + [f"--data.max_length={v}"]) for v in longer[:2]]
    cases.append(Case("positions", "profile-context_len", PROFILE + ["--context_len", str(rng.randint(LIMIT, 10**6))]))
    return cases


def gen_stdout(rng: random.Random) -> list[Case]:
    commands = {"decode": DEC, "decode-prompts": DEC + ["--prompts", "prompts.jsonl", "--max_new_tokens", "2"],
                "profile": PROFILE + ["--out", "prev/stdout-sps.json"], "eval": EVAL + ["--out", "stdout-eval"],
                "prepare": WRITERS["prepare"][0]}  # fmt: skip
    return [Case("stdout", f"{name}-{how}", argv, stdout=how) for name, argv in commands.items()
            for how in ("pipe", "full")]  # fmt: skip


ENGINE_STEP = "dspark_lightning.infer.engine:Engine.step"
REGEN = "dspark_lightning.data.regen.regen_engine:EngineRegenerator.answer"


def gen_interrupt(rng: random.Random) -> list[Case]:
    more = ["--max_new_tokens", "12"]  # enough engine steps for a Ctrl-C after the first
    at = {"decode": (DEC + ["--json_out", "prev/r.json"] + more, ENGINE_STEP), "eval": (EVAL + more, ENGINE_STEP),
          "bench": (BENCH + more, ENGINE_STEP), "threshold-sweep": (SWEEP + more, ENGINE_STEP),
          "serve-bench": (SERVE + more, ENGINE_STEP),
          "calibrate": (CAL, "dspark_lightning.calibration:fit_sts"),
          "prepare": (PREP + ["--data.work_dir=pw"], REGEN),
          "fit-regeneration": (FIT + ["--data.work_dir=fw"], REGEN),
          "profile": (PROFILE + ["--out", "prev/sps.json"],
                      "dspark_lightning.infer.profiling.measure_sps:profile_sps")}  # fmt: skip
    return [Case("interrupt", f"{name}-after-{k}", argv, fault={"kind": "interrupt", "at": where, "after": k},
                 expect="interrupt") for name, (argv, where) in at.items() for k in (0, rng.randint(1, 2))
            if k == 0 or where == ENGINE_STEP]  # fmt: skip


WRITERS = {  # writer -> (argv, folder it writes into, its main output, bytes that are never enough for its output)
    "decode": (DEC + ["--json_out", "prev/r.json"], "prev", "prev/r.json", 200),
    "profile": (PROFILE + ["--out", "prev/sps.json"], "prev", "prev/sps.json", 100),
    "export": (EXPORT, ".", "exp", 20000),
    "calibrate": (CAL, "cal", "cal/calibration_T1.json", 300),
    "eval": (EVAL, "evalout", "evalout/tau_table.json", 300),
    "bench": (BENCH, "benchout", "benchout/bench.json", 300),
    "threshold-sweep": (SWEEP, "sw", "sw/threshold_sweep.json", 300),
    "serve-bench": (SERVE, "sb", "sb/serve_bench.json", 300),
    "prepare": (
        PREP
        + [
            "--data.work_dir=pw",
            "--data.sources=[{class_path: mtbench, init_args: {limit: 4}}]",
            "--data.heldout_fraction=0.5",
            "--data.regen.max_new_tokens=4",
        ],
        "pw",
        "pw",
        300,
    ),  # fmt: skip
}
LOCKED = {"calibrate": "cal", "prepare": "pw", "fit": "outputs/tiny_debug"}


def gen_writers(rng: random.Random) -> list[Case]:
    """Every writer x {a disk that fills after N bytes, a SIGKILL after N bytes, a concurrent writer}."""
    cases = []
    for name, (argv, folder, output, room) in WRITERS.items():
        n = rng.randint(0, room)
        full = {"kind": "enospc", "root": folder, "room": n}
        cases.append(Case("writers", f"{name}-full-disk-{n}", argv, fault=full))
        cases.append(Case("writers", f"{name}-killed-{n}", argv, fault={"kind": "kill", "root": folder, "room": n},
                          expect="kill"))  # fmt: skip
        if name in LOCKED:
            cases.append(Case("writers", f"{name}-locked", argv, fault={"kind": "lock", "folder": LOCKED[name]}))
        elif output.endswith(".json"):  # another process replacing the same file: one whole version survives
            cases.append(Case("writers", f"{name}-racing-writer", argv, fault={"kind": "race", "path": output},
                              expect="ok"))  # fmt: skip
    cases.append(Case("writers", "fit-locked", FIT, fault={"kind": "lock", "folder": LOCKED["fit"]}))
    return cases


GENERATORS = {"ranges": gen_ranges, "trainer": gen_trainer, "nulls": gen_nulls, "paths": gen_paths,
              "encoding": gen_encoding, "json-depth": gen_depth, "yaml": gen_yaml, "positions": gen_positions,
              "stdout": gen_stdout, "interrupt": gen_interrupt, "writers": gen_writers}  # fmt: skip


def all_cases(seed: int = SEED) -> dict[str, list[Case]]:
    rng = random.Random(seed)
    return {name: gen(rng) for name, gen in GENERATORS.items()}


def sample(per_class: int = PER_CLASS, seed: int = SEED) -> list[Case]:
    rng = random.Random(seed + 1)
    out = []
    for cases in all_cases(seed).values():
        out += cases if per_class <= 0 else rng.sample(cases, min(per_class, len(cases)))
    return out


SAMPLE = sample()


@pytest.fixture(scope="session")
def class_workspace(tmp_path_factory):
    return extend_workspace(make_workspace(tmp_path_factory.mktemp("fuzz_classes") / "workspace"))


def test_every_class_is_generated_and_sampled():
    cases = all_cases()
    assert set(cases) == set(GENERATORS) and all(cases.values())
    ids = [c.id for cs in cases.values() for c in cs]
    assert len(ids) == len(set(ids))
    assert {c.cls for c in SAMPLE} == set(GENERATORS)


@pytest.mark.parametrize("case", SAMPLE, ids=[f"{c.cls}:{c.id[:80]}" for c in SAMPLE])
def test_a_generated_case_ends_in_one_line(case, class_workspace, capsys, monkeypatch, tmp_path):
    """Exit 2 (130 for Ctrl-C) with one ``dspark-lightning <cmd>: ...`` line, no traceback, no hang, no pre-existing
    file changed and no temp debris; a killed writer's next run succeeds."""
    import logging

    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(logging, "raiseExceptions", False)
    work = fresh_copy(class_workspace, tmp_path / "work")
    if case.expect == "kill":
        res = run_subprocess(case, work)
        assert res["exit"] == -9 and not res["changed"], res  # killed while writing, nothing it found is lost
        again = run_in_process(Case(case.cls, case.id, case.argv, expect="ok"), work, capsys)
        assert again["outcome"] == "clean" and not again["debris"], again  # the next run cleans up and succeeds
        return
    res = run_in_process(case, work, capsys)
    assert res["outcome"] == "clean", f"DSPARK_FUZZ_SEED={SEED}: {res}"
    assert not res["debris"], f"DSPARK_FUZZ_SEED={SEED}: {res}"
