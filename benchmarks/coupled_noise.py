"""What coupled acceptance's noise costs per verification step, at 8 requests and SmolLM2's 49,152 tokens.

    .venv/bin/python benchmarks/coupled_noise.py        (alone on the machine)

Times ``CoupledNoise.argmax`` (a seeded generator per (request, position) row on the CPU, E = -log u, argmax p / E)
against the counter-hash chain it replaced (three 32-bit finalisers over every (request, position, token) in int64,
two logarithms and log p), both picking the same tokens, at 1, 4 and 8 verified positions; the median of 11.
"""

from __future__ import annotations

import time

import torch

from dspark_lightning.devices import cpu_model
from dspark_lightning.infer.acceptance.coupled import TOKEN_SALT, CoupledNoise
from dspark_lightning.infer.acceptance.sampling import M32, _hash32

R, V = 8, 49152


def hash_chain_argmax(keys: list[int], base: list[int], law: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The replaced noise: u from hash(hash(hash(token) ^ hash(position) ^ key_lo) ^ key_hi), argmax log p + Gumbel."""
    k = _hash32(torch.tensor([[key & M32, (key >> 32) & M32] for key in keys]))
    pos = (torch.tensor(base)[:, None] + offsets) & M32
    h = _hash32(_hash32(_hash32(torch.arange(law.shape[-1]) ^ TOKEN_SALT) ^ _hash32(pos)[..., None] ^ k[:, :1, None]))
    h = _hash32(h ^ k[:, 1:, None])
    u = ((h >> 8).float() + 0.5) * 2.0**-24
    return (law.clamp_min(0).log() - torch.log(-torch.log(u))).argmax(-1)


def median_ms(fn, n: int = 11) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e3


def main() -> None:
    keys, base = [1000003 * i + 7 for i in range(R)], [100 + 3 * i for i in range(R)]
    law = torch.softmax(torch.randn(R, 8, V, generator=torch.Generator().manual_seed(0)) * 3, -1)
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, R = {R}, V = {V}")
    for w in (1, 4, 8):
        p, off = law[:, :w], torch.arange(w)
        before = median_ms(lambda p=p, off=off: hash_chain_argmax(keys, base, p, off))
        now = median_ms(lambda p=p, off=off: CoupledNoise(keys, base, torch.device("cpu")).argmax(p, off))
        print(f"W = {w}: hash chain {before:.1f} ms, generator rows {now:.1f} ms, ratio {now / before:.2f}")


if __name__ == "__main__":
    main()
