"""Matrix kernels chosen on the machine: every path computes the product F.linear computes, the table picks and caches
per shape and row count, the lean verifier gives the same forward whatever it chose; the roofline's arithmetic."""

import json

import pytest
import torch
import torch.nn.functional as F

from dspark_lightning.infer import LeanVerifier
from dspark_lightning.infer.profiling import roofline as rf
from dspark_lightning.infer.verify import kernels as K


def close(a, b, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    scale = max(1.0, float(b.abs().max()))
    assert float((a.float() - b.float()).abs().max()) <= tol * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_every_available_path_computes_the_linear_product(dtype, bias):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(40, 24, generator=g).to(dtype)
    b = torch.randn(40, generator=g).to(dtype) if bias else None
    paths = K.available_paths(torch.device("cpu"), dtype)
    assert "linear" in paths
    for name in paths:
        table = K.KernelTable(choices={K.shape_key(W): {r: name for r in K.ROWS}})
        lin = K.Linear(W, b, table)
        for rows in (*range(1, 17), 24, 32, 33, 100):  # 33 and 100: row counts between and beyond the timed ones
            x = torch.randn(2, rows, 24, generator=g).to(dtype)[:1]  # a (1, rows, d) view: reshaped, not copied
            y = lin(x)
            assert y.shape == (1, rows, 40)
            close(y, F.linear(x.float(), W.float(), None if b is None else b.float()), dtype)


def test_mkl_packed_only_serves_the_rows_it_packs():
    serves = K.PATHS["mkl_packed"][1]
    assert [r for r in range(1, 20) if serves(r)] == list(range(4, K.PACK_ROWS + 1))
    W = torch.randn(16, 8)
    lin = K.Linear(W, None, K.KernelTable(choices={"16x8": {8: "mkl_packed"}}))
    x = torch.randn(12, 8)  # 12 rows: the nearest timed choice is for 8, which cannot serve 12 -> F.linear
    close(lin(x), F.linear(x, W), torch.float32)


def test_table_lookup_exact_next_above_and_beyond():
    t = K.KernelTable(choices={"8x4": {1: "onednn", 4: "left", 32: "linear"}})
    assert t.path("8x4", 1) == "onednn"
    assert t.path("8x4", 2) == "left"  # the next timed row count above
    assert t.path("8x4", 20) == "linear"
    assert t.path("8x4", 500) == "linear"  # beyond the largest: the largest's
    assert t.path("9x9", 1) == "linear"  # a shape never timed
    again = K.KernelTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.choices == t.choices


def test_measure_picks_the_fastest_timed_path_for_each_row_count():
    W = torch.randn(64, 32)
    table = K.measure({"64x32": [(W, None), (W.clone(), None)]}, rows=(1, 8), repeats=1, paths=["linear", "left"])
    for r in (1, 8):
        ms = table.ms["64x32"][r]
        assert set(ms) == {"linear", "left"}
        assert table.choices["64x32"][r] == min(ms, key=ms.get)


def test_the_table_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(K, "_MEMO", {})
    calls = []
    real = K.measure

    def counting(weights, **kw):
        calls.append(sorted(weights))
        return real(weights, rows=(1, 2), repeats=1)

    monkeypatch.setattr(K, "measure", counting)
    a, b = torch.randn(8, 4), torch.randn(6, 4)
    cpu, f32 = torch.device("cpu"), torch.float32

    def get(*keys):
        ws = {"8x4": [(a, None)], "6x4": [(b, None)]}
        return K.for_weights(set(keys), lambda: {k: ws[k] for k in keys}, cpu, f32, progress=False)

    get("8x4")
    get("8x4", "6x4")  # only the new shape is timed
    assert calls == [["8x4"], ["6x4"]]
    path = K.table_path(torch.device("cpu"), torch.float32)
    assert set(json.loads(path.read_text())["choices"]) == {"8x4", "6x4"}
    monkeypatch.setattr(K, "_MEMO", {})  # a new process reads the file
    get("8x4")
    assert len(calls) == 2
    path.write_text("{not json")  # a damaged cache is measured again, not an error
    monkeypatch.setattr(K, "_MEMO", {})
    get("8x4")
    assert calls[-1] == ["8x4"]
    assert K.for_weights({"8x4"}, lambda: {}, torch.device("meta"), f32) is None  # not a CPU: the library chooses


def test_lean_forward_is_the_same_whatever_kernels_were_chosen(varied_target):
    V = varied_target.geometry.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, V, (9,), generator=g).tolist()
    block = torch.randint(0, V, (1, 8), generator=g)
    ref = LeanVerifier(varied_target, kernels="linear")
    ref.prefill([0], [prompt])
    want = ref.forward([0], block, [8], [9])
    for name in K.available_paths(torch.device("cpu"), torch.float32):
        shapes = {K.shape_key(m.weight) for m in ref.linears()}
        table = K.KernelTable(choices={s: {r: name for r in K.ROWS} for s in shapes})
        v = LeanVerifier(varied_target, kernels=table)
        v.prefill([0], [prompt])
        got = v.forward([0], block, [8], [9])
        close(got.hidden, want.hidden, torch.float32)
        close(v.logits(got.hidden), ref.logits(want.hidden), torch.float32)
    with pytest.raises(ValueError, match="kernels must be"):
        LeanVerifier(varied_target, kernels="fastest")


def test_step_bytes_and_roofline_arithmetic(tiny_target):
    nb = rf.step_bytes(tiny_target)
    dec = tiny_target.decoder
    layers = sum(p.numel() for p in dec.layers.parameters()) + dec.norm.weight.numel()
    assert nb.weights == 4 * (layers + tiny_target.lm_head.weight.numel())
    g = tiny_target.geometry
    assert nb.kv_per_token == 2 * g.num_layers * g.num_kv_heads * g.head_dim * 4
    assert nb.params * 4 == nb.weights
    sb = rf.StepBytes(weights=10**6, kv_per_token=100, params=10**6 // 4, attn_per_pair=0)
    machine = rf.Machine(bandwidth=1e9, flops=1e9)  # 1 ms per MB; 1 ms per MFLOP
    rows = rf.roofline_rows({1: 0.002, 8: 0.004}, sb, machine, context=10)
    assert rows[0]["bound"] == "memory" and rows[0]["floor_ms"] == pytest.approx(1.0011, abs=1e-2)
    assert rows[0]["x_floor"] == pytest.approx(2.0, abs=0.01)
    assert rows[1]["bound"] == "compute" and rows[1]["compute_ms"] == pytest.approx(4.0)  # 2 * 250k * 8 flops
    assert rows[1]["x_floor"] == pytest.approx(1.0)
    assert "x floor" in rf.roofline_text(rows, sb, machine, 10)
    assert rf.memory_bandwidth(nbytes=1 << 20, repeats=1) > 0 and rf.matmul_flops(n=64, repeats=1) > 0


def test_machine_roofs_are_measured_once_per_machine(tmp_path, monkeypatch):
    """A data stage's report reads the roofs from the per-machine cache: measured the first time only, a new dtype
    measured and added."""
    from dspark_lightning.infer.profiling import roofline as rf

    calls = []
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(rf, "best_matmul_flops", lambda device, dtype: calls.append(dtype) or 1e9)
    monkeypatch.setattr(rf, "memory_bandwidth", lambda device: calls.append("bw") or 2e9)
    cpu = torch.device("cpu")
    assert rf.machine_roofs(cpu, {torch.float32}) == ({"float32": 1e9}, 2e9)
    assert rf.machine_roofs(cpu, {torch.float32}) == ({"float32": 1e9}, 2e9) and calls == [torch.float32, "bw"]
    flops, _ = rf.machine_roofs(cpu, {torch.float32, torch.bfloat16})
    assert set(flops) == {"float32", "bfloat16"} and calls == [torch.float32, "bw", torch.bfloat16]
    assert len(list((tmp_path / "roofs").glob("*.json"))) == 1


def test_data_stage_roofline_arithmetic(tiny_target):
    """Regeneration: 2 flops per weight and token, roofed by compute or by one weight read per step of `concurrency`
    tokens; features: the decoder layers only (no LM head), compute-bound."""
    nb = rf.step_bytes(tiny_target)
    g = tiny_target.geometry
    head = g.vocab_size * g.hidden_size
    stats = {
        "regenerate_train": {"tokens": 1000, "seconds": 2.0, "wall_s": 2.5},
        "features_train": {"tokens": 4000, "samples": 40, "wall_s": 1.0},
        "curation": {"sources": {}},  # not a stage
    }
    flops, bw = {"float32": 1e9}, 1e9
    rows = rf.stage_roofline(tiny_target, stats, flops, bw, torch.float32, concurrency=4)
    regen, feats = rows
    attn = nb.attn_per_pair * 100 / 2  # half the mean conversation length (4000 / 40)
    assert regen["stage"] == "regenerate_train" and regen["tok_s"] == 500.0  # decode seconds, not wall
    assert regen["gflop_per_tok"] == pytest.approx((2 * nb.params + attn) / 1e9, abs=1e-3)
    compute, memory = 1e9 / (2 * nb.params + attn), 4 * 1e9 / (4 * nb.params)
    assert regen["roof_tok_s"] == pytest.approx(min(compute, memory), rel=1e-3)
    assert regen["bound"] == ("compute" if compute <= memory else "memory at 4 requests")
    assert feats["tok_s"] == 4000.0 and feats["bound"] == "compute"
    assert feats["roof_tok_s"] == pytest.approx(1e9 / (2 * (nb.params - head) + attn), rel=1e-3)
    assert feats["of_roof"] == pytest.approx(4000.0 / feats["roof_tok_s"], rel=1e-2)
    assert "of roof" in rf.stage_text(rows, flops, bw)


def test_a_path_far_slower_on_its_first_pass_is_timed_no_further(monkeypatch):
    """The first timing of a slow path (bf16 transposes on some CPUs: seconds a pass) decides it; the table's choice
    is still the fastest path."""
    import time

    calls = {"quick": 0, "sluggish": 0}

    def quick(lay, b, x):
        calls["quick"] += 1
        return x @ lay.weight.t()

    def sluggish(lay, b, x):
        calls["sluggish"] += 1
        time.sleep(0.02)
        return x @ lay.weight.t()

    monkeypatch.setitem(K.PATHS, "quick", (quick, lambda M: True))
    monkeypatch.setitem(K.PATHS, "sluggish", (sluggish, lambda M: True))
    W = torch.randn(16, 8)
    table = K.measure({"16x8": [(W, None)]}, rows=(1,), repeats=5, paths=["quick", "sluggish"])
    assert calls == {"quick": 6, "sluggish": 2}  # warm-up + 5 timed passes; warm-up + 1
    assert table.choices["16x8"][1] == "quick"
