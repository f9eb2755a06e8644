"""Helpers shared by the inference tests."""

import inspect

import torch

from dspark_lightning import create
from dspark_lightning.infer import StatelessProposer
from dspark_lightning.registry import get


def make_drafter(target, name="dspark", block_size=3, seed=0, **kw):
    """A small random registered drafter; parallel drafters get a 1-layer dense backbone and mask token 1."""
    torch.manual_seed(seed)
    accepted = inspect.signature(get("drafter", name)).parameters
    if "backbone" in accepted:
        kw.setdefault("backbone", {"class_path": "dense", "init_args": {"num_layers": 1}})
    if "mask_token_id" in accepted:
        kw.setdefault("mask_token_id", 1)
    return create("drafter", name, target, block_size=block_size, **kw)


def hf_greedy(target, ids, max_new_tokens, stop_ids=()):
    out = target.model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(stop_ids) or None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def chi2_pvalue(counts: torch.Tensor, p: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit of ``counts`` to law ``p`` (cells with small expectation pooled)."""
    counts, p = counts.double(), p.double()
    n = counts.sum()
    if counts[p == 0].sum() > 0:
        return 0.0
    counts, p = counts[p > 0], p[p > 0]
    exp = n * p / p.sum()
    small = exp < min_expected
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        exp = torch.cat([exp[~small], exp[small].sum()[None]])
    stat = ((counts - exp) ** 2 / exp).sum()
    dof = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


@torch.no_grad()
def next_laws(model, seqs: list[list[int]], params) -> torch.Tensor:
    """The target's sampling law of the next token after each sequence (left padding), (N, V) fp32."""
    from dspark_lightning.infer import probs

    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s) :] = torch.tensor(s)
        mask[i, L - len(s) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    return probs(logits, params)


def exact_marginals(target, prompt: list[int], n_pos: int, params) -> list[torch.Tensor]:
    """Exact law of each of the first ``n_pos`` output tokens, by enumerating every prefix (small V only)."""
    V = target.geometry.vocab_size
    seqs, weights = [list(prompt)], torch.ones(1, dtype=torch.float64)
    out = []
    for _ in range(n_pos):
        laws = next_laws(target.model, seqs, params).double()  # (N, V)
        joint = weights[:, None] * laws
        out.append(joint.sum(0))
        seqs = [s + [v] for s in seqs for v in range(V)]
        weights = joint.reshape(-1)
    return out


class OracleDrafter(StatelessProposer):
    """A good drafter for tests: q_k = mix * p_t,k + (1 - mix) * uniform, c_k = sum(min(p_t,k, q_k))."""

    def __init__(self, target, block_size: int, mix: float) -> None:
        self.target, self.block_size, self.mix = target, block_size, mix

    def make_proposer(self, batching="padded", confidence=None):
        return self

    def propose(self, ids, anchors, anchor_pos, params, generator=None, requests=None):
        from dspark_lightning.infer import Proposal, sample

        seqs = [r.prompt + r.output for r in requests]  # the output ends with the anchor
        toks, qs, confs = [], [], []
        for _ in range(self.block_size):
            p = next_laws(self.target.model, seqs, params)
            q = self.mix * p + (1 - self.mix) / p.shape[-1]
            confs.append(torch.minimum(p, q).sum(-1))  # known before x_k is drawn
            x = sample(q, params, generator)
            toks.append(x)
            qs.append(q)
            seqs = [s + [int(t)] for s, t in zip(seqs, x, strict=True)]
        q = torch.stack(qs, 1)
        return Proposal(tokens=torch.stack(toks, 1), q=q, conf=torch.stack(confs, 1), logits=q.log())


@torch.no_grad()
def assert_greedy_equal_up_to_ties(target, prompt: list[int], got: list[int], want: list[int], ulps: int = 2) -> bool:
    """``got`` equals HF's greedy ``want`` token for token, or first differs where the target's own logits tie.

    In bf16 the target's logits carry 8 significant bits, and a forward over several new tokens (verification)
    rounds differently from HF's one-token steps, so at a near-tie (top logits within ``ulps`` bf16 units of
    each other) either token is the target's greedy choice up to rounding; HF ``generate()`` itself flips such
    tokens between batch sizes. Returns True when the sequences are identical.
    """
    k = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if k is None:
        assert len(got) == len(want), (len(got), len(want))
        return True
    ids = torch.tensor([prompt + want[:k]], device=target.device)
    z = target.model(input_ids=ids).logits[0, -1].float()
    top = float(z.max())
    ulp = 2.0 ** (torch.floor(torch.log2(torch.tensor(abs(top) + 1e-30))).item() - 7)  # bf16: 8 significant bits
    assert top - float(z[got[k]]) <= ulps * ulp, (
        f"diverged at {k}: got {got[k]} (logit {float(z[got[k]]):.4f}), HF {want[k]} (logit {top:.4f}), ulp {ulp}"
    )
    return False
