"""Parts a plugin adds without editing the package: a scheduler with arguments, named the same way in Python and in
every command, a sequential head that declares its serving names and so exports for servers, a regeneration backend
and a serving layout."""

import pytest
import torch

from dspark_lightning import create
from dspark_lightning.checks import UsageError
from dspark_lightning.drafters.heads.sequential import LOW_RANK_WEIGHTS, GatedMarkovHead
from dspark_lightning.infer import Scheduler, decode
from dspark_lightning.infer.schedule.schedulers import scheduler_spec
from dspark_lightning.testing import random_target


class Capped(Scheduler):
    """Verify the first ``cap`` drafts, or none when ``every`` rounds have not passed (a test plugin)."""

    def __init__(self, cap: int = 1, every: int = 1) -> None:
        if cap < 0 or every < 1:
            raise ValueError(f"cap must be >= 0 and every >= 1, got cap={cap}, every={every}")
        self.cap, self.every, self.calls = cap, every, 0

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        n = self.cap if self.calls % self.every == 0 else 0
        return torch.full((conf.shape[0],), min(n, conf.shape[1]), dtype=torch.long)


def test_a_plugin_scheduler_with_arguments_is_named_like_the_builtins(registered):
    registered("scheduler", "capped")(Capped)
    spec = {"class_path": "capped", "init_args": {"cap": 2, "every": 3}}
    assert scheduler_spec("{class_path: capped, init_args: {cap: 2, every: 3}}") == spec  # the command line's YAML
    assert scheduler_spec("capped") == "capped"
    bad = {"{class_path: capped, init_args: {cap: -1}}": "cap must be >= 0", "capped:2": "class_path: capped",
           "{class_path: capped, init_args: {depth: 2}}": "depth", "{class_path: capped, init_args: 2}": "mapping",
           "{name: capped}": "class_path"}  # fmt: skip
    for text, fact in bad.items():
        with pytest.raises(UsageError, match=fact):
            scheduler_spec(text)
    target = random_target(layers=4, seed=1)
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=4,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        mask_token_id=1,
    )
    for capped in (
        {"class_path": "capped", "init_args": {"cap": 2}},  # registered: its name
        {"class_path": f"{Capped.__module__}.Capped", "init_args": {"cap": 2}},
    ):  # or its import path
        res = decode(target, drafter, [[5, 6, 7]], max_new_tokens=8, stop_token_ids=[], scheduler=capped)
        assert res.stats.mean_verify_len == pytest.approx(2.0)  # its argument reached the engine: 2 drafts a round


def test_a_plugin_acceptance_mode_is_chosen_by_name_in_python_and_the_cli(registered, capsys):
    from dspark_lightning.infer.acceptance.accept import RejectionAcceptance

    made = []

    def counted(params, device, proposer=None, tag: str = "x"):  # its own setting: a tag recorded per build
        made.append((params.temperature, tag))
        return RejectionAcceptance(params, device)

    registered("acceptance", "counted")(counted)
    target = random_target(layers=4, seed=1)
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        mask_token_id=1,
    )
    # a fixed schedule: at T > 0 rejection sampling's tokens depend on it, and auto's reads measured step times
    static = {"class_path": "static", "init_args": {"gamma": 2}}
    kw = {"max_new_tokens": 6, "stop_token_ids": [], "temperature": 1.0, "seed": 3, "scheduler": static}
    a = decode(target, drafter, [[5, 6, 7]], acceptance="counted", **kw)
    b = decode(target, drafter, [[5, 6, 7]], acceptance="rejection", **kw)
    assert set(made) == {(1.0, "x")} and a.token_ids == b.token_ids  # the call's engine built it
    n = len(made)
    decode(target, drafter, [[5, 6, 7]], acceptance={"class_path": "counted", "init_args": {"tag": "py"}}, **kw)
    with pytest.raises(Exception, match="counted"):  # an unknown name lists the registered ones
        decode(target, drafter, [[5, 6, 7]], acceptance="nope", **kw)
    with pytest.raises(UsageError, match="counted.*colour"):
        decode(target, drafter, [[5, 6, 7]], acceptance={"class_path": "counted", "init_args": {"colour": 1}}, **kw)
    from dspark_lightning.cli import main

    cmd = ["decode", "--target", "tiny-debug", "--prompt", "hi", "--max_new_tokens", "2", "--acceptance"]
    main([*cmd, "counted"])
    main([*cmd, "{class_path: counted, init_args: {tag: cli}}"])
    assert made[n:] == [(1.0, "py"), (0.0, "x"), (0.0, "cli")]  # the profile of this kind was made once


class ScaledMarkov(GatedMarkovHead):
    """A gated head under a name of its own, with its own serving names (a test plugin)."""

    serving_type = "scaled_gate"
    serving_weights = (*LOW_RANK_WEIGHTS, ("gate.", "scale_proj."))


def test_a_plugin_head_that_declares_serving_names_exports_and_reads_back(registered, tmp_path):
    from dspark_lightning import load_drafter
    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.export import export_drafter

    registered("seq_head", "scaled_markov")(ScaledMarkov)
    target = random_target(layers=4, seed=1)
    torch.manual_seed(0)
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        seq_head={"class_path": "scaled_markov", "init_args": {"rank": 8}},
        conf_head="linear",
        mask_token_id=1,
    )
    src = save_drafter(drafter, tmp_path / "native", target)
    out = tmp_path / "hf"
    export_drafter(src, "dspark-hf", out, target=target)
    import json

    from safetensors.torch import load_file

    assert json.loads((out / "config.json").read_text())["markov_head_type"] == "scaled_gate"
    assert any(k.startswith("markov_head.scale_proj.") for k in load_file(str(out / "model.safetensors")))
    back = load_drafter(out, target)
    assert type(back.seq_head) is ScaledMarkov
    prompt = [[5, 6, 7, 8]]
    a = decode(target, drafter, prompt, max_new_tokens=6, stop_token_ids=[], scheduler="static")
    b = decode(target, back, prompt, max_new_tokens=6, stop_token_ids=[], scheduler="static")
    assert a.token_ids == b.token_ids and a.stats.tau == pytest.approx(b.stats.tau)


@pytest.mark.parametrize("name", ["dspark", "hf"])
def test_the_builtin_regeneration_backends_conform(name):
    from dspark_lightning.testing import check_regen_backend

    check_regen_backend(name)


def test_a_plugin_regeneration_backend_is_chosen_by_name_in_a_recipe_and_regenerate(registered, tmp_path):
    """A backend a plugin registers answers the data stage: ``data.regen.backend: <name>`` accepts it, ``regenerate``
    writes its answers, and ``testing.check_regen_backend`` passes it."""
    from dspark_lightning.data.prompts.sources import PromptRecord
    from dspark_lightning.data.regen.backend import TurnByTurnBackend
    from dspark_lightning.data.regen.config import RegenConfig
    from dspark_lightning.data.regen.regenerate import load_conversations, regenerate
    from dspark_lightning.testing import check_regen_backend, random_target

    @registered("regen_backend", "echo")
    class Echo(TurnByTurnBackend):  # answers with the seed's last digits: deterministic per (conversation, turn)
        def sample(self, prompts, seeds, budgets):
            return [(f"echo {s % 1000}", 3, True) for s in seeds]

    assert RegenConfig(backend="echo").identity()["backend"] == "echo"
    check_regen_backend("echo")
    out = tmp_path / "r.jsonl"
    recs = [PromptRecord("a", "chat", "t", ["hi", "again"])]
    stats = regenerate(random_target(), recs, out, backend="echo", progress=False, max_new_tokens=4)
    (row,) = load_conversations(out)
    assert stats["written"] == 1 and row["gen"]["backend"] == "echo" and row["gen"]["new_tokens"] == [3, 3]
    assert [m["content"].split()[0] for m in row["turns"] if m["role"] == "assistant"] == ["echo", "echo"]


def test_a_plugin_layout_writer_is_exported_by_name(registered, tmp_path):
    """A layout a plugin registers is a ``--layout`` of ``export``: its files, then the servers' own, its notes."""
    import json

    from dspark_lightning.checkpoint import save_drafter
    from dspark_lightning.drafters import build_drafter
    from dspark_lightning.export import InteropError, Layout, export_drafter, serving_layouts
    from dspark_lightning.testing import check_layout

    @registered("layout", "backbone-only")
    class BackboneOnly(Layout):  # written, not read back; its own setting: which layers
        def __init__(self, layers: int | None = None) -> None:
            if layers is not None and layers < 1:
                raise InteropError(f"layout backbone-only: layers must be >= 1, got {layers}")
            self.layers = layers

        def build(self, drafter, target, *, dtype, server):
            keep = [f"backbone.layers.{i}." for i in range(self.layers or len(drafter.backbone.layers))]
            state = {
                k: v.detach().to(dtype).clone()
                for k, v in drafter.state_dict().items()
                if k.startswith("backbone.") and (not k.startswith("backbone.layers.") or k.startswith(tuple(keep)))
            }
            return {"architectures": ["BackboneOnly"], "layers": self.layers}, state, {}, ["backbone only"]

    assert "backbone-only" in serving_layouts()
    check_layout("backbone-only")
    check_layout({"class_path": "backbone-only", "init_args": {"layers": 1}})
    target = random_target()
    drafter = build_drafter(
        target, 4, backbone="dense", seq_head={"class_path": "vanilla", "init_args": {"rank": 8}}, mask_token_id=1
    )
    native = save_drafter(drafter, tmp_path / "native", target)
    spec = {"class_path": "backbone-only", "init_args": {"layers": 1}}
    res = export_drafter(native, spec, tmp_path / "out", target=target, dtype="fp32")
    assert res.layout == "backbone-only" and "backbone only" in res.notes
    assert json.loads((res.path / "config.json").read_text())["layers"] == 1
    with pytest.raises(InteropError, match="unknown layout 'nope'; choose from native, .*backbone-only"):
        export_drafter(native, "nope", tmp_path / "x", target=target)
    with pytest.raises(InteropError, match="layers must be >= 1"):
        export_drafter(native, {"class_path": "backbone-only", "init_args": {"layers": 0}}, tmp_path / "y")
    from dspark_lightning.cli import main

    main(["export", "--drafter", str(native), "--out", str(tmp_path / "cli"), "--target", "tiny-debug", "--layout",
          "{class_path: backbone-only, init_args: {layers: 1}}"])  # fmt: skip
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["layers"] == 1


@pytest.mark.parametrize("name", ["rejection", "coupled"])
def test_the_builtin_acceptance_modes_conform(name):
    from dspark_lightning.testing import check_acceptance

    check_acceptance(name)


@pytest.mark.parametrize("name, drafter", [("dspark-hf", "dspark"), ("eagle3-hf", "eagle3")])
def test_the_builtin_layouts_conform(name, drafter):
    from dspark_lightning.testing import check_layout

    check_layout(name, drafter)
