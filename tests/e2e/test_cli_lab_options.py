"""The command-line options that replaced experiment scripts (``eval --scheduler static --gamma``, ``eval --prompts``,
``bench --scheduler A B --layouts``, ``profile --breakdown``), the ablation queue, the plots' geometry and the
split of the Makefile into product and benchmark targets."""

import importlib.util
import json
import os
import re
import shlex
import shutil
import struct
import subprocess

import pytest
import torch

from dspark_lightning import create, load_target
from dspark_lightning.export import save_drafter

from .conftest import ROOT, run_main


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    """A random exported DSpark drafter (γ = 3) for tiny-debug."""
    target = load_target("tiny-debug")
    torch.manual_seed(0)
    d = create("drafter", "dspark", target, block_size=3, backbone={"name": "dense", "num_layers": 1})
    return str(save_drafter(d, tmp_path_factory.mktemp("lab") / "dspark", target))


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


# eval --scheduler static --gamma, eval --prompts (scripts/acceptance_probe.py)


def test_eval_static_gamma_fixes_the_block(drafter, tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--drafter", f"d={drafter}", "--scheduler", "static", "--gamma", "1", "--temperature", "0"]
    args += ["--batch_size", "1", "--prompts_per_domain", "1", "--max_new_tokens", "8", "--seed", "0"]
    code, _, err = run_main(args + ["--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "tau_table.json").read_text())
    assert doc["info"]["scheduler"] == "static:1" and doc["info"]["batch_size"] == 1
    acc = json.loads((out / "acceptance.json").read_text())
    for ds in ("gsm_symbolic", "humaneval", "mtbench"):
        assert 1.0 <= doc["tau"]["d"][ds] <= 2.0  # one draft per round at most: τ <= 1 + γ
        a_k = acc["d"][ds]["conditional_acceptance"]
        assert all(x is None for x in a_k[1:])  # positions past γ = 1 are never verified


def test_eval_gamma_needs_the_static_scheduler(drafter, tmp_path, capsys):
    args = ["eval", "--drafter", drafter, "--scheduler", "threshold", "--gamma", "2", "--out", str(tmp_path / "o")]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "--gamma" in err and "static" in err
    code, _, err = run_main(["eval", "--drafter", drafter, "--gamma", "0", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--gamma" in err


def test_eval_prompts_groups_a_responses_file_by_source(drafter, tmp_path, capsys):
    recs = [
        ("gsm_symbolic/a/1", "gsm_symbolic", "math", "What is 2 + 2?"),
        ("python_stdlib/complete/1", "python_stdlib", "code", "def f():"),
        ("python_stdlib/explain/1", "python_stdlib", "code", "Explain zip."),
        ("gsm_symbolic/a/2", "gsm_symbolic", "math", "What is 3 + 3?"),
        ("gsm_symbolic/a/3", "gsm_symbolic", "math", "What is 4 + 4?"),
        ("python_stdlib/complete/2", "python_stdlib", "code", "def g():"),
    ]
    path = tmp_path / "responses_heldout.jsonl"
    turns = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "ok"}]
    lines = [
        {"id": i, "source": s, "domain": d, "turns": [{**turns[0], "content": q}, turns[1]]} for i, s, d, q in recs
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "eval"
    args = ["eval", "--drafter", f"d={drafter}", "--prompts", str(path), "--prompts_per_domain", "2"]
    code, _, err = run_main(args + ["--max_new_tokens", "4", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "tau_table.json").read_text())
    sets = {d["name"]: (d["domain"], d["prompts"]) for d in doc["datasets"]}
    assert sets == {"gsm_symbolic": ("math", 2), "python_stdlib/complete": ("code", 2), "python_stdlib": ("code", 1)}
    assert set(doc["tau"]["d"]) == set(sets)  # the built-in sets are replaced, not joined


def test_eval_prompts_rejects_a_file_of_other_records(drafter, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "source": "x", "turns": []}\n')
    args = ["eval", "--drafter", drafter, "--prompts", str(bad), "--out", str(tmp_path / "o")]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "--prompts" in err and "bad.jsonl:1" in err
    code, _, err = run_main(args[:3] + ["--prompts", str(tmp_path / "missing.jsonl"), *args[5:]], capsys)
    assert code == 2 and "--prompts" in err


def test_acceptance_probe_wrapper_gathers_eval_runs(drafter, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("acceptance_probe", ROOT / "benchmarks" / "acceptance_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    out = tmp_path / "probe"
    probe.main(["--drafter", drafter, "--target", "tiny-debug", "--prompts_per_domain", "1", "--max_new_tokens", "4",
                "--gammas", "2", "1", "--temperatures", "0", "--out", str(out)])  # fmt: skip
    rows = json.loads((out / "acceptance.json").read_text())["rows"]
    assert [(r["set"], r["gamma"]) for r in rows] == [(s, g) for s in ("math", "code", "chat") for g in (2, 1)]
    assert all(1.0 <= r["tau"] <= 1 + r["gamma"] for r in rows)
    assert (out / "acceptance.md").read_text().startswith("| T | set | γ |")
    assert (out / "runs" / "T0_g2" / "tau_table.json").is_file()


# bench --scheduler A B --layouts padded flat (scripts/bench_decode.py)


def test_bench_several_schedulers_and_layouts(drafter, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--drafter", f"d={drafter}", "--scheduler", "static", "threshold", "--layouts", "padded", "flat"]
    args += ["--temperatures", "0", "--batches", "1", "--domains", "math", "--prompts_per_domain", "1"]
    code, _, err = run_main(args + ["--max_new_tokens", "4", "--repeats", "2", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["info"]["scheduler"] == ["static", "threshold"] and doc["info"]["layouts"] == ["padded", "flat"]
    ours = [f"{e} [{lay}]" for lay in ("padded", "flat")
            for e in ("plain decode(), HF forward", "plain decode()", "d [static]", "d [threshold]")]  # fmt: skip
    rows = {r["engine"]: r for r in doc["rows"]}
    assert list(rows) == ["HF generate", "HF prompt lookup", *ours]
    for name in ours:
        r = rows[name]
        assert r["layout"] == name.rsplit("[", 1)[1].rstrip("]") and r["equals_hf"] is True  # lossless in each
        plain = rows[f"plain decode() [{r['layout']}]"]
        assert r["speedup_vs_plain"] == pytest.approx(r["tok_s"] / plain["tok_s"])  # against its own layout
    assert rows["d [static] [flat]"]["scheduler"] == "static"
    assert "Per-position acceptance" in (out / "bench.md").read_text()


@pytest.mark.parametrize(
    "extra, word",
    [(["--layouts", "ragged"], "--layouts"), (["--scheduler", "static", "static"], "--scheduler"),
     (["--scheduler", "warp"], "--scheduler"), (["--scheduler", "threshold", "--gamma", "2"], "--gamma")],
)  # fmt: skip
def test_bench_rejects_bad_scheduler_and_layout_lists(drafter, tmp_path, capsys, extra, word):
    code, _, err = run_main(["bench", "--drafter", drafter, *extra, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and word in err


# profile --breakdown verify|draft (scripts/profile_verify.py, scripts/profile_draft.py)


def test_profile_breakdown_verify(tmp_path, capsys):
    out = tmp_path / "verify"
    args = ["profile", "--target", "tiny-debug", "--breakdown", "verify", "--tokens", "1", "2", "8"]
    code, stdout, err = run_main(args + ["--rounds", "2", "--context_len", "16", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "verify_profile.json").read_text())
    variants = doc["info"]["variants"]
    assert variants[0] == "hf" and variants[-1] == "lean" and doc["info"]["breakdown_of"] == "lean"
    assert [r["B"] for r in doc["rows"]] == [1, 2, 8]
    for r in doc["rows"]:
        assert all(r[f"{n}_ms"] > 0 for n in variants)
    assert doc["rows"][0]["hf_vs_B1"] == 1.0
    assert set(doc["breakdown"]) == {"1", "8"} and all(o["ms_per_step"] >= 0 for o in doc["breakdown"]["1"])
    assert (out / "verify_profile.md").read_text().startswith("Verification step") and "| B |" in stdout


def test_profile_breakdown_draft(drafter, tmp_path, capsys):
    out = tmp_path / "draft"
    args = ["profile", "--target", "tiny-debug", "--breakdown", "draft", "--drafter", drafter, "--layers", "1"]
    code, _, err = run_main(args + ["--rounds", "2", "--context_len", "16", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "draft_profile.json").read_text())
    V = load_target("tiny-debug").geometry.vocab_size
    variants = ["trained", "trained bf16", f"vocab {V}", f"vocab {V} bf16"]  # no draft vocabulary below V here
    assert sorted({r["variant"] for r in doc["rows"]}) == sorted(variants)
    assert {(r["variant"], r["T"]) for r in doc["rows"]} == {(v, T) for v in variants for T in (0.0, 1.0)}
    for r in doc["rows"]:
        assert r["total"] > 0 and r["backbone"] > 0 and r["block_size"] == (3 if "trained" in r["variant"] else 7)
        assert r["total"] >= r["backbone"]
    assert doc["info"]["drafter"] == drafter


@pytest.mark.parametrize(
    "extra, word",
    [(["--breakdown", "ops", "--out", "o"], "--breakdown"), (["--breakdown", "verify"], "--out"),
     (["--breakdown", "verify", "--out", "o", "--plot", "p.png"], "--plot"),
     (["--breakdown", "verify", "--out", "o", "--tokens", "0"], "--tokens"),
     (["--breakdown", "verify", "--out", "o", "--drafter", "d"], "--drafter")],
)  # fmt: skip
def test_profile_breakdown_rejects_bad_options(tmp_path, capsys, monkeypatch, extra, word):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["profile", "--target", "tiny-debug", *extra], capsys)
    assert code == 2 and word in err
    assert not (tmp_path / "o").exists()


# plots: a grid of at most 4 columns, whole-number positions


def _acceptance(n_sets: int, gamma: int, drafters=("a", "b")) -> dict:
    one = {"domain": "math", "conditional_acceptance": [0.9 - 0.1 * k for k in range(gamma)], "survival": [0.5] * gamma}
    return {d: {f"set{i}": {**one, "rounds": 3} for i in range(n_sets)} for d in drafters}


@pytest.mark.parametrize("n_sets, grid", [(8, (2, 4)), (3, (1, 3)), (5, (2, 4)), (1, (1, 1))])
def test_acceptance_plot_is_a_grid_with_integer_positions(tmp_path, n_sets, grid):
    from dspark_lightning.eval.report import acceptance_figure, plot_acceptance
    from dspark_lightning.plots import plt

    fig = acceptance_figure(_acceptance(n_sets, 7), title="t")
    axes = fig.get_axes()
    assert len(axes) == n_sets  # the unused cells of the last row are removed
    assert all(ax.get_subplotspec().get_geometry()[:2] == grid for ax in axes)
    for ax in axes:
        ticks = list(ax.get_xticks())
        assert ticks == list(range(1, 8))  # positions 1..γ, whole numbers only
        assert ax.get_ylim() == (0.0, 1.0) and len(ax.get_lines()) == 2  # one line per drafter
    plt.close(fig)
    w, h = _png_size(plot_acceptance(_acceptance(n_sets, 7), tmp_path / "a.png"))
    rows, cols = grid
    assert (w, h) == (round(4.2 * cols * 120), round(3.6 * rows * 120))  # 8 sets: 2016 x 864, not 4032 x 432


def test_acceptance_plot_with_a_long_block_keeps_integer_ticks():
    from dspark_lightning.eval.report import acceptance_figure
    from dspark_lightning.plots import plt

    fig = acceptance_figure(_acceptance(2, 40))
    for ax in fig.get_axes():
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 40]
        assert len(ticks) <= 16 and all(float(t).is_integer() for t in ticks)
    plt.close(fig)


def test_bench_plot_is_a_grid(tmp_path):
    from dspark_lightning.eval.bench import plot_bench

    rows = [{"temperature": T, "batch": b, "prompt_set": s, "engine": e, "tok_s": 1.0}
            for T in (0.0, 1.0) for b, s in ((1, "math"), (1, "code"), (1, "chat"), (8, "all"))
            for e in ("HF generate", "plain decode()", "d")]  # fmt: skip
    w, h = _png_size(plot_bench({"info": {"target": "t"}, "rows": rows}, tmp_path / "b.png"))
    assert (w, h) == (round(3.2 * 4 * 110), round(3.8 * 2 * 110))  # 8 cells: 2 rows of 4


# the ablation queue: one base recipe + command-line overrides per run


def _queue_commands() -> list[list[str]]:
    r = subprocess.run(["bash", "scripts/fit_queue.sh", "--dry-run", "--queue", "benchmarks/ablations.queue"],
                       cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    return [shlex.split(line) for line in r.stdout.splitlines() if line.strip()]


def test_ablation_queue_matches_the_table_variants():
    spec = importlib.util.spec_from_file_location("ablation_tables", ROOT / "benchmarks" / "ablation_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    from dspark_lightning.lightning.cli import DSparkCLI
    from dspark_lightning.lightning.datamodule import DSparkDataModule
    from dspark_lightning.lightning.module import DSparkModule

    commands = _queue_commands()
    assert len(commands) == len(tables.VARIANTS) == 13
    parser = None
    seen = set()
    for cmd in commands:
        assert cmd[1] == "fit" and cmd[2] == "--config"
        if parser is None:  # one CLI built (the base recipe instantiated), then each run's arguments parsed
            parser = DSparkCLI(DSparkModule, DSparkDataModule, run=False, args=cmd[2:4]).parser
        cfg = parser.parse_args(cmd[2:])
        root = cfg.trainer.default_root_dir
        name = root.removeprefix("outputs/ablations/")
        drafter, layers, gamma, head = tables.VARIANTS[name]
        seen.add(name)
        assert cmd[3] == f"recipes/compare/{drafter}.yaml"
        loggers = [
            (lg.class_path.rsplit(".", 1)[1], lg.init_args.save_dir, lg.init_args.name) for lg in cfg.trainer.logger
        ]
        assert loggers == [("TensorBoardLogger", root, "tb"), ("CSVLogger", root, "csv")]
        assert cfg.trainer.max_steps == 130 and cfg.trainer.val_check_interval == 130 and cfg.seed_everything == 42
        assert cfg.model.backbone.init_args.num_layers == layers and cfg.model.block_size == gamma
        if head is None:
            assert cfg.model.seq_head is None and cfg.model.conf_head is None
        else:
            cls = {"vanilla": "VanillaMarkovHead", "gated": "GatedMarkovHead", "rnn": "RNNHead"}[head]
            assert cfg.model.seq_head.class_path.endswith(cls) and cfg.model.seq_head.init_args.rank == 256
    assert seen == set(tables.VARIANTS)


def test_fit_queue_runs_recipes_and_skips_finished_runs(tmp_path):
    """A stand-in for the CLI records each call: a queue line's run directory goes into default_root_dir and
    both loggers; a run with an exported drafter is skipped."""
    fake = tmp_path / "fake_cli"
    fake.write_text('#!/usr/bin/env bash\necho "$@" >> "$CALLS"\n')
    fake.chmod(0o755)
    done = tmp_path / "runs" / "done"
    (done / "tb" / "version_0" / "drafter").mkdir(parents=True)
    (done / "tb" / "version_0" / "drafter" / "config.json").write_text("{}")
    queue = tmp_path / "q.queue"
    queue.write_text(f"# comment\n\n{tmp_path}/runs/new recipes/compare/dspark.yaml --model.block_size=3  # γ 3\n"
                     f"{done} recipes/compare/dspark.yaml\n")  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "DSPARK_BIN": str(fake), "CALLS": str(tmp_path / "calls")}
    if not shutil.which("time", path="/usr/bin"):
        pytest.skip("/usr/bin/time is not installed")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "fit_queue.sh"), "--queue", str(queue)], cwd=ROOT, env=env,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and f"--trainer.default_root_dir={tmp_path}/runs/new" in calls[0]
    assert calls[0].endswith("--model.block_size=3") and calls[0].count(f"save_dir: {tmp_path}/runs/new") == 2
    assert "skipping" in r.stdout and (tmp_path / "runs" / "new" / "time.log").is_file()


# the Makefile: product targets at the top, the experiments included from benchmarks/Makefile

OLD_TARGETS = (
    "setup run test test-fast lint bench bench-decode compare eval-compare bench-compare ablations calibrate "
    "threshold-sweep serve-bench serve-study profile-verify profile-draft bench-regen long long-dflash vocab-coverage "
    "sps-lean bench-speed speed-suite acceptance acceptance-main matrix-data matrix bench-main bench-long gpu-wheels "
    "gpu-check gpu-check-cpu serve-bench-gate budget-decoded self-chat-prompts budget-cells llamacpp-tools llamacpp "
    "servable-cells"
).split()
PRODUCT = {
    "setup",
    "run",
    "test",
    "test-fast",
    "lint",
    "long",
    "gpu-wheels",
    "gpu-check",
    "gpu-check-cpu",
    "llamacpp-tools",
}


def _rules(makefile) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-z][\w-]*):", makefile.read_text(), re.M)}


def _outside_make() -> dict[str, str]:
    """The environment without the variables a calling ``make test`` (CI) passes down to a nested make."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_make_target_still_resolves_and_names_existing_files():
    assert _rules(ROOT / "Makefile") == PRODUCT
    assert "include benchmarks/Makefile" in (ROOT / "Makefile").read_text()
    assert not _rules(ROOT / "benchmarks" / "Makefile") & PRODUCT
    r = subprocess.run(["make", "--no-print-directory", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                       env=_outside_make())  # fmt: skip
    assert r.returncode == 0 and r.stdout.splitlines()[-1].endswith("-m pytest -q")  # what CI runs, unchanged
    for target in OLD_TARGETS:
        r = subprocess.run(["make", "--no-print-directory", "-n", target, "LONG=L", "MAIN=M"], cwd=ROOT,
                           capture_output=True, text=True, env=_outside_make())  # fmt: skip
        assert r.returncode == 0, (target, r.stderr)
        for path in re.findall(r"\b((?:scripts|benchmarks)/[\w./-]+\.(?:py|sh|queue|yaml))", r.stdout):
            assert (ROOT / path).is_file(), (target, path)


def test_docs_name_only_scripts_that_exist():
    """Every ``scripts/...`` or ``benchmarks/...`` file the README, the docs, the recipes and the benchmarks name."""
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "recipes").rglob(
        "*.yaml"), *(ROOT / "benchmarks").iterdir(), *(ROOT / "scripts").iterdir()]  # fmt: skip
    missing = []
    for f in texts:
        if f.is_file():
            for path in re.findall(r"\b((?:scripts|benchmarks)/[\w/-]+\.(?:py|sh|queue|yaml|md))", f.read_text()):
                if not (ROOT / path).is_file():
                    missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing
