"""Training on GPUs without waste, checked on the CPU: host reads per training step (tests/infer/host_reads.py counts
them as an accelerator pays them), the divergence guard's single read per optimizer step, pinned batches on CUDA only,
the MoE dispatch, and the GPU FSDP recipe's per-decoder-layer wrapping."""

import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from dspark_lightning.data.features.anchors import AnchorCollator
from dspark_lightning.data.features.extract import features_for_batch
from dspark_lightning.layers import MoE
from dspark_lightning.lightning.callbacks import FitStats, TrainingDiverged
from dspark_lightning.lightning.module import DSparkModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infer"))
from host_reads import HostReads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FSDP_RECIPE = ROOT / "recipes" / "gpu" / "dspark_qwen3_4b_fsdp.yaml"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # fit writes fit_stats.json into the working directory (no logger)
    yield
    from torch.overrides import _get_current_function_mode_stack

    assert not _get_current_function_mode_stack(), "a HostReads counter was left active (it slows every later test)"


def _module(backbone: str = "dense") -> DSparkModule:
    torch.manual_seed(0)
    return DSparkModule(backbone=backbone, seq_head="vanilla", conf_head="linear", block_size=4)


def _loader(module: DSparkModule, n: int = 8) -> DataLoader:
    """Cached-feature batches (bf16, as the feature cache holds them) of random sequences."""
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(n):
        ids = torch.randint(3, 200, (20 + i,), generator=g)
        lm = torch.zeros(len(ids), dtype=torch.long)
        lm[6:] = 1
        ctx, hid = features_for_batch(module.target, ids[None], None, "bfloat16")
        samples.append({"id": i, "input_ids": ids, "loss_mask": lm, "context": ctx[0].bfloat16(),
                        "hidden": hid[0].bfloat16()})  # fmt: skip
    return DataLoader(samples, batch_size=2, collate_fn=AnchorCollator(6))


class CountReads(L.Callback):
    """Host reads of each whole batch (forward, backward, guard, optimizer step, logging), batch start to batch start,
    and of each ``training_step`` call alone, with the project lines that made them."""

    def __init__(self, module: DSparkModule) -> None:
        self.counter, self.batches, self.steps = None, [], []
        step = module.training_step

        def counted(batch, batch_idx):
            with HostReads(trace=True) as h:
                out = step(batch, batch_idx)
            self.steps.append(h.count)
            return out

        module.training_step = counted

    def _close(self) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.batches.append((self.counter.count, dict(self.counter.sites)))
            self.counter = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._close()
        self.counter = HostReads(trace=True)
        self.counter.__enter__()

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()


def _fit(module: DSparkModule, max_steps: int, **trainer_kw) -> CountReads:
    # SGD: AdamW's step counters are host tensors made before a batch's counter starts, which HostReads counts as
    # device reads (they are not on CUDA either); everything else is the recipe's training path.
    module.configure_optimizers = lambda: torch.optim.SGD(module.drafter.parameters(), lr=1e-3)
    counter = CountReads(module)
    kw = {"log_every_n_steps": 50, "enable_progress_bar": True, **trainer_kw}
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, callbacks=[counter], **kw)  # fmt: skip
    try:
        trainer.fit(module, _loader(module))
    finally:  # a fit stopped by an exception never reaches on_train_end: the counter's mode must not outlive it
        counter._close()
    counter.trainer = trainer
    return counter


def test_a_dense_training_step_reads_nothing_and_a_batch_reads_once():
    """Before: 4 reads in training_step (3 fit counters, the loss guard) and 9 per batch (+ the gradient guard, and
    Lightning's per-batch reads of the two progress-bar tensors). Now: 0, and the guard's single read per batch."""
    counter = _fit(_module(), max_steps=3)
    assert counter.steps == [0, 0, 0]
    assert [c for c, _ in counter.batches] == [1, 1, 1]
    guard = "tolist at lightning/callbacks/divergence.py"  # the DivergenceGuard callback
    assert all(site.startswith(guard) for _, sites in counter.batches for site in sites)


def test_with_accumulation_the_guard_reads_once_per_optimizer_step():
    counter = _fit(_module(), max_steps=2, accumulate_grad_batches=2)
    assert counter.steps == [0, 0, 0, 0]
    assert [c for c, _ in counter.batches] == [0, 1, 0, 1]  # the read comes with the optimizer step


def test_a_logging_step_copies_the_progress_bar_values_once_after_the_step():
    counter = _fit(_module(), max_steps=2, log_every_n_steps=2)
    assert counter.steps == [0, 0]  # the copy is made in on_train_batch_end, after backward and the optimizer step
    (_, first), (_, logged) = counter.batches
    assert not any(s.startswith("cpu ") for s in first)
    assert sum(v for s, v in logged.items() if s.startswith("cpu at lightning/module.py")) == 1


def test_moe_training_step_reads_once_per_moe_layer():
    """Before: one boolean-mask read per expert and layer (24 for 3 layers x 8 experts), plus the 4 above."""
    module = _module("moe_swa")
    layers = sum(isinstance(m, MoE) for m in module.drafter.modules())
    counter = _fit(module, max_steps=2)
    assert layers >= 2 and counter.steps == [layers, layers]


def test_fit_stats_counters_are_read_once_at_the_end():
    module = _module()
    counter = _fit(module, max_steps=2)
    stats = next(cb for cb in counter.trainer.callbacks if isinstance(cb, FitStats)).stats
    assert stats["tokens"] == 4 * 20 + 1 + 2 + 3  # two batches of two sequences, 20..23 tokens
    assert stats["anchors_seen"] == 4 * 6 and stats["block_rows_seen"] > 0


def test_a_non_finite_loss_stops_before_the_optimizer_step():
    module = _module()
    p = next(module.drafter.backbone.parameters())
    with torch.no_grad():
        p[0] = float("nan")
    before = {k: v.clone() for k, v in module.drafter.state_dict().items()}
    with pytest.raises(TrainingDiverged, match=r"non-finite training loss nan \(ce .* at step 0"):
        _fit(module, max_steps=2)
    after = module.drafter.state_dict()
    assert all(torch.allclose(after[k], v, rtol=0, atol=0, equal_nan=True) for k, v in before.items())


def test_a_non_finite_gradient_stops_before_the_optimizer_step():
    module = _module()
    p = next(module.drafter.seq_head.parameters())
    p.register_hook(lambda g: g * float("nan"))
    before = p.detach().clone()
    with pytest.raises(TrainingDiverged, match="non-finite gradient at step 0"):
        _fit(module, max_steps=2)
    assert torch.equal(p.detach(), before)


def test_moe_dispatch_equals_the_per_expert_masks():
    """The sorted dispatch (one read per layer) gives the outputs and gradients of the boolean mask per expert."""
    torch.manual_seed(0)
    moe = MoE(16, 24, num_experts=6, top_k=2, shared_hidden=8)
    x = torch.randn(5, 7, 16, requires_grad=True)

    def old(x):
        flat = x.reshape(-1, 16)
        idx, w, _, _ = moe.router(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(moe.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * w[rows, slot, None])
        return (out + moe.shared(flat)).view(x.shape)

    results = []
    for fn in (moe, old):
        x.grad = None
        moe.zero_grad()
        y = fn(x)
        y.square().sum().backward()
        results.append((y.detach(), x.grad.clone(), [p.grad.clone() for p in moe.parameters() if p.grad is not None]))
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    assert torch.equal(y1, y2) and torch.equal(gx1, gx2)
    assert len(gp1) == len(gp2) and all(torch.equal(a, b) for a, b in zip(gp1, gp2, strict=True))
    with HostReads() as h:
        moe(x)
    assert h.count == 1  # before: one per expert


def test_pin_memory_only_when_training_on_cuda():
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    from dspark_lightning.lightning.datamodule import DSparkDataModule

    dm = DSparkDataModule(target="tiny-debug", batch_size=2, max_anchors=4)
    dm.datasets = {"train": [{"id": 0}], "heldout": [{"id": 1}]}  # never iterated
    assert dm.train_dataloader().pin_memory is False  # no trainer
    for accelerator, pinned in ((CPUAccelerator(), False), (CUDAAccelerator(), True)):
        dm.trainer = SimpleNamespace(accelerator=accelerator)
        assert dm.train_dataloader().pin_memory is pinned
        assert dm.val_dataloader().pin_memory is pinned


def test_fsdp_recipe_wraps_each_decoder_layer():
    """The recipe as written parses to FSDPStrategy(auto_wrap_policy={DecoderLayer}); the policy FSDP builds from it
    wraps exactly the drafter's decoder layers (one FSDP unit each) of the module the recipe makes."""
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from dspark_lightning.cli.fit import DSparkCLI
    from dspark_lightning.drafters.backbones import DecoderLayer
    from dspark_lightning.lightning.datamodule import DSparkDataModule

    cpu = ["--target.name=tiny-debug", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto"]
    cli = DSparkCLI(DSparkModule, DSparkDataModule, run=False, args=["--config", str(FSDP_RECIPE), *cpu])
    strategy_cfg = cli.parser.parse_args(["--config", str(FSDP_RECIPE)]).trainer.strategy
    assert strategy_cfg.class_path == "lightning.pytorch.strategies.FSDPStrategy"
    assert strategy_cfg.init_args.auto_wrap_policy == {DecoderLayer}
    args = strategy_cfg.init_args
    strategy = FSDPStrategy(auto_wrap_policy=args.auto_wrap_policy, sharding_strategy=args.sharding_strategy,
                            state_dict_type=args.state_dict_type)  # fmt: skip
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy)
    module = cli.model
    layers = list(module.drafter.backbone.layers)
    assert len(layers) == 5
    wrapped = policy._run_policy(module, set(), {})
    assert set(wrapped) == set(layers)


def test_fused_adamw_is_chosen_only_for_plain_parameters_of_one_device():
    """``model.optim.fused: null`` picks AdamW's fused kernel for plain CPU/CUDA parameters and keeps the default
    implementation for tensor subclasses (FSDP2's DTensors), mixed devices and an empty list."""
    from dspark_lightning.lightning.module import fused_adamw_ok

    plain = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert fused_adamw_ok(plain)
    assert not fused_adamw_ok([])
    assert not fused_adamw_ok([*plain, torch.nn.Parameter(torch.zeros(2, device="meta"))])

    class Sub(torch.Tensor):
        pass

    assert not fused_adamw_ok([torch.nn.Parameter(torch.zeros(2).as_subclass(Sub))])
    sharded = torch.nn.Parameter(torch.zeros(2))
    sharded.to_local = lambda: sharded  # what a DTensor has
    assert not fused_adamw_ok([sharded])
