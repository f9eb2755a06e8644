"""Position-1 check: can a two-parameter Platt fit σ(z/T + b) beat STS's one temperature on held-out rounds?

    python benchmarks/calibration_platt.py benchmarks/results/data/calibration_t1/rollouts.pt \
        --prompts_per_domain 32 --domains 3

Same fit/held-out split as ``dspark-lightning calibrate`` (every other prompt per domain held out). Prints held-out
ECE, the fitted (T, b), and the spread (std) of the calibrated scores: a fit that squashes every score towards the
base rate scores a low ECE but leaves the scheduler nothing to rank by.
"""

import argparse

import torch

from dspark_lightning.calibration import Rollouts, ece, ece_floor, fit_sts, heldout_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rollouts")
    ap.add_argument("--prompts_per_domain", type=int, default=32)
    ap.add_argument("--domains", type=int, default=3)
    ap.add_argument("--heldout_fraction", type=float, default=0.5)
    a = ap.parse_args()
    ro = Rollouts.load(a.rollouts)
    held = torch.isin(ro.prompt, torch.tensor(heldout_prompts([a.prompts_per_domain] * a.domains, a.heldout_fraction)))
    (zf, mf, _), (zh, mh, _) = ro.rows(~held), ro.rows(held)
    yf, yh = (mf >= 1).double(), (mh >= 1).double()
    T_sts = fit_sts(*ro.rows(~held)).temperatures[0]
    best = min(
        (ece(torch.sigmoid(zf[:, 0] / T + b), yf), float(T), float(b))
        for T in torch.logspace(-1, 1, 81, dtype=torch.float64)
        for b in torch.linspace(-1.5, 1.5, 61, dtype=torch.float64)
    )
    for name, p in (
        ("raw", torch.sigmoid(zh[:, 0])),
        (f"STS T={T_sts:.3f}", torch.sigmoid(zh[:, 0] / T_sts)),
        (f"Platt T={best[1]:.2f} b={best[2]:+.2f}", torch.sigmoid(zh[:, 0] / best[1] + best[2])),
    ):
        print(f"{name:28s} held-out ECE {ece(p, yh):.2%}  floor {ece_floor(p):.2%}  score std {float(p.std()):.3f}")


if __name__ == "__main__":
    main()
