"""Conformance checks for third-party components (pytest-free; they raise AssertionError): :func:`check_seq_head`
for a sequential head, :func:`check_scheduler` for a scheduler, :func:`check_server` for a serving target,
:func:`check_prompt_source` for a prompt source, :func:`check_regen_backend` for a regeneration backend,
:func:`check_acceptance` for an acceptance mode, :func:`check_layout` for a serving layout.

A plugin author tests a sequential head in three lines::

    from dspark_lightning.testing import check_seq_head

    def test_my_head():
        check_seq_head("my_head", rank=32)      # a registered name, or the class itself

It checks the :class:`~dspark_lightning.drafters.SeqHead` protocol, shapes, that the
left-to-right ``step`` API (carrying its state) equals ``teacher_forced``, that gradients reach
every parameter, that an exported drafter with the head reloads bit-identically, and that
``decode()`` with it reproduces the target's greedy output token for token.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from .checks import UsageError

GREEDY_TOKENS = 24


FAMILIES = ("llama", "qwen3", "gemma3", "mistral")  # the shapes of real targets the tests build tiny random copies of


def random_target(vocab: int = 260, hidden: int = 64, layers: int = 4, init: float | None = None, seed: int = 0,
                  family: str = "llama", tokenizer: Any = None, **config: Any):  # fmt: skip
    """A tiny random target whose greedy continuations vary (large init), with the tiny-debug tokenizer (or
    ``tokenizer``, one over the same 260 ids).

    ``family``: ``llama``; ``qwen3`` (per-head QK-norm); ``gemma3`` (sliding-window layers mixed with global ones,
    window 4 so short tests cross it, QK-norm, embeddings scaled by sqrt(d), sandwich norms, GELU, tied head);
    ``mistral`` (every layer sliding, window 4). ``init``: the weights' std (default 0.3; Gemma 0.02: with its
    scaled, tied embeddings a larger one repeats the last token).
    ``config``: other config fields (e.g. heads and widths of a real model's shape, for timings).
    """
    import transformers as tf

    from .targets import load_target

    fields = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "initializer_range": init if init is not None else 0.02 if family == "gemma3" else 0.3,
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": 0,
    }
    if family == "qwen3":
        fields["head_dim"] = hidden // 4
        cfg_cls, model_cls = tf.Qwen3Config, tf.Qwen3ForCausalLM
    elif family == "gemma3":
        pattern = ["sliding_attention", "sliding_attention", "full_attention"]
        fields.update(head_dim=hidden // 4, query_pre_attn_scalar=hidden // 4, sliding_window=4,
                      layer_types=[pattern[i % 3] for i in range(layers)], tie_word_embeddings=True)  # fmt: skip
        cfg_cls, model_cls = tf.Gemma3TextConfig, tf.Gemma3ForCausalLM
    elif family == "mistral":
        fields["sliding_window"] = 4
        cfg_cls, model_cls = tf.MistralConfig, tf.MistralForCausalLM
    elif family == "llama":
        cfg_cls, model_cls = tf.LlamaConfig, tf.LlamaForCausalLM
    else:
        raise UsageError(f"family must be one of {FAMILIES}, got {family!r}")
    cfg = cfg_cls(**{**fields, **config})  # derived fields (head_dim) follow the overrides
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    tokenizer = tokenizer if tokenizer is not None else load_target("tiny-debug").tokenizer
    return load_target(model, layer_ids=list(range(min(3, layers - 1))), tokenizer=tokenizer)


def _head(spec: Any, geometry, kwargs: dict[str, Any]):
    from .drafters import build_part

    if isinstance(spec, str):
        return build_part("seq_head", {"class_path": spec, "init_args": kwargs}, geometry)
    return spec(geometry, **kwargs)


def check_seq_head(spec: Any, block_size: int = 4, seed: int = 0, **kwargs: Any) -> None:
    """Run every conformance check on a sequential head (registered name or class, plus its kwargs)."""
    from .checkpoint import load_drafter, save_drafter
    from .drafters import ConfidenceHead, DenseBackbone, SeqHead, compose
    from .infer import decode

    target = random_target()
    g = target.geometry
    torch.manual_seed(seed)
    head = _head(spec, g, kwargs)
    name = getattr(spec, "__name__", spec)
    assert isinstance(head, SeqHead), f"{name}: missing SeqHead members (token_dim, teacher_forced, init_state, step)"
    assert isinstance(getattr(head, "hparams", None), dict), f"{name}: set self.hparams = capture_args(locals())"

    N, V, r = 3, g.vocab_size, head.token_dim
    h = torch.randn(N, block_size, g.hidden_size, requires_grad=True)
    prev = torch.randint(0, V, (N, block_size))
    bias, feat = head.teacher_forced(h, prev)
    assert bias.shape == (N, block_size, V), f"{name}: teacher_forced bias shape {tuple(bias.shape)}"
    assert feat.shape == (N, block_size, r), f"{name}: token feature shape {tuple(feat.shape)}, token_dim={r}"
    assert torch.isfinite(bias).all() and torch.isfinite(feat).all(), f"{name}: non-finite outputs"

    state = head.init_state(N, h)
    for k in range(block_size):  # docs/algorithm.md §10: the step API carries the state
        b, f, state = head.step(h[:, k], prev[:, k], state)
        assert torch.allclose(b, bias[:, k], atol=1e-5), f"{name}: step bias != teacher-forced bias at k={k + 1}"
        assert torch.allclose(f, feat[:, k], atol=1e-6), f"{name}: step feature != teacher-forced at k={k + 1}"

    (bias.square().mean() + feat.square().mean()).backward()
    missing = [n for n, p in head.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"{name}: parameters without a finite gradient: {missing}"

    bb = DenseBackbone(g, num_layers=1)
    drafter = compose(target, bb, head, ConfidenceHead(g, r), block_size, mask_token_id=1).eval()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            save_drafter(drafter, tmp, target)
        except Exception as exc:
            raise AssertionError(f"{name}: the drafter cannot be exported ({exc}); is the head registered?") from exc
        loaded = load_drafter(tmp, target)
    ctx = target(prev).context
    anchors, valid = torch.tensor([[1]] * N), torch.ones(N, 1, dtype=torch.bool)
    with torch.no_grad():
        a, b = drafter(ctx, prev, anchors, valid), loaded(ctx, prev, anchors, valid)
    assert torch.equal(a.logits, b.logits), f"{name}: exported drafter does not reload bit-identically"

    prompts = [target.encode_prompt(t) for t in ("hello there", "17*23?")]
    res = decode(target, drafter, prompts, max_new_tokens=GREEDY_TOKENS, stop_token_ids=[])
    for p, out in zip(prompts, res.token_ids, strict=True):
        ref = target.model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=GREEDY_TOKENS, pad_token_id=0)
        assert out == ref[0, len(p) :].tolist(), f"{name}: decode() is not lossless (greedy output differs)"


def assert_decodes_target_greedy(target: Any, drafter: Any, texts=("hello there", "def f(a, b):"), n: int = 16,
                                 scheduler: Any = "static", hardware: Any = None):  # fmt: skip
    """``decode()`` with ``drafter`` (static scheduler by default) gives the target's own greedy ``generate()`` output
    for chat prompts ``texts``, and really ran rounds: the check every imported or exported drafter must pass."""
    import torch

    from .infer import decode

    prompts = [target.encode_prompt(t) for t in texts]
    res = decode(target, drafter, prompts, max_new_tokens=n, scheduler=scheduler, hardware=hardware)
    for ids, got in zip(prompts, res.token_ids, strict=True):
        ref = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                                    eos_token_id=target.stop_token_ids, pad_token_id=0)  # fmt: skip
        assert got == ref[0, len(ids) :].tolist()
    assert res.stats.rounds > 0


def check_scheduler(spec: Any, seed: int = 0, **kwargs: Any) -> None:
    """Conformance checks for a scheduler (a registered name or a :class:`~dspark_lightning.infer.Scheduler`
    subclass, plus its kwargs): it is a ``Scheduler``; the hardware parts it asks for are parts it reads; given
    a profile it needs nothing more; on confidences of several shapes it returns host lengths (R,) in [0, γ], the same
    for two fresh instances (l depends on the confidences and earlier steps only); its hooks take what the engine
    hands them; and ``decode()`` with it, batched, reproduces the target's greedy output token for token."""
    from .drafters import build_drafter
    from .infer import HardwareProfile, SPSTable, build_scheduler
    from .infer.hardware import PARTS
    from .infer.schedule.draft_cost import DraftCost
    from .infer.schedule.schedulers import Scheduler

    def make() -> Scheduler:
        return build_scheduler({"class_path": spec, "init_args": kwargs}) if isinstance(spec, str) else spec(**kwargs)

    assert isinstance(spec, str | type), f"check_scheduler takes a registered name or a class, got {spec!r}"
    name = spec if isinstance(spec, str) else spec.__name__
    first, second = make(), make()
    assert isinstance(first, Scheduler), f"{name}: a scheduler subclasses dspark_lightning.infer.Scheduler"
    assert set(first.reads_hardware) <= set(PARTS), f"{name}: reads_hardware names parts a profile does not have"
    assert first.needs_hardware() <= first.reads_hardware, f"{name}: needs_hardware() asks for parts it never reads"
    profile = HardwareProfile(sps=SPSTable.from_points({1: 40.0, 4: 36.0, 16: 24.0, 64: 10.0, 256: 3.0}),
                              draft_cost=DraftCost([1, 8], [0.004, 0.01]))  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for s in (first, second):
        s.reset()
        s.use_hardware(profile)
        assert s.needs_hardware() == frozenset(), f"{name}: still needs {sorted(s.needs_hardware())} given a profile"
    for R, g in ((1, 1), (1, 4), (3, 4), (8, 7)):
        for conf in (torch.rand(R, g, generator=gen), torch.ones(R, g), torch.zeros(R, g)):
            assert isinstance(first.wants_draft(R), bool), f"{name}: wants_draft(R) must return a bool"
            a, b = first(conf.clone()), second(conf.clone())
            assert isinstance(a, torch.Tensor) and a.device.type == "cpu", f"{name}: lengths must be a host tensor"
            assert a.shape == (R,) and not a.is_floating_point(), f"{name}: lengths must be (R,) integers, got {a}"
            assert int(a.min()) >= 0 and int(a.max()) <= g, f"{name}: lengths {a.tolist()} outside [0, γ = {g}]"
            assert torch.equal(a, b), f"{name}: two fresh schedulers disagree on the same confidences"
            first.observe_draft_time(0.001)
            first.observe_step(True, R, int(a.sum()) + R, 0.01, verified=R + int(a.sum()))
            second.observe_draft_time(0.001)
            second.observe_step(True, R, int(a.sum()) + R, 0.01, verified=R + int(a.sum()))
    target = random_target()
    torch.manual_seed(seed)
    drafter = build_drafter(target, 4, backbone="dense", seq_head={"class_path": "vanilla", "init_args": {"rank": 8}},
                            conf_head="linear", mask_token_id=1).eval()  # fmt: skip
    try:
        assert_decodes_target_greedy(target, drafter, scheduler=make(), hardware=profile)
    except AssertionError as exc:
        raise AssertionError(f"{name}: decode() with it is not lossless: {exc}") from None


def check_server(spec: Any, seed: int = 0) -> None:
    """Conformance checks for a serving target (a registered ``server`` name, or a
    :class:`~dspark_lightning.export.servers.Server` subclass): it is a ``Server`` that serves some layout; its rules
    for ``dspark-hf`` (if it serves it) return notes (strings) or refuse in one line that names the server;
    :meth:`~dspark_lightning.export.servers.Server.check` agrees with them; its additions keep every key and tensor of
    the generic layout; its ``write`` returns notes; and, unless it also writes llama.cpp's GGUF (that needs
    llama.cpp's converter), a ``--server`` export of a small DSpark drafter is written (its own files leave the
    layout's alone) and reads back through ``load_drafter`` with the same logits."""
    from .checkpoint import load_drafter
    from .drafters import build_drafter
    from .export import InteropError, Server, export_serving, server_for
    from .export.dspark_hf import LAYOUT, dspark_config, dspark_state
    from .export.servers import ExportJob

    server = server_for(spec) if isinstance(spec, str) else spec()
    name = spec if isinstance(spec, str) else getattr(spec, "registry_name", getattr(spec, "__name__", str(spec)))
    assert isinstance(server, Server), f"{name}: a server subclasses dspark_lightning.export.Server"
    assert server.layouts(), f"{name}: a server serves some layout (Server.rules: layout name -> Rules)"
    if LAYOUT not in server.layouts():
        return
    rules = server.rules_for(LAYOUT)
    target = random_target()
    torch.manual_seed(seed)
    drafter = build_drafter(target, 4, backbone="dense", seq_head={"class_path": "vanilla", "init_args": {"rank": 8}},
                            conf_head="linear", mask_token_id=1).eval()  # fmt: skip
    try:
        notes = rules.check(drafter, target)
    except InteropError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(name), f"{name}: a refusal is one line naming the server"
        assert server.check(LAYOUT, drafter, target) == [str(exc)], f"{name}: check() must report what rules refuse"
        return
    assert isinstance(notes, list) and all(isinstance(n, str) for n in notes), f"{name}: rules return a list of notes"
    assert server.check(LAYOUT, drafter, target) == [], f"{name}: check() refuses what the rules accept"
    cfg, state = dspark_config(drafter, target, torch.float32, 4), dspark_state(drafter)
    keys, tensors = set(cfg), set(state)
    added = rules.add(cfg, state, drafter)
    assert isinstance(added, list) and all(isinstance(n, str) for n in added), f"{name}: additions return notes"
    assert keys <= set(cfg) and tensors <= set(state), f"{name}: additions must keep the generic layout's entries"
    with tempfile.TemporaryDirectory() as tmp:  # not strict, as in an ``all`` folder: what it cannot write is a note
        written = server.write(Path(tmp), drafter, target, ExportJob(dtype="fp32", num_anchors=4, strict=False))
    assert isinstance(written, list) and all(isinstance(n, str) for n in written), f"{name}: write() returns notes"
    if written and name == "llamacpp":  # its converter needs the target's own files (tests/slow/test_llamacpp*.py)
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export_serving(drafter, target, "dspark-hf", tmp, dtype="fp32", server=server.name, overwrite=True)
        except InteropError as exc:
            raise AssertionError(f"{name}: its export fails: {exc}") from None
        loaded = load_drafter(tmp, target)
    assert _same_logits(drafter, loaded, target), f"{name}: its export does not read back to the same drafter"


def _same_logits(drafter: Any, loaded: Any, target: Any) -> bool:
    """Whether two DSpark drafters give the same block logits on random features of ``target``."""
    prev = torch.randint(0, target.geometry.vocab_size, (2, 4))
    ctx = target(prev).context
    anchors, valid = torch.tensor([[1], [1]]), torch.ones(2, 1, dtype=torch.bool)
    with torch.no_grad():
        a, b = drafter(ctx, prev, anchors, valid), loaded(ctx, prev, anchors, valid)
    return torch.allclose(a.logits, b.logits, atol=1e-5)


def check_prompt_source(spec: Any, limit: int = 4, **kwargs: Any) -> None:
    """Conformance checks for a prompt source (a registered ``prompt_source`` name, or a
    :class:`~dspark_lightning.data.prompts.sources.PromptSource` subclass, plus its arguments: ``path=`` for a file
    source): built with ``limit``, it is a ``PromptSource`` that yields between 1 and ``limit`` well-formed prompts
    (:class:`~dspark_lightning.data.prompts.sources.PromptRecord`) with unique ids and its own name as ``source``; a
    second build yields the same records (ids, turns, responses, system prompt), and a smaller ``limit`` a prefix
    of them (ids stay stable when a source grows, which the hash split and the resume by id rely on)."""
    from .data.prompts.sources import PromptRecord, PromptSource
    from .registry import create

    def build(n: int) -> Any:
        return create("prompt_source", spec, limit=n, **kwargs) if isinstance(spec, str) else spec(limit=n, **kwargs)

    def content(records: list) -> list:
        return [(r.id, r.domain, r.source, list(r.turns), r.responses, r.system) for r in records]

    source = build(limit)
    name = spec if isinstance(spec, str) else getattr(spec, "registry_name", getattr(spec, "__name__", str(spec)))
    assert isinstance(source, PromptSource), f"{name}: a prompt source subclasses data.prompts.sources.PromptSource"
    records = list(source)
    assert records, f"{name}: yields no prompt with limit={limit}"
    assert len(records) <= limit, f"{name}: {len(records)} prompts with limit={limit}"
    for r in records:
        assert isinstance(r, PromptRecord), f"{name}: yields {type(r).__name__}, not PromptRecord"
        assert isinstance(r.id, str) and r.id.strip(), f"{name}: a prompt without an id ({r.id!r})"
        assert r.source == source.name, f"{name}: prompt {r.id!r} names source {r.source!r}, not {source.name!r}"
    ids = [r.id for r in records]
    assert len(set(ids)) == len(ids), f"{name}: duplicate ids {sorted({i for i in ids if ids.count(i) > 1})}"
    assert content(list(build(limit))) == content(records), f"{name}: a second build yields other prompts"
    half = max(1, len(records) // 2)
    assert content(list(build(half))) == content(records[:half]), f"{name}: limit={half} is not a prefix"


def check_regen_backend(spec: Any, target: Any = None, **kwargs: Any) -> None:
    """Conformance checks for a regeneration backend (as ``data.regen.backend`` names it: a registered name or
    ``{"class_path": ..., "init_args": {...}}``; ``kwargs`` go to
    :func:`~dspark_lightning.data.regen.regenerate.regenerate`): on ``target`` (default a tiny
    random Llama with varied outputs) it answers every user turn of one- and two-turn conversations with non-empty,
    stripped text, in input order, a token count per answer within ``max_new_tokens``; a second run at T > 0 gives
    the same rows whatever the batching (each (conversation, turn) has its own seed); a rerun on the same file
    answers nothing again."""
    from .data.prompts.sources import PromptRecord
    from .data.regen.backend import as_backend
    from .data.regen.regenerate import load_conversations, regenerate

    name = as_backend(spec).name  # a RegenBackend, its settings accepted
    target = target if target is not None else random_target(init=0.3)
    recs = [PromptRecord(f"c/{i}", "chat", "check", ["say something", "and more"][: 1 + i % 2]) for i in range(4)]
    kw = {"max_new_tokens": 8, "temperature": 1.0, "progress": False, "backend": spec, **kwargs}
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a.jsonl", Path(d) / "b.jsonl"
        stats = regenerate(target, recs, a, batch_size=4, concurrency=4, **kw)
        rows = load_conversations(a)
        kept = [r["id"] for r in rows]
        assert kept == [r.id for r in recs if r.id in kept] and stats["written"] == len(rows), f"{name}: row order"
        assert len(rows) + stats["dropped_empty"] == len(recs), f"{name}: {stats}"
        for row in rows:
            rec = next(r for r in recs if r.id == row["id"])
            answers = [m["content"] for m in row["turns"] if m["role"] == "assistant"]
            assert len(answers) == len(rec.turns) == len(row["gen"]["new_tokens"]), f"{name}: {row['id']} turns"
            assert all(x and x == x.strip() for x in answers), f"{name}: an empty or unstripped answer"
            assert all(1 <= n <= 8 for n in row["gen"]["new_tokens"]), f"{name}: new_tokens {row['gen']}"
            assert row["gen"]["backend"] == name
        regenerate(target, recs, b, batch_size=1, concurrency=1, **kw)
        assert load_conversations(b) == rows, f"{name}: the answers depend on the batching (a seed per turn?)"
        again = regenerate(target, recs, a, batch_size=4, concurrency=4, **kw)
        assert again["written"] == 0 and again["skipped"] == len(rows), f"{name}: a rerun answered again"


def check_acceptance(spec: str, seed: int = 0) -> None:
    """Conformance checks for an acceptance mode (a registered ``acceptance`` name: a factory ``(params, device,
    proposer) -> mode``): the mode has the :class:`~dspark_lightning.infer.protocols.AcceptanceMode` members; with
    it, ``decode()`` at T = 0 gives the target's own greedy tokens, and at T = 1 the same seed gives the same tokens
    (its randomness comes from the request streams) with every per-position survival rate in [0, 1]."""
    from .infer import decode
    from .infer.acceptance.sampling import SamplingParams
    from .infer.protocols import AcceptanceMode, members
    from .registry import create

    mode = create("acceptance", spec, SamplingParams(temperature=1.0), torch.device("cpu"), None)
    missing = sorted(m for m in members(AcceptanceMode) if not hasattr(mode, m))
    assert not missing, f"{spec}: the mode lacks {missing}"
    target = random_target(init=0.3, seed=seed)
    drafter = create(
        "drafter",
        "dspark",
        target,
        block_size=3,
        backbone={"class_path": "dense", "init_args": {"num_layers": 1}},
        mask_token_id=1,
    )
    ids = [[5, 6, 7], [9, 3]]
    greedy = decode(target, None, ids, max_new_tokens=8, stop_token_ids=[], temperature=0.0)
    got = decode(target, drafter, ids, max_new_tokens=8, stop_token_ids=[], temperature=0.0, acceptance=spec,
                 scheduler="static")  # fmt: skip
    assert got.token_ids == greedy.token_ids, f"{spec}: T = 0 decoding is not the target's greedy output"
    kw = {"max_new_tokens": 8, "stop_token_ids": [], "temperature": 1.0, "seed": seed + 1, "acceptance": spec,
          "scheduler": "static"}  # fmt: skip
    a, b = decode(target, drafter, ids, **kw), decode(target, drafter, ids, **kw)
    assert a.token_ids == b.token_ids, f"{spec}: the same seed gave other tokens at T = 1"
    assert all(x is None or 0.0 <= x <= 1.0 for x in a.stats.survival), f"{spec}: survival {a.stats.survival}"


def check_layout(spec: Any, drafter: str = "dspark", seed: int = 0) -> None:
    """Conformance checks for a serving layout (as ``export --layout`` names it: a registered name or
    ``{"class_path": ..., "init_args": {...}}``) on a small drafter of the registered
    kind ``drafter`` (the layout's own kind: ``eagle3`` for an EAGLE-3 layout): a
    :class:`~dspark_lightning.export.layouts.Layout` whose ``build`` gives a config, named tensors, extra files and
    notes; ``export_drafter`` writes it; and if it claims its own config, ``load_drafter`` reads it back to the same
    logits."""
    from .checkpoint import load_drafter, save_drafter
    from .drafters import build_drafter
    from .export import export_drafter
    from .export.layouts import as_layout
    from .registry import create

    layout = as_layout(spec)  # an export.Layout, its settings accepted
    target = random_target()
    torch.manual_seed(seed)
    kind, drafter = drafter, None
    if kind == "dspark":
        drafter = build_drafter(
            target,
            4,
            backbone="dense",
            seq_head={"class_path": "vanilla", "init_args": {"rank": 8}},
            conf_head="linear",
            mask_token_id=1,
        ).eval()
    else:
        drafter = create("drafter", kind, target, block_size=3).eval()
    cfg, state, extra, notes = layout.build(drafter, target, dtype=torch.float32, server=None)
    assert isinstance(cfg, dict) and state and all(isinstance(t, torch.Tensor) for t in state.values()), spec
    assert isinstance(extra, dict) and all(isinstance(n, str) for n in notes), f"{spec}: extra files and notes"
    with tempfile.TemporaryDirectory() as tmp:
        native = save_drafter(drafter, Path(tmp) / "native", target)
        res = export_drafter(native, spec, Path(tmp) / "out", target=target, dtype="fp32")
        assert (res.path / "config.json").is_file() and res.layout == layout.name, f"{spec}: no config.json written"
        if not layout.claims(json.loads((res.path / "config.json").read_text())):
            return
        loaded = load_drafter(res.path, target)
    assert _same_logits(drafter, loaded, target), f"{spec}: it does not read back to the same drafter"
