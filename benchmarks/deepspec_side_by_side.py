"""DeepSpec's own DSpark model and loss beside ours: the same cached features, batches, steps and LR schedule, both
decoded by our evaluator.

    python benchmarks/deepspec_side_by_side.py --deepspec-repo /tmp/deepspec --features outputs/smollm2_dspark/data \
        --steps 1000 --out benchmarks/results/data/deepspec_side_by_side          # make deepspec-side-by-side

``--deepspec-repo`` is a checkout of deepseek-ai/DeepSpec (``git clone``, or ``git archive HEAD | tar -x``); its
code is imported from there, never copied here. ``--features`` is the work dir of ``dspark-lightning prepare`` for
``--recipe`` (default make run's, ``recipes/smollm2_dspark.yaml``). Arms (``--arms``):

- ``ours``: the recipe as ``make run`` trains it (``dspark-lightning fit``), with ``trainer.max_steps = --steps``, no
  wall-clock budget, and the shared optimizer settings below;
- ``ours_as_deepspec``: the same fit with DeepSpec's loss and model settings where ours differ: loss 0.1 CE +
  0.9 L1 + 1.0 BCE with decay 4, the full vocabulary, no warm start, no argmax CE;
- ``deepspec``: DeepSpec's ``Qwen3DSparkModel`` (``deepspec/modeling/dspark/qwen3/``) built by its own
  ``build_draft_config`` from our target's config and its config file's ``model`` section (``--deepspec-config``,
  default ``config/dspark/dspark_qwen3_4b.py``), mapped to our target (tapped layers, mask token, block size, depth:
  ``--deepspec-layers``, default the recipe's), trained with its ``compute_dspark_loss`` and its optimizer
  (``deepspec/utils/optim.py``: AdamW on fp32 masters, linear warmup then cosine) in its precision, on the
  batches the first ``ours*`` arm trained on, in the same order and with the same anchors (``--anchors ours``);
  then written by its own ``save_pretrained`` (DeepSpec's checkpoint layout) and imported into our drafter format
  (:func:`convert_deepspec_dir`).

Shared by every arm: ``--steps`` optimizer steps of one micro-batch each, learning rate ``--lr`` (default DeepSpec's
6e-4) with DeepSpec's schedule (4 % linear warmup, then cosine to 0; ours is the same function, ``model.optim`` with
``time_budget_s: null``), AdamW (0.9, 0.999), eps 1e-8, no weight decay, gradient norm clipped at 1.0. The per-step
learning rates of every arm are recorded and compared in the report.

What has to change for DeepSpec to train on a CPU (reported in the output): FlexAttention has no CPU backward, so
its attention runs through transformers' SDPA path with a dense boolean mask of the same predicate as its
``create_dspark_attention_mask`` (rows of dummy blocks, which flex leaves at zero and no loss reads, attend their
own block instead, keeping them finite); ``torch.compile``, FSDP and the distributed sampler are not used (one
process: its loss's all-reduce runs in a one-rank gloo group).

Then every arm's drafter is decoded by ``dspark-lightning eval --scheduler static:γ --temperature 0
--batch_size 1`` (what ``benchmarks/acceptance_probe.py`` runs) on the math / code / chat sets. Writes
``<out>/side_by_side.json`` and ``<out>/side_by_side.md`` (with the checks: same batches in every arm, the per-step
learning rates against DeepSpec's, the converted drafter's forward and loss against DeepSpec's model on one batch),
``<out>/per_step_<arm>.json`` and the evaluation in ``<out>/eval_T0/``; each arm's run (recipe, log, recorded
batches, DeepSpec's checkpoint, the drafters) in ``--work``/<arm>/ (default ``outputs/deepspec_side_by_side``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ARMS = ("ours", "ours_as_deepspec", "deepspec")
OURS_ARMS = ("ours", "ours_as_deepspec")
# DeepSpec's loss and model settings where our recipe differs (config/dspark/dspark_qwen3_4b.py): the overrides of
# the ours_as_deepspec arm. Depth, Markov rank and block size stay the recipe's; the deepspec arm takes the recipe's
# depth and block size and its own config's rank (make run's recipe: 1 layer, r = 256, γ = 7 in all three arms).
DEEPSPEC_LOSS = {"ce_weight": 0.1, "l1_weight": 0.9, "conf_weight": 1.0, "soft_ce_weight": 0.0, "top_ce_weight": 0.0}
AS_DEEPSPEC = {"model": {"loss": {**DEEPSPEC_LOSS, "decay": 4.0}, "draft_vocab_size": None, "warm_start": None}}
# DeepSpec tensors that have no trained counterpart in our drafter: the frozen copies of the target's embedding and
# LM head (ours share the target's modules; the importer checks they equal the target's) and RoPE buffers.
SHARED = ("embed_tokens.weight", "lm_head.weight")


class DeepSpecImportError(ValueError):
    """A DeepSpec checkpoint that our drafter format cannot hold for this target; the message says why."""


# --- recording the batches a fit trains on ---------------------------------------------------------------------
class RecordBatches(L.Callback):
    """Writes ``path`` (JSON) at the end of training: per optimizer step the sample ids, epoch, anchors and validity
    of its batch, the learning rate it used and its loss. Pins the training shuffle: the global torch RNG is seeded
    with ``seed`` when fit starts (the first epoch's sampler draws its seed while the loop sets up, after the model's
    initialisation, which differs between arms) and with ``seed + epoch`` at each later epoch's start, so arms with
    different models see the same batches in the same order. Nothing else in a fit draws from that RNG after it
    starts (anchors and curriculum phases use their own generators)."""

    def __init__(self, path: str, seed: int = 0) -> None:
        self.path, self.seed = Path(path), int(seed)
        self.steps: list[dict[str, Any]] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.manual_seed(self.seed)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch > 0:  # epoch 0's order was drawn at set-up, after on_fit_start
            torch.manual_seed(self.seed + trainer.current_epoch)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self.steps.append({
            "step": int(trainer.global_step), "epoch": int(trainer.current_epoch), "ids": list(batch["ids"]),
            "anchors": batch["anchors"].tolist(), "valid": batch["valid"].tolist(),
            "lr": float(trainer.optimizers[0].param_groups[0]["lr"]),
        })  # fmt: skip

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self.steps and isinstance(outputs, dict) and "loss" in outputs:
            self.steps[-1]["loss"] = float(outputs["loss"].detach())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path.write_text(json.dumps({"seed": self.seed, "steps": self.steps}) + "\n")


# --- recipes ---------------------------------------------------------------------------------------------------
def merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in (nested dicts merged, anything else replaced)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def recipe_depth(recipe: dict) -> int:
    """The recipe's drafter depth (``model.backbone``: class_path + init_args, or a registered name / dict)."""
    bb = recipe.get("model", {}).get("backbone")
    if isinstance(bb, dict):
        args = bb.get("init_args", bb.get("args", bb))
        return int(args.get("num_layers", 5))
    return 5  # the registered dense backbone's default


def recipe_rank(recipe: dict) -> int:
    """The recipe's Markov rank r (0 = no sequential head)."""
    head = recipe.get("model", {}).get("seq_head")
    if head is None:
        return 0
    if isinstance(head, dict):
        args = head.get("init_args", head.get("args", head))
        return int(args.get("rank", 256))
    return 256


def arm_recipe(base: dict, arm: str, *, steps: int, features: Path, run_dir: Path, optim: dict, seed: int) -> dict:
    """The recipe of one of our arms: ``base`` trained ``steps`` steps on ``features`` with the shared optimizer
    settings, validated once at the end, no checkpoint files, no serving export, and :class:`RecordBatches`."""
    r = merge(base, AS_DEEPSPEC) if arm == "ours_as_deepspec" else copy.deepcopy(base)
    r.pop("export", None)  # serving exports (llama.cpp, vLLM) are not compared here
    data = r.setdefault("data", {})
    data["work_dir"], data["features"] = str(features), "cached"
    model = r.setdefault("model", {})
    model["optim"] = {**(model.get("optim") or {}), **optim, "time_budget_s": None, "schedule": "cosine"}
    if arm == "ours_as_deepspec":
        model.pop("curriculum", None)  # DeepSpec trains one phase
    t = r.setdefault("trainer", {})
    t.update({"max_steps": steps, "max_time": None, "val_check_interval": steps, "check_val_every_n_epoch": None,
              "default_root_dir": str(run_dir), "enable_checkpointing": False})  # fmt: skip
    t["logger"] = [{"class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": str(run_dir), "name": "csv"}}]  # fmt: skip
    keep = [c for c in t.get("callbacks") or [] if "ModelCheckpoint" not in str(c.get("class_path", c))]
    record = {"class_path": "deepspec_side_by_side.RecordBatches",
              "init_args": {"path": str(run_dir / "batches.json"), "seed": seed}}  # fmt: skip
    t["callbacks"] = [*keep, record]
    return r


def fit_ours(base: dict, arm: str, work: Path, *, steps: int, features: Path, optim: dict, seed: int) -> dict:
    """``dspark-lightning fit`` of one of our arms in a subprocess, in ``<work>/<arm>/`` (its log: ``fit.log``)."""
    run_dir = work / arm
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    recipe = run_dir / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(arm_recipe(base, arm, steps=steps, features=features, run_dir=run_dir,
                                                optim=optim, seed=seed), sort_keys=False))  # fmt: skip
    cmd = [sys.executable, "-m", "dspark_lightning.cli.fit", "fit", "--config", str(recipe),
           "--validate_before_fit", "false", "--export.dir", str(run_dir / "drafter")]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    print(f"[side-by-side] fit {arm}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(run_dir / "fit.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"fit of arm {arm} failed (exit {rc}); see {run_dir / 'fit.log'}")
    stats = json.loads(next(run_dir.glob("csv/version_*/fit_stats.json")).read_text())
    record = json.loads((run_dir / "batches.json").read_text())
    return {"arm": arm, "drafter": str(run_dir / "drafter"), "process_wall_s": wall, "fit_stats": stats,
            "record": record}  # fmt: skip


def check_prepared(recipe: dict, features: Path) -> None:
    """Refuse features that ``fit`` would not reuse (it would prepare the recipe's data again, for many minutes):
    ``prepared.json`` must carry this recipe's data fingerprint."""
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    data = {**recipe.get("data", {}), "target": recipe["target"], "work_dir": str(features), "features": "cached"}
    job = DSparkDataModule(**data).prepare_job(progress=False)
    if not job.is_done():
        try:
            have = json.loads((features / "prepared.json").read_text()).get("fingerprint")
        except (OSError, ValueError):
            have = None
        want = job.fingerprint
        raise SystemExit(f"{features} holds no prepared data of this recipe (prepared.json fingerprint {have}, "
                         f"the recipe's {want}): run `dspark-lightning prepare --config <recipe> --data.work_dir "
                         f"{features}` first")  # fmt: skip


# --- DeepSpec's model on our features --------------------------------------------------------------------------
def deepspec_settings(repo: Path, config_file: str) -> dict[str, Any]:
    """The ``model`` and ``train`` sections and the ``seed`` of a DeepSpec config file, read as literals (the file is
    not executed: it imports DeepSpec's trainer, FSDP included); non-literal entries (``trainer_cls``) are left out."""
    tree = ast.parse((repo / config_file).read_text())
    out: dict[str, Any] = {"model": {}, "train": {}, "seed": 42}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name == "seed":
            out["seed"] = ast.literal_eval(node.value)
        elif name in ("model", "train") and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                with contextlib.suppress(ValueError):
                    out[name][kw.arg] = ast.literal_eval(kw.value)
    return out


def import_deepspec(repo: Path) -> None:
    """Put the DeepSpec checkout on ``sys.path`` and check that its DSpark modules import."""
    if not (repo / "deepspec" / "modeling" / "dspark" / "qwen3" / "modeling.py").is_file():
        raise SystemExit(f"{repo} is not a DeepSpec checkout (no deepspec/modeling/dspark/qwen3/modeling.py)")
    sys.path.insert(0, str(repo))
    import deepspec.modeling.dspark.qwen3.modeling  # noqa: F401


def dense_dspark_mask(*, anchor_positions, block_keep_mask, seq_len: int, block_size: int, device):
    """DeepSpec's ``create_dspark_attention_mask`` predicate (``dspark_mask_mod`` in
    ``deepspec/modeling/dspark/common.py``) as a dense (B, 1, A·γ, S + A·γ) boolean mask for SDPA: a query of block b
    sees context key t < anchor_b and the keys of its own block, in kept blocks only. A dropped block's rows (flex:
    no key, zero output, weight 0 in every loss term) see their own block here, so SDPA returns finite values."""
    B, A = anchor_positions.shape
    q = torch.arange(A * block_size, device=device)
    kv = torch.arange(seq_len + A * block_size, device=device)
    qb = q // block_size
    anchor = anchor_positions[:, qb]  # (B, Q)
    is_ctx = kv < seq_len
    ctx = is_ctx & (kv < anchor[:, :, None])  # (B, Q, K)
    own = ~is_ctx & (qb[:, None] == torch.div(kv - seq_len, block_size, rounding_mode="floor"))  # (Q, K)
    keep = block_keep_mask[:, qb][:, :, None]  # (B, Q, 1)
    return (((ctx | own) & keep) | (own & ~keep))[:, None]


@contextlib.contextmanager
def patched(module: Any, **attrs: Any):
    """Set module attributes for the duration of the block, then restore them."""
    old = {k: getattr(module, k) for k in attrs}
    try:
        for k, v in attrs.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


@contextlib.contextmanager
def one_rank_group():
    """A one-process gloo group: DeepSpec's loss all-reduces its denominators and its metrics gather their schema."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def deepspec_model_args(ds: dict, target: Any, recipe: dict, layers: int | None, anchors: int,
                        rank: int | None = None) -> dict[str, Any]:  # fmt: skip
    """DeepSpec's ``model`` section mapped to our target: the tapped layers, mask token and block size our drafter
    uses, the depth ``layers`` (None = the recipe's), ``anchors`` per sequence, the Markov rank ``rank`` (None =
    DeepSpec's); the rest (Markov head type, confidence head, loss weights) as DeepSpec's config file sets them."""
    from dspark_lightning.targets import default_mask_token_id

    m = dict(ds["model"])
    mask = recipe.get("model", {}).get("mask_token_id")
    m.update({
        "target_model_name_or_path": target.name, "target_layer_ids": list(target.geometry.layer_ids),
        "mask_token_id": int(default_mask_token_id(target) if mask is None else mask),
        "block_size": int(recipe.get("model", {}).get("block_size", 7)),
        "num_draft_layers": int(recipe_depth(recipe) if layers is None else layers), "num_anchors": int(anchors),
    })  # fmt: skip
    if rank is not None:
        m["markov_rank"] = int(rank)
    return m


def build_deepspec(target: Any, model_args: dict, dtype: torch.dtype, seed: int):
    """``Qwen3DSparkModel`` from DeepSpec's ``build_draft_config`` over a deep copy of our target's config, in
    ``dtype``, with the target's embedding and LM head copied in and frozen (``BaseTrainer.build_models``)."""
    from deepspec.modeling.dspark.qwen3.config import build_draft_config
    from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel
    from deepspec.utils.config import ConfigNode

    cfg = build_draft_config(target_config=target.model.config, model_args=ConfigNode(model_args))
    cfg._attn_implementation = "sdpa"  # FlexAttention has no CPU backward (module docstring)
    torch.manual_seed(seed)
    model = Qwen3DSparkModel(cfg).to(dtype=dtype)
    model.initialize_embeddings_and_head(embed_tokens=target.embed_tokens, lm_head=target.lm_head, freeze=True)
    return model


class Replay:
    """The batches one of our fits trained on, rebuilt from the feature cache: the recorded sample ids, collated by
    our :class:`~dspark_lightning.data.features.anchors.AnchorCollator` with the recorded epoch, anchors checked
    equal."""

    def __init__(self, features: Path, max_anchors: int, seed: int, pad_id: int) -> None:
        from dspark_lightning.data.features.anchors import AnchorCollator
        from dspark_lightning.data.features.cache import FeatureCache

        self.cache = FeatureCache(features / "features_train")
        self.index = {sid: i for i, sid in enumerate(self.cache.sample_ids())}
        self.collate = AnchorCollator(max_anchors, seed=seed, pad_id=pad_id)

    def batch(self, rec: dict) -> dict[str, Any]:
        missing = [i for i in rec["ids"] if i not in self.index]
        if missing:
            raise SystemExit(f"samples {missing[:3]} of the recorded batches are not in {self.cache.dir} "
                             "(extra_work_dirs or another cache): replay needs the fit's own cache")  # fmt: skip
        self.collate.epoch = rec["epoch"]
        b = self.collate([self.cache[self.index[i]] for i in rec["ids"]])
        if b["anchors"].tolist() != rec["anchors"] or b["valid"].tolist() != rec["valid"]:
            raise SystemExit(f"step {rec['step']}: the rebuilt batch's anchors differ from the recorded ones")
        return b


def train_deepspec(model: Any, replay: Replay, records: list[dict], *, steps: int, train: dict, loss: dict,
                   same_anchors: bool, log_every: int = 10) -> dict[str, Any]:  # fmt: skip
    """DeepSpec's training step (``Qwen3DSparkTrainer.run_batch`` + ``BaseTrainer.train`` for one rank and one
    micro-batch per step): its forward and ``compute_dspark_loss``, the global gradient norm clipped, its
    ``BF16Optimizer`` (fp32 masters, ``CosineAnnealingWarmupLR``), its metrics flushed every step."""
    import deepspec.modeling.dspark.qwen3.modeling as dsm
    from deepspec.modeling.dspark.loss import compute_dspark_loss
    from deepspec.utils.metrics import flush, reset
    from deepspec.utils.optim import BF16Optimizer

    if len(records) < steps:
        raise SystemExit(f"the recorded fit trained {len(records)} steps, fewer than --steps {steps}")
    opt = BF16Optimizer(model, lr=float(train["lr"]), total_steps=steps, warmup_ratio=float(train["warmup_ratio"]),
                        weight_decay=float(train["weight_decay"]))  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    current: dict[str, Any] = {}

    def recorded_anchors(*, seq_len, loss_mask, num_anchors, device):  # DeepSpec's sample_anchor_positions signature
        return current["anchors"].to(device), current["valid"].to(device)

    patches = {"create_dspark_attention_mask": dense_dspark_mask}
    if same_anchors:
        patches["sample_anchor_positions"] = recorded_anchors
    history, dt = [], next(model.parameters()).dtype
    model.train()
    reset()
    t0 = time.perf_counter()
    with one_rank_group(), patched(dsm, **patches):
        for step in range(steps):
            b = replay.batch(records[step])
            current["anchors"], current["valid"] = b["anchors"], b["valid"]
            out = model(input_ids=b["input_ids"], target_hidden_states=b["context"].to(dt), loss_mask=b["loss_mask"],
                        target_last_hidden_states=b["hidden"].to(dt))  # fmt: skip
            total = compute_dspark_loss(outputs=out, **loss)
            total.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, float(train["max_grad_norm"]))
            lr = opt.get_learning_rate()  # the rate this step uses (the scheduler steps after the update)
            opt.step()
            metrics = {k.removeprefix("train/"): v for k, v in flush().items()}
            history.append({"step": step, "lr": lr, "grad_norm": float(grad_norm), **metrics})
            if step % log_every == 0 or step == steps - 1:
                print(f"[side-by-side] deepspec step {step}: loss {metrics.get('loss', float('nan')):.4f} "
                      f"lr {lr:.3g} ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    wall = time.perf_counter() - t0
    return {"history": history, "wall_s": wall, "steps_per_s": steps / wall if wall > 0 else None}


# --- DeepSpec checkpoint -> our drafter directory --------------------------------------------------------------
def convert_deepspec_dir(path: Path, target: Any, out: Path | None = None) -> tuple[Any, dict[str, Any]]:
    """Our drafter from a DeepSpec checkpoint directory (``config.json`` + ``model.safetensors`` as its
    ``save_pretrained`` writes them), read by the importer ``load_drafter`` uses for that layout
    (``dspark_lightning/export/dspark_hf.py``): the config's geometry is checked against ``target``, every trained
    tensor is renamed to ours, the frozen embedding and LM head copies must equal the target's (ours share them).
    Checks every mapped tensor arrived unchanged, saves our format to ``out`` when given, and returns the drafter
    and a report of the mapping (each DeepSpec tensor's name in ours, or why it has none).

    Raises :class:`DeepSpecImportError` (one line) for a checkpoint of another geometry (hidden size, vocabulary,
    target depth, heads, FFN width, RoPE, tapped layers), shapes that do not fit, or a component ours lacks."""
    from dspark_lightning.checkpoint import DrafterLoadError, load_drafter, save_drafter
    from dspark_lightning.export.dspark_hf import names_map, read_weights

    path = Path(path)
    try:
        drafter = load_drafter(path, target, dtype=torch.float32)
    except DrafterLoadError as exc:
        raise DeepSpecImportError(f"DeepSpec checkpoint {path} does not fit target {target.name!r}: {exc}") from None
    state, _ = read_weights(path)
    ours = drafter.state_dict()
    mapped, shared, dropped = {}, [], []
    for name, t in sorted(state.items()):
        if name in SHARED:
            shared.append(name)
            continue
        if name.startswith("rotary_emb."):
            dropped.append(name)
            continue
        new = names_map(type(drafter.seq_head)).to_ours(name)
        if new is None or new not in ours:  # load_drafter refuses these first; kept as a guard
            raise DeepSpecImportError(f"DeepSpec tensor {name!r} has no counterpart in our drafter")
        if tuple(ours[new].shape) != tuple(t.shape) or not torch.equal(ours[new], t.to(ours[new].dtype)):
            raise DeepSpecImportError(f"DeepSpec tensor {name!r} did not arrive unchanged in {new!r}")
        mapped[name] = new
    unmapped = sorted(set(ours) - set(mapped.values()) - {"draft_vocab"})
    if unmapped:
        raise DeepSpecImportError(f"our drafter's {unmapped[:4]} got no DeepSpec tensor")
    report = {
        "source": str(path),
        "mapped": mapped,
        "shared_with_target": shared,
        "dropped": dropped,
        "drafter": drafter.config(),
    }
    if out is not None:
        save_drafter(drafter, out, target, extra={"imported_from": {"layout": "DeepSpec Qwen3DSparkModel",
                                                                    "source": str(path)}})  # fmt: skip
        report["out"] = str(out)
    return drafter, report


def convert_deepspec_state(state: dict[str, torch.Tensor], config: dict[str, Any], target: Any,
                           out: Path | None = None) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """:func:`convert_deepspec_dir` of an in-memory ``Qwen3DSparkModel`` state dict and its config (a dict, as
    ``config.to_dict()`` gives it), written to a temporary DeepSpec-layout directory first."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "config.json").write_text(json.dumps(config, indent=2, default=str))
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        try:
            drafter, report = convert_deepspec_dir(d, target, out)
        except DeepSpecImportError as exc:  # name the state dict, not the temporary directory
            raise DeepSpecImportError(str(exc).replace(f"checkpoint {d}", "state dict").replace(f"{d}/", "")) from None
    report["source"] = "in-memory state dict"
    return drafter, report


# --- checks -------------------------------------------------------------------------------------------------------
def deepspec_forward(model: Any, batch: dict, *, flex: bool = False):
    """DeepSpec's forward of ``model`` on one of our batches without gradients, with the batch's anchors: through
    the dense-mask SDPA path the training uses, or (``flex``) its own FlexAttention path (no CPU backward, but a
    forward runs: it compiles first)."""
    import deepspec.modeling.dspark.qwen3.modeling as dsm

    def anchors(*, seq_len, loss_mask, num_anchors, device):
        return batch["anchors"].to(device), batch["valid"].to(device)

    patches: dict[str, Any] = {"sample_anchor_positions": anchors}
    if not flex:
        patches["create_dspark_attention_mask"] = dense_dspark_mask
    dt = next(model.parameters()).dtype
    attn = model.config._attn_implementation
    model.config._attn_implementation = "flex_attention" if flex else "sdpa"
    try:
        with torch.no_grad(), patched(dsm, **patches):
            return model(input_ids=batch["input_ids"], target_hidden_states=batch["context"].to(dt),
                         loss_mask=batch["loss_mask"], target_last_hidden_states=batch["hidden"].to(dt))  # fmt: skip
    finally:
        model.config._attn_implementation = attn


def forward_parity(model: Any, drafter: Any, target: Any, batch: dict, loss: dict) -> dict[str, float]:
    """The trained DeepSpec model (in fp32, with the target's fp32 embedding and LM head rather than its copies in its
    training precision, and fp32 RoPE frequencies) against our drafter converted from it, on one batch with the same
    anchors: the largest differences of the draft logits and confidence logits over kept blocks, and each side's
    total loss with its own loss function (DeepSpec's ``compute_dspark_loss``; our ``dspark_loss`` with the same
    weights and position decay). Zero up to fp32 rounding when the conversion and both forwards and losses agree.
    ``..._rope_as_trained``: the logit difference with DeepSpec's RoPE buffer as it trained (``model.to(bf16)``
    rounds ``rotary_emb.inv_freq`` to bf16 in its trainer too)."""
    from deepspec.modeling.dspark.loss import compute_dspark_loss
    from deepspec.utils.metrics import reset

    from dspark_lightning.losses import dspark_loss, position_weights, supervision_mask

    m32 = copy.deepcopy(model).float().eval()  # its embedding and LM head: the target's fp32 ones, as ours reads
    m32.initialize_embeddings_and_head(embed_tokens=target.embed_tokens, lm_head=target.lm_head, freeze=True)
    as_trained = deepspec_forward(m32, batch)  # RoPE frequencies rounded to the training precision, if bf16
    m32.rotary_emb = type(m32.rotary_emb)(m32.config)  # fp32 frequencies, as ours (and servers) compute them
    with one_rank_group():
        out = deepspec_forward(m32, batch)
        ds_loss = float(compute_dspark_loss(outputs=out, **loss))
    reset()  # the metrics that loss recorded
    ids, anchors, valid, hidden = batch["input_ids"], batch["anchors"], batch["valid"], batch["hidden"].float()
    (B, S), g = ids.shape, drafter.block_size
    n, k = B * anchors.shape[1], torch.arange(g)
    lab_idx = (anchors[:, :, None] + k + 1).clamp(max=S - 1).flatten(1)  # label x_{a+k} of slot k
    hid_idx = (anchors[:, :, None] + k).clamp(max=S - 1).flatten(1)  # the target state that predicts it
    with torch.no_grad():
        ours = drafter(batch["context"].float(), ids, anchors, valid, hidden=hidden)
        labels = torch.gather(ids, 1, lab_idx).view(n, g)
        rows = torch.gather(hidden, 1, hid_idx[..., None].expand(-1, -1, hidden.shape[-1]))
        v = supervision_mask(anchors, valid, batch["loss_mask"], g).flatten(0, 1)
        terms = dspark_loss(
            ours.logits.flatten(0, 1),
            target.logits(rows).view(n, g, -1),
            labels,
            v,
            position_weights(g, loss["loss_decay_gamma"]),
            ours.conf_logits.flatten(0, 1),
            ce_weight=loss["ce_loss_alpha"],
            l1_weight=loss["l1_loss_alpha"],
            conf_weight=loss["confidence_head_alpha"],
        )
    keep = valid
    return {
        "max_abs_logit_diff": float((ours.logits - out.draft_logits.float())[keep].abs().max()),
        "max_abs_logit_diff_rope_as_trained": float((ours.logits - as_trained.draft_logits.float())[keep].abs().max()),
        "max_abs_conf_logit_diff": float((ours.conf_logits - out.confidence_pred.float())[keep].abs().max()),
        "deepspec_loss": ds_loss,
        "ours_loss": float(terms.total),
    }


def flex_check(model: Any, batch: dict) -> dict[str, float]:
    """DeepSpec's FlexAttention forward against the dense-mask SDPA forward this script trains with (one batch, no
    gradients, fp32): the largest draft-logit difference over kept blocks. The batch's anchors are drawn by
    DeepSpec's own sampler with as many anchors as positions, so the shorter sequences carry dropped blocks (the
    rows the two paths treat differently)."""
    from deepspec.modeling.dspark.common import sample_anchor_positions

    S = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    anchors, keep = sample_anchor_positions(seq_len=S, loss_mask=batch["loss_mask"], num_anchors=S, device="cpu")
    b = {**batch, "anchors": anchors, "valid": keep}
    m32 = copy.deepcopy(model).float().eval()
    flex, dense = deepspec_forward(m32, b, flex=True), deepspec_forward(m32, b)
    diff = (flex.draft_logits - dense.draft_logits)[keep].abs().max()
    finite = bool(torch.isfinite(dense.draft_logits).all())
    return {"max_abs_logit_diff": float(diff), "kept_blocks": int(keep.sum()), "dropped_blocks": int((~keep).sum()),
            "dense_all_finite": finite}  # fmt: skip


# --- the deepspec arm ------------------------------------------------------------------------------------------
def run_deepspec_arm(a: argparse.Namespace, ds: dict, train: dict, recipe: dict, target: Any, features: Path,
                     records: list[dict], work: Path) -> dict[str, Any]:  # fmt: skip
    """Build, train, save (DeepSpec's layout) and import (ours) the deepspec arm; its entry of the report."""
    data = recipe["data"]
    max_anchors, data_seed = int(data.get("max_anchors", 64)), int(data.get("seed", 42))
    n_anchors = max_anchors if a.anchors == "ours" else int(ds["model"].get("num_anchors", 512))
    margs = deepspec_model_args(ds, target, recipe, a.deepspec_layers, n_anchors, a.deepspec_rank)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[train["precision"]]
    model = build_deepspec(target, margs, dtype, int(ds["seed"]))
    replay = Replay(features, max_anchors, data_seed, target.tokenizer.pad_token_id or 0)
    loss = {"loss_decay_gamma": margs.get("loss_decay_gamma"), "ce_loss_alpha": float(margs["ce_loss_alpha"]),
            "l1_loss_alpha": float(margs["l1_loss_alpha"]),
            "confidence_head_alpha": float(margs["confidence_head_alpha"])}  # fmt: skip
    run_dir = work / "deepspec"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    res = train_deepspec(
        model, replay, records, steps=a.steps, train=train, loss=loss, same_anchors=a.anchors == "ours"
    )
    hist = res["history"]
    (run_dir / "history.json").write_text(json.dumps(hist) + "\n")
    ckpt = run_dir / "deepspec_checkpoint"
    model.save_pretrained(ckpt)  # DeepSpec's own checkpoint writer (trainer/ckpt_manager.py: save_pretrained)
    drafter, conversion = convert_deepspec_dir(ckpt, target, run_dir / "drafter")
    first = replay.batch(records[0])
    checks = {"forward_parity": forward_parity(model, drafter, target, first, loss)}
    if a.check_flex:
        checks["flex_vs_dense_sdpa"] = flex_check(model, first)
    terms = f"{loss['ce_loss_alpha']:g} CE + {loss['l1_loss_alpha']:g} L1 + {loss['confidence_head_alpha']:g} BCE"
    settings = {
        "layers": margs["num_draft_layers"],
        "rank": margs["markov_rank"],
        "vocabulary": "full",
        "loss": f"{terms}, decay {loss['loss_decay_gamma']}",
        "init": f"N(0, {model.config.initializer_range:g}) (target's initializer_range)",
        "precision": train["precision"],
    }
    cpu_changes = [
        "SDPA with a dense mask of DeepSpec's predicate instead of FlexAttention (no CPU backward)",
        "no torch.compile, FSDP or distributed sampler (one process; a one-rank gloo group for the loss's all-reduce)",
    ]
    if a.anchors == "ours":
        cpu_changes.append("anchors: the recorded ones of the replayed fit (same rule as DeepSpec's sampler)")
    return {
        "drafter": str(run_dir / "drafter"), "checkpoint": str(ckpt), "settings": settings, "model_args": margs,
        "train": train, "steps": len(hist), "wall_s": res["wall_s"], "steps_per_s": res["steps_per_s"],
        "train_loss_tail": mean_tail([h.get("loss") for h in hist]),
        "final_metrics": {k: v for k, v in hist[-1].items() if k != "step"},
        "lr": [h["lr"] for h in hist], "loss": [h.get("loss") for h in hist],
        "conversion": conversion, "checks": checks, "cpu_changes": cpu_changes,
    }  # fmt: skip


# --- evaluation and report -------------------------------------------------------------------------------------
def evaluate(drafters: dict[str, str], out: Path, *, gamma: int, prompts: int, max_new_tokens: int) -> list[dict]:
    """Our evaluator on every arm's drafter in one ``dspark-lightning eval`` (same prompts, plain decoding once),
    with ``benchmarks/acceptance_probe.py``'s settings: static scheduler, fixed γ, T = 0, batch 1, seed 0; the
    rows of each arm per set."""
    sys.path.insert(0, str(HERE))
    from acceptance_probe import rows_of

    from dspark_lightning.cli import main as cli

    run = out / "eval_T0"
    args = ["eval", *[x for arm, path in drafters.items() for x in ("--drafter+", f"{arm}={path}")]]
    args += [
        "--scheduler",
        f"{{class_path: static, init_args: {{gamma: {gamma}}}}}",
        "--temperature",
        "0",
        "--batch_size",
        "1",
        "--seed",
        "0",
    ]
    args += ["--prompts_per_domain", str(prompts), "--max_new_tokens", str(max_new_tokens), "--out", str(run)]
    cli(args)
    return [{"arm": arm, **r} for arm in drafters for r in rows_of(run, arm, 0.0, gamma)]


def lr_gap(a: list[float], b: list[float]) -> float | None:
    """Largest relative difference of two per-step learning-rate sequences over their common steps."""
    n = min(len(a), len(b))
    if n == 0:
        return None
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a[:n], b[:n], strict=True))


def mean_tail(values: list[float | None], frac: float = 0.1) -> float | None:
    """Mean of the last ``frac`` of the finite ``values`` (at least one)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    k = max(1, int(len(vals) * frac))
    return sum(vals[-k:]) / k


def ours_settings(recipe: dict, arm: str) -> dict[str, Any]:
    """The settings of one of our arms that differ between arms, for the report."""
    r = merge(recipe, AS_DEEPSPEC) if arm == "ours_as_deepspec" else recipe
    m, t = r.get("model", {}), r.get("trainer", {})
    lo = {"ce_weight": 0.1, "l1_weight": 0.9, "conf_weight": 1.0, "top_ce_weight": 0.0, "decay": 4.0}
    lo.update(m.get("loss") or {})
    loss = f"{lo['ce_weight']:g} CE + {lo['l1_weight']:g} L1 + {lo['conf_weight']:g} BCE"
    loss += f" + {lo['top_ce_weight']:g} argmax CE" if lo.get("top_ce_weight") else ""
    loss += f", decay {lo['decay']}"
    return {
        "layers": recipe_depth(r),
        "rank": recipe_rank(r),
        "vocabulary": m.get("draft_vocab_size") or "full",
        "loss": loss,
        "init": "warm start from the target" if m.get("warm_start") is not None else "N(0, 0.02)",
        "precision": t.get("precision") or ("FastestPrecision" if t.get("plugins") else "32-true"),
    }


def markdown(doc: dict) -> str:
    """The report's tables: each arm's settings and training, the checks, then the decoded acceptance."""
    lines = [
        f"# DeepSpec's DSpark beside ours: {doc['steps']} steps, lr {doc['optim']['lr']:g}, same batches",
        "",
        "| arm | layers | rank | vocabulary | loss | init | precision | steps/s | train loss (last 10 %) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in doc["arms"].items():
        s = a["settings"]
        sps = f"{a['steps_per_s']:.2f}" if a.get("steps_per_s") else "–"
        loss = f"{a['train_loss_tail']:.4f}" if a.get("train_loss_tail") is not None else "–"
        cells = [arm, s["layers"], s["rank"], s["vocabulary"], s["loss"], s["init"], s["precision"], sps, loss]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "Checks: " + json.dumps(doc["checks"]), ""]
    lines += ["| arm | set | γ | τ | α | A_1 | A_2 | A_3 | tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc.get("eval", []):
        ak = (r["A_k"] + [None] * 3)[:3]
        cells = [r["arm"], r["set"], r["gamma"], f"{r['tau']:.3f}", r["alpha"]]
        cells += ["–" if x is None else f"{x:.2f}" for x in ak] + [f"{r['tok_per_s']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepspec-repo", type=Path, required=True, help="a checkout of deepseek-ai/DeepSpec")
    ap.add_argument(
        "--deepspec-config",
        default="config/dspark/dspark_qwen3_4b.py",
        help="DeepSpec config file (in the repo) whose model/train sections the deepspec arm takes",
    )
    ap.add_argument("--features", type=Path, required=True, help="the work dir `dspark-lightning prepare` wrote")
    ap.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "smollm2_dspark.yaml")
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps of every arm")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate of every arm (default DeepSpec's)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--deepspec-layers", type=int, default=None, help="DeepSpec's depth (default the recipe's)")
    ap.add_argument("--deepspec-rank", type=int, default=None, help="DeepSpec's Markov rank (default its config's)")
    ap.add_argument(
        "--deepspec-precision",
        choices=("bf16", "fp32"),
        default=None,
        help="DeepSpec's weights (default its config's; fp32 masters either way)",
    )
    ap.add_argument(
        "--anchors",
        choices=("ours", "deepspec"),
        default="ours",
        help="ours: DeepSpec trains on the recorded anchors; deepspec: its forward samples its own",
    )
    ap.add_argument("--batches", type=Path, default=None, help="a batches.json to replay instead of an ours* arm's")
    ap.add_argument(
        "--check-flex",
        action="store_true",
        help="also compare DeepSpec's FlexAttention forward with the dense-mask SDPA one (compiles)",
    )
    ap.add_argument("--prompts-per-domain", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--out", type=Path, required=True, help="the report: side_by_side.{json,md}, eval, per-step logs")
    ap.add_argument(
        "--work",
        type=Path,
        default=ROOT / "outputs" / "deepspec_side_by_side",
        help="the runs: recipes, logs, recorded batches, checkpoints, drafters",
    )
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    if "deepspec" in a.arms and a.batches is None and not any(x in OURS_ARMS for x in a.arms):
        ap.error("the deepspec arm replays the batches of an ours* arm: list one in --arms or pass --batches")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    from dspark_lightning import devices
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    recipe = yaml.safe_load(a.recipe.read_text())
    features, out, work = a.features.resolve(), a.out.resolve(), a.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    import_deepspec(a.deepspec_repo.resolve())
    ds = deepspec_settings(a.deepspec_repo, a.deepspec_config)
    defaults = {"lr": 6e-4, "warmup_ratio": 0.04, "weight_decay": 0.0, "max_grad_norm": 1.0, "precision": "bf16"}
    train = {k: ds["train"].get(k, v) for k, v in defaults.items()}
    train.update({k: v for k, v in (("lr", a.lr), ("precision", a.deepspec_precision)) if v is not None})
    recipe_clip = recipe.get("trainer", {}).get("gradient_clip_val")
    recipe = merge(recipe, {"trainer": {"gradient_clip_val": train["max_grad_norm"]}})
    optim = {"lr": train["lr"], "warmup_fraction": train["warmup_ratio"], "weight_decay": train["weight_decay"],
             "betas": [0.9, 0.999], "eps": 1e-8}  # fmt: skip
    check_prepared(recipe, features)
    target = DSparkDataModule(
        **{**recipe["data"], "target": recipe["target"], "work_dir": str(features), "features": "cached"}
    ).target
    seed = int(recipe.get("seed_everything", 42))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    doc: dict[str, Any] = {
        "run": {"commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "cpu": devices.cpu_model(), "threads": torch.get_num_threads(), "recipe": str(a.recipe),
                "features": str(features), "deepspec_config": a.deepspec_config, "target": target.name},
        "steps": a.steps,
        "optim": {**optim, "schedule": "linear warmup then cosine to 0", "clip": train["max_grad_norm"],
                  "recipe_clip": recipe_clip},
        "arms": {}, "checks": {},
    }  # fmt: skip

    records, orders = None, {}
    for arm in [x for x in a.arms if x in OURS_ARMS]:
        fit = fit_ours(recipe, arm, work, steps=a.steps, features=features, optim=optim, seed=seed)
        rec, stats = fit["record"]["steps"], fit["fit_stats"]
        records = records or rec
        orders[arm] = json.dumps([(s["ids"], s["anchors"]) for s in rec[: a.steps]])
        doc["arms"][arm] = {
            "drafter": fit["drafter"], "settings": ours_settings(recipe, arm), "steps": stats.get("steps"),
            "wall_s": stats.get("wall_s"),
            "steps_per_s": stats["steps"] / stats["wall_s"] if stats.get("wall_s") else None,
            "train_loss_tail": mean_tail([s.get("loss") for s in rec]), "validation": stats.get("validation"),
            "lr": [s["lr"] for s in rec], "loss": [s.get("loss") for s in rec],
        }  # fmt: skip
    if a.batches is not None:
        records = json.loads(a.batches.read_text())["steps"]
    doc["checks"]["same_batches_across_ours_arms"] = len(set(orders.values())) <= 1 if orders else None

    if "deepspec" in a.arms:
        doc["arms"]["deepspec"] = run_deepspec_arm(a, ds, train, recipe, target, features, records, work)
        ds_lr = doc["arms"]["deepspec"]["lr"]
        doc["checks"]["lr_gap_to_deepspec"] = {arm: lr_gap(ds_lr, doc["arms"][arm]["lr"]) for arm in orders}
        doc["checks"].update(doc["arms"]["deepspec"]["checks"])

    for arm, v in doc["arms"].items():  # per-step sequences go beside the report, not into it
        per_step = {"lr": v.pop("lr"), "loss": v.pop("loss")}
        (out / f"per_step_{arm}.json").write_text(json.dumps(per_step) + "\n")
    write_report(doc, out)  # the training record is kept even if the evaluation fails
    if not a.skip_eval:
        gamma = int(recipe.get("model", {}).get("block_size", 7))
        drafters = {arm: v["drafter"] for arm, v in doc["arms"].items()}
        doc["eval"] = evaluate(drafters, out, gamma=gamma, prompts=a.prompts_per_domain,
                               max_new_tokens=a.max_new_tokens)  # fmt: skip
        write_report(doc, out)
    print(markdown(doc))


def write_report(doc: dict, out: Path) -> None:
    (out / "side_by_side.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "side_by_side.md").write_text(markdown(doc))


if __name__ == "__main__":
    main()
