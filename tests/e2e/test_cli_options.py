"""Command-line options of eval, bench and profile (``eval --scheduler static:γ``, ``eval --prompts``,
``bench --scheduler A B --batching``), the plots' geometry, and that the docs name only
files that exist."""

import json
import re
import struct

import pytest

from .conftest import ROOT, run_main


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


# eval --scheduler {class_path: static, init_args: {gamma: γ}}, eval --prompts


def test_eval_static_gamma_fixes_the_block(drafter, tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--drafter", f"d={drafter}", "--scheduler", "{class_path: static, init_args: {gamma: 1}}"]
    args += ["--temperature", "0"]
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


def test_a_schedulers_arguments_are_its_own(drafter, tmp_path, capsys):
    """An argument the scheduler does not take, or a value it refuses, is one line naming --scheduler."""
    for text, fact in (("{class_path: threshold, init_args: {gamma: 2}}", "it takes threshold, mode"),
                       ("{class_path: static, init_args: {gamma: -1}}", "gamma"),
                       ("static:4", "{class_path: static, init_args: {...}}")):  # fmt: skip
        args = ["eval", "--drafter", drafter, "--scheduler", text, "--out", str(tmp_path / "o")]
        code, _, err = run_main(args, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--scheduler" in err and fact in err, err


def test_one_scheduler_spec_means_the_same_in_decode_eval_bench_and_serve_bench(drafter, tmp_path, capsys,
                                                                            monkeypatch):  # fmt: skip
    """The same scheduler text and --sps table reach the engine as the same scheduler in all four commands."""
    from dspark_lightning.infer import engine

    built = []
    real = engine.build_scheduler

    def record(spec):
        s = real(spec)
        if hasattr(s, "sps"):  # plain decoding's engine (bench's and serve-bench's plain rows) has a static one
            built.append((type(s).__name__, s.context_len, tuple(s.sps.tokens), tuple(s.sps.sps)))
        return s

    monkeypatch.setattr(engine, "build_scheduler", record)
    sps = tmp_path / "sps.json"
    sps.write_text(json.dumps({"tokens": [1, 2, 4, 8], "sps": [100.0, 95.0, 80.0, 50.0]}))
    text, out = "{class_path: hardware_aware, init_args: {context_len: 64}}", str(tmp_path / "o")
    small = ["--prompts_per_domain", "1", "--domains", "math", "--max_new_tokens", "3", "--sps", str(sps)]
    runs = {
        "decode": ["decode", "--target", "tiny-debug", "--drafter", drafter, "--prompt", "hi", "--max_new_tokens",
                   "3", "--scheduler", text, "--sps", str(sps)],
        "eval": ["eval", "--drafter", drafter, "--scheduler", text, "--out", out + "e", *small],
        "bench": ["bench", "--drafter", drafter, "--scheduler", text, "--out", out + "b", "--temperatures", "0",
                  "--batches", "1", "--repeats", "1", *small],
        "serve-bench": ["serve-bench", "--drafter", drafter, "--methods", text, "--out", out + "s", "--concurrency",
                        "1", "--window_s", "0.2", *small],
    }  # fmt: skip
    seen = {}
    for command, args in runs.items():
        built.clear()
        code, _, err = run_main(args, capsys)
        assert code == 0, (command, err[-1500:])
        seen[command] = set(built)
    want = {("HardwareAwareScheduler", 64, (1, 2, 4, 8), (100.0, 95.0, 80.0, 50.0))}
    assert all(got == want for got in seen.values()), seen


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


# bench --scheduler A B --batching padded flat


def test_bench_several_schedulers_and_batching_modes(drafter, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--drafter", f"d={drafter}", "--scheduler", "[static,threshold]", "--batching", "[padded,flat]"]
    args += ["--temperatures", "0", "--batches", "1", "--domains", "math", "--prompts_per_domain", "1"]
    code, _, err = run_main(args + ["--max_new_tokens", "4", "--repeats", "2", "--out", str(out)], capsys)
    assert code == 0, err[-2000:]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["info"]["scheduler"] == ["static", "threshold"] and doc["info"]["batching"] == ["padded", "flat"]
    ours = [f"{e} [{lay}]" for lay in ("padded", "flat")
            for e in ("plain decode(), HF forward", "plain decode()", "d [static]", "d [threshold]")]  # fmt: skip
    rows = {r["decoder"]: r for r in doc["rows"]}
    assert list(rows) == ["HF generate", "HF prompt lookup", *ours]
    for name in ours:
        r = rows[name]
        assert r["batching"] == name.rsplit("[", 1)[1].rstrip("]") and r["equals_hf"] is True  # lossless in each
        plain = rows[f"plain decode() [{r['batching']}]"]
        assert r["speedup_vs_plain"] == pytest.approx(r["tok_s"] / plain["tok_s"])  # against its own batching mode
    assert rows["d [static] [flat]"]["scheduler"] == "static"
    assert "Per-position acceptance" in (out / "bench.md").read_text()


@pytest.mark.parametrize(
    "extra, word",
    [(["--batching", "ragged"], "--batching"), (["--layouts", "ragged"], "--layouts"),
     (["--scheduler", "[static,static]"], "--scheduler"),
     (["--scheduler", "warp"], "--scheduler"), (["--scheduler", "threshold:gamma=2"], "--scheduler")],
)  # fmt: skip
def test_bench_rejects_bad_scheduler_and_batching_lists(drafter, tmp_path, capsys, extra, word):
    code, _, err = run_main(["bench", "--drafter", drafter, *extra, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and word in err


def test_the_evaluation_commands_share_one_checked_group(drafter, tmp_path, capsys):
    """Every evaluation command takes the same options (flat flags, its own defaults), received as one dataclass that
    checks them in its constructor, from the command line and from Python alike."""
    from dspark_lightning.checks import UsageError
    from dspark_lightning.cli.evaluate import BenchCommon, Common, EvalCommon

    assert (EvalCommon(out="o").max_new_tokens, BenchCommon(out="o").prompts_per_domain, Common(out="o").seed) == (
        256, 3, 0)  # fmt: skip
    with pytest.raises(UsageError, match="--prompts_per_domain"):
        Common(out=str(tmp_path), prompts_per_domain=0)
    with pytest.raises(UsageError, match="tpu"):
        Common(out=str(tmp_path), device="tpu")
    for cmd in ("eval", "bench", "threshold-sweep", "serve-bench"):
        code, _, err = run_main([cmd, "--drafter", drafter, "--max_new_tokens", "0", "--out", str(tmp_path)], capsys)
        assert code == 2 and "--max_new_tokens" in err, (cmd, err)
    from jsonargparse import ArgumentParser

    from dspark_lightning.cli.evaluate import threshold_sweep

    parser = ArgumentParser()
    parser.add_function_arguments(threshold_sweep)
    helps = parser.format_help()
    assert "--drafter" in helps and "--out" in helps and "--common" not in helps


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

    rows = [{"temperature": T, "batch": b, "prompt_set": s, "decoder": e, "tok_s": 1.0}
            for T in (0.0, 1.0) for b, s in ((1, "math"), (1, "code"), (1, "chat"), (8, "all"))
            for e in ("HF generate", "plain decode()", "d")]  # fmt: skip
    w, h = _png_size(plot_bench({"info": {"target": "t"}, "rows": rows}, tmp_path / "b.png"))
    assert (w, h) == (round(3.2 * 4 * 110), round(3.8 * 2 * 110))  # 8 cells: 2 rows of 4


# the docs point at files that exist


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
