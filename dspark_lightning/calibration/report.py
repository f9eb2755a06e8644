"""The calibration report: a per-position markdown table of a calibration file and reliability diagrams
(matplotlib imported lazily)."""

from __future__ import annotations

from pathlib import Path

from ..markdown import cell as _f
from ..markdown import table as _table


def plot_reliability(z, m, ell, temps_before, temps_after, out_dir: str | Path, title: str = "") -> list[Path]:
    """One reliability diagram per block position (the paper's Figure 6): survival p_k against realised
    prefix acceptance in 20 equal-width bins, raw and after STS, with the bin counts."""
    import torch

    from ..plots import plt, save_figure
    from .sts import N_BINS, survival_probs

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    before, after = survival_probs(z, torch.as_tensor(temps_before)), survival_probs(z, torch.as_tensor(temps_after))
    for k in range(z.shape[1]):
        rows = ell >= k + 1
        y = (m[rows] >= k + 1).double()
        fig, (ax, axc) = plt.subplots(2, 1, figsize=(4.2, 4.8), sharex=True, height_ratios=[3, 1])
        ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfect")
        for p_all, label in ((before, "raw"), (after, "STS")):
            p = p_all[rows, k]
            b = (p * N_BINS).floor().long().clamp(max=N_BINS - 1)
            n = torch.bincount(b, minlength=N_BINS)
            mp = torch.bincount(b, weights=p, minlength=N_BINS) / n.clamp(min=1)
            my = torch.bincount(b, weights=y, minlength=N_BINS) / n.clamp(min=1)
            keep = n > 0
            ax.plot(mp[keep].tolist(), my[keep].tolist(), "o-", ms=3, label=label)
            centers = ((torch.arange(N_BINS) + 0.5) / N_BINS).tolist()
            axc.bar(centers, n.tolist(), width=1 / N_BINS, alpha=0.5, label=label)
        ax.set_ylabel("realised survival")
        ax.set_title(f"position {k + 1} ({int(rows.sum())} rounds) {title}", fontsize=9)
        ax.legend(fontsize=7)
        axc.set_xlabel("predicted survival a_k")
        axc.set_ylabel("rounds")
        axc.set_yscale("log")
        fig.tight_layout()
        path = out_dir / f"reliability_pos{k + 1}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def calibration_markdown(doc: dict) -> str:
    """Per-position table of a calibration file: T*, and ECE/AUROC/Brier raw → STS on the fit and held-out rounds."""
    ds = doc["dataset"]
    lines = [
        f"STS at sampling temperature {doc['sampling_temperature']:g}: {ds.get('fit_rounds', ds.get('rounds'))} fit "
        f"rounds, {ds.get('heldout_rounds', 0)} held-out rounds (prompts never used by the fit); "
        f"{doc['bins']}-bin ECE of the survival a_k against 1[m ≥ k]. Floor: the ECE a perfectly calibrated "
        "predictor with the STS scores would show on these rows (finite-sample bias; mean of 200 draws).",
        "",
    ]
    held = doc.get("heldout")
    head = ["position", "T*", "fit ECE raw → STS"]
    if held:
        head += ["held-out ECE raw → STS (floor)"]
        head += [f"held-out {x} raw → STS" for x in ("AUROC", "Brier")] + ["held-out mean a → S"]
    else:
        head += ["AUROC raw → STS", "Brier raw → STS", "mean a → S"]
    rows = []
    for i, T in enumerate(doc["temperatures"]):
        fb, fa = doc["before"][i], doc["after"][i]
        b, f = (held["before"][i], held["after"][i]) if held else (fb, fa)
        rows.append([
            str(fa["k"]), f"{T:.3f}", f"{fb['ece']:.2%} → {fa['ece']:.2%}",
            *([f"{b['ece']:.2%} → {f['ece']:.2%} ({_f(f.get('ece_floor'), '.2%')})"] if held else []),
            f"{_f(b['auroc'], '.3f')} → {_f(f['auroc'], '.3f')}", f"{b['brier']:.4f} → {f['brier']:.4f}",
            f"{f['mean_p']:.4f} → {f['mean_y']:.4f}",
        ])  # fmt: skip
    return "\n".join(lines + _table(head, rows))
