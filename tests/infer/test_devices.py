"""Decoding in the precision (and on the device) a user asks for: bf16 targets and drafters stay lossless.

No accelerator here: CUDA paths run in scripts/gpu_check.sh; these tests cover bf16 on the CPU, the
device/dtype arguments and their refusals, and a χ² output-law test with a bf16 target. Greedy output of a
bf16 target equals HF ``generate()`` exactly for one-token steps, and up to bf16 near-ties of the target's own
logits when several tokens are verified per forward (see ``assert_greedy_equal_up_to_ties``).
"""

import copy

import pytest
import torch
from infer_helpers import assert_greedy_equal_up_to_ties, chi2_pvalue, exact_marginals, hf_greedy, make_drafter

from dspark_lightning import load_drafter, load_target
from dspark_lightning.checkpoint import save_drafter
from dspark_lightning.devices import resolve_device, resolve_dtype
from dspark_lightning.infer import SamplingParams, decode

MAX_NEW = 16  # bf16 products are slow on a CPU


def in_dtype(target, dtype):
    """A copy of ``target``'s model in ``dtype``, wrapped as a Target with the same tapped layers."""
    model = copy.deepcopy(target.model).to(dtype)
    return load_target(model, layer_ids=target.geometry.layer_ids, tokenizer=target.tokenizer)


@pytest.fixture(scope="module")
def bf16_target(varied_target):
    return in_dtype(varied_target, torch.bfloat16)


@pytest.mark.parametrize(
    ("drafter_name", "drafter_dtype", "scheduler"),
    [("dspark", torch.float32, "static"), ("dspark", torch.bfloat16, "static"),
     ("dspark", torch.bfloat16, "hardware_aware"), ("eagle3", torch.bfloat16, "static")],
)  # fmt: skip
def test_bf16_target_greedy_equals_hf_generate(bf16_target, prompts, drafter_name, drafter_dtype, scheduler):
    want = [hf_greedy(bf16_target, p, MAX_NEW, bf16_target.stop_token_ids) for p in prompts]
    drafter = make_drafter(bf16_target, drafter_name, block_size=3).to(drafter_dtype)
    spec = scheduler
    if scheduler == "hardware_aware":
        from dspark_lightning.infer import SPSTable

        sps = SPSTable.from_points({1: 1.0, 4: 0.9, 8: 0.7, 16: 0.45, 32: 0.25})
        spec = {"class_path": scheduler, "init_args": {"sps": sps}}
    res = decode(bf16_target, drafter, prompts, max_new_tokens=MAX_NEW, scheduler=spec)
    for p, got, ref in zip(prompts, res.token_ids, want, strict=True):
        assert_greedy_equal_up_to_ties(bf16_target, p, got, ref)
    assert res.stats.rounds > 0


def test_bf16_plain_decode_is_exactly_hf_generate(bf16_target, prompts):
    """One new token per forward, as HF does: no rounding difference, so bf16 output is identical."""
    want = [hf_greedy(bf16_target, p, MAX_NEW, bf16_target.stop_token_ids) for p in prompts]
    for p, ref in zip(prompts, want, strict=True):
        assert decode(bf16_target, None, [p], max_new_tokens=MAX_NEW).token_ids[0] == ref


def test_bf16_output_law_at_t1(toy_target):
    """χ² at T = 1 against the exact law of the bf16 model itself (its laws are computed in fp32)."""
    target = in_dtype(toy_target, torch.bfloat16)
    prompt, n = [1, 2, 3, 4], 2000
    law = exact_marginals(target, prompt, 4, SamplingParams(1.0))
    drafter = make_drafter(target, "dspark", block_size=3).to(torch.bfloat16)
    res = decode(target, drafter, [prompt] * n, max_new_tokens=4, temperature=1.0, seed=11, stop_token_ids=[])
    out = torch.tensor(res.token_ids)
    for pos in (1, 3):
        counts = torch.bincount(out[:, pos], minlength=8).double()
        assert chi2_pvalue(counts, law[pos]) > 1e-3, (pos, counts, law[pos])


def test_smollm2_bf16_greedy_equals_hf_generate():
    """The embedded target loaded in bf16 (``dtype="bf16"``) with a random drafter: HF's bf16 greedy output."""
    target = load_target("smollm2-135m-instruct", dtype="bf16")
    assert target.dtype == torch.bfloat16
    ids = target.encode_prompt("Name three primary colours.")
    want = hf_greedy(target, ids, 8, target.stop_token_ids)
    drafter = make_drafter(target, "dspark", block_size=4, draft_vocab_size=512)
    drafter.set_draft_vocab(torch.arange(512))  # any subset keeps the output law; this one is cheap
    res = decode(target, drafter.to(torch.bfloat16), [ids], max_new_tokens=8)
    assert_greedy_equal_up_to_ties(target, ids, res.token_ids[0], want)


def test_load_drafter_follows_the_target(varied_target, bf16_target, tmp_path):
    d = make_drafter(varied_target, "dspark", block_size=3)
    save_drafter(d, tmp_path / "d", varied_target)
    loaded = load_drafter(tmp_path / "d", bf16_target)  # default: the target's device and dtype
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert load_drafter(tmp_path / "d", bf16_target, dtype="fp32").backbone.fc.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="differs from the target|not supported"):
        load_drafter(tmp_path / "d", varied_target, device="meta")


def test_decode_refuses_a_drafter_on_another_device(varied_target):
    d = make_drafter(varied_target, "dspark", block_size=3).to("meta")
    with pytest.raises(ValueError, match="drafter is on meta"):
        decode(varied_target, d, [[5, 6, 7]], max_new_tokens=2)


@pytest.mark.parametrize(
    ("spec", "want"),
    [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp16", torch.float16), ("float32", torch.float32),
     ("auto", torch.float32), (None, torch.float32), (torch.float16, torch.float16)],
)  # fmt: skip
def test_resolve_dtype(spec, want):
    assert resolve_dtype(spec, "cpu") == want


@pytest.mark.parametrize("bad", ["int8", "fp8", torch.int64])
def test_resolve_dtype_refuses(bad):
    with pytest.raises(ValueError):
        resolve_dtype(bad, "cpu")


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals of a machine without CUDA")
def test_resolve_device_without_cuda():
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


@pytest.mark.gpu
def test_resolve_device_with_cuda():
    assert resolve_device("auto").type == "cuda"
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="CUDA devices"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_schedulers_return_host_lengths():
    """Schedulers run on the host: whatever the confidences' device, l comes back as a CPU long tensor."""
    from dspark_lightning.infer import SPSTable
    from dspark_lightning.infer.schedule.schedulers import build_scheduler

    conf = torch.tensor([[0.9, 0.8, 0.1], [0.5, 0.2, 0.1]], dtype=torch.bfloat16)
    sps = SPSTable.from_points({1: 1.0, 4: 0.95, 8: 0.9})
    for spec in ("static", "threshold", {"class_path": "hardware_aware", "init_args": {"sps": sps}},
                 {"class_path": "async_hardware_aware", "init_args": {"sps": sps}}):  # fmt: skip
        ell = build_scheduler(spec)(conf)
        assert ell.device.type == "cpu" and ell.dtype == torch.long and ell.shape == (2,)


@pytest.mark.parametrize("bf16_faster", [True, False])
def test_auto_drafter_dtype_is_the_measured_faster_one(varied_target, prompts, tmp_path, monkeypatch, bf16_faster):
    """``drafter_dtype="auto"`` (decode()'s default for a drafter path): bf16 only where the product measured
    faster, and the output is the target's own greedy output either way."""
    import dspark_lightning.devices as devices

    monkeypatch.setattr(devices, "cpu_bf16_faster", lambda *a, **k: bf16_faster)
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))  # no answer kept by another test
    d = make_drafter(varied_target, "dspark", block_size=3)
    save_drafter(d, tmp_path / "d", varied_target)
    want = torch.bfloat16 if bf16_faster else torch.float32
    loaded = load_drafter(tmp_path / "d", varied_target, dtype="auto")
    assert {p.dtype for p in loaded.parameters()} == {want}
    assert load_drafter(tmp_path / "d", varied_target).backbone.fc.weight.dtype == torch.float32  # None: the target's
    plain = decode(varied_target, None, prompts, max_new_tokens=MAX_NEW).token_ids
    res = decode(varied_target, str(tmp_path / "d"), prompts, max_new_tokens=MAX_NEW)  # default "auto"
    for p, got, ref in zip(prompts, res.token_ids, plain, strict=True):
        assert_greedy_equal_up_to_ties(varied_target, p, got, ref)


def test_resolve_drafter_dtype():
    from dspark_lightning.devices import cpu_bf16_faster, resolve_drafter_dtype

    cpu = torch.device("cpu")
    assert resolve_drafter_dtype(None, cpu, torch.float16, 64, 256) == torch.float16
    assert resolve_drafter_dtype("bf16", cpu, torch.float32, 64, 256) == torch.bfloat16
    assert resolve_drafter_dtype("auto", torch.device("cuda"), torch.float32, 64, 256) == torch.bfloat16
    got = resolve_drafter_dtype("auto", cpu, torch.float32, 64, 256)
    assert got == (torch.bfloat16 if cpu_bf16_faster(64, 256, m=8) else torch.float32)
    assert cpu_bf16_faster.cache_info().hits >= 1  # measured once per shape and process
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_drafter_dtype("int4", cpu, torch.float32, 64, 256)


def test_draft_cost_cache_is_per_precision(varied_target, tmp_path):
    """The cached drafting cost drives the gate: a bf16 run must not read the fp32 run's numbers."""
    from dspark_lightning.infer.profiling.measure_draft_cost import drafter_key

    save_drafter(make_drafter(varied_target, "dspark", block_size=3), tmp_path / "d", varied_target)
    k32 = drafter_key(load_drafter(tmp_path / "d", varied_target, dtype="fp32"))
    k16 = drafter_key(load_drafter(tmp_path / "d", varied_target, dtype="bf16"))
    assert k32 is not None and k16 == f"{k32}-bfloat16"


def test_the_cpu_decode_precision_is_measured_once_per_machine_and_kept(tmp_path, monkeypatch):
    """``regen.dtype: fastest`` names the prepared data's precision in its fingerprint: once measured, the answer is
    read back, so a busy machine's next measurement cannot flip it (and send a finished preparation to be redone)."""
    from dspark_lightning import devices

    answers = iter([True, False])
    monkeypatch.setattr(devices, "cpu_bf16_faster", lambda *a, **k: next(answers))
    assert devices.decode_bf16_faster("cpu", cache=tmp_path) is True
    assert devices.decode_bf16_faster("cpu", cache=tmp_path) is True  # read back, not measured again
    (kept,) = tmp_path.glob("*-bf16-faster-v2.json")
    kept.write_text("not json")  # a damaged file is measured again
    assert devices.decode_bf16_faster("cpu", cache=tmp_path) is False
    assert devices.decode_bf16_faster("cuda", cache=tmp_path) is True


def test_the_drafter_precision_is_measured_once_per_machine_and_shape(tmp_path, monkeypatch):
    """``drafter_dtype="auto"`` picks which cached drafting profile the scheduler reads: it must not flip from one
    process to the next with the machine's load, and two drafter shapes keep their own answers."""
    from dspark_lightning import devices

    answers = iter([True, False, False])
    monkeypatch.setattr(devices, "cpu_bf16_faster", lambda *a, **k: next(answers))
    cpu = torch.device("cpu")
    assert devices.resolve_drafter_dtype("auto", cpu, torch.float32, 64, 256, tmp_path) == torch.bfloat16
    assert devices.resolve_drafter_dtype("auto", cpu, torch.float32, 64, 256, tmp_path) == torch.bfloat16  # kept
    assert devices.resolve_drafter_dtype("auto", cpu, torch.float32, 64, 512, tmp_path) == torch.float32
    assert devices.decode_bf16_faster("cpu", cache=tmp_path) is False  # the same file, its own entry
    assert next(answers, "none left") == "none left"
