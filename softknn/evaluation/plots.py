"""The evaluation report's plots (matplotlib, Agg): the abstain trade-off, evidence recall@k, and
the retrievals side by side. Each returns the path written, or None when the report lacks the part."""

from __future__ import annotations

from pathlib import Path


def plot_abstain(rep: dict, path: Path, title: str = "") -> Path | None:
    """Answered accuracy vs rejection rate, and OOD rejection vs in-scope accuracy loss, softknn beside
    the baseline; the calibrated operating points marked."""
    cls = rep.get("classification")
    if not cls:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_ood = cls["abstain"]["n_ood"] > 0
    fig, axes = plt.subplots(1, 2 if has_ood else 1, figsize=(12 if has_ood else 6, 4.5), squeeze=False)
    styles = {"softknn": "-", "baseline_knn": "--", "softknn_gated": "-.", "baseline_knn_gated": ":"}
    ax = axes[0][0]
    for name, pts in cls["curves"].items():
        pts = [p for p in pts if p["answered_accuracy"] is not None]
        ax.plot([p["rejection_rate"] for p in pts], [p["answered_accuracy"] for p in pts], styles.get(name, "-"), label=name)
    for name in ("softknn", "baseline_knn"):
        for rule, a in cls["abstain"].get(name, {}).items():
            if a.get("answered_accuracy") is not None:
                ax.plot([a["rejection_rate"]], [a["answered_accuracy"]], "o", label=f"{name} {rule} t={a['threshold']:.3f}")
    ax.set_xlabel("in-scope rejection rate")
    ax.set_ylabel("accuracy on answered queries")
    ax.set_title("abstain trade-off")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if has_ood:
        ax = axes[0][1]
        for name, pts in cls["curves"].items():
            ax.plot([p["accuracy_loss"] for p in pts], [p["ood_rejection_rate"] for p in pts], styles.get(name, "-"), label=name)
        for name in ("softknn", "baseline_knn"):
            for rule, a in cls["abstain"].get(name, {}).items():
                ax.plot([a["accuracy_loss"]], [a["ood_rejection_rate"]], "o", label=f"{name} {rule} (calibrated)")
        ax.set_xlabel("in-scope accuracy loss (right answers rejected)")
        ax.set_ylabel("out-of-domain rejection rate")
        ax.set_xlim(0, 0.1)
        ax.set_title("rejecting out-of-domain inputs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_evidence(rep: dict, path: Path, title: str = "") -> Path | None:
    """recall@k of the gold ids among the evidence, k = 1…10, softknn beside the plain ranking."""
    ev = rep.get("evidence")
    if not ev:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, style in (("softknn", "o-"), ("baseline", "x--")):
        pts = ev["curves"][name]
        m = ev[name]
        ax.plot([p["k"] for p in pts], [p["recall"] for p in pts], style,
                label=f"{name}: nDCG@10 {m['ndcg@10']:.3f}, MRR@10 {m['mrr@10']:.3f}")
    ax.set_xlabel("k (evidence items, unique ids)")
    ax.set_ylabel("recall@k of the gold ids")
    ax.set_title(title or "evidence quality")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_retrieval(rep: dict, path: Path, title: str = "") -> Path | None:
    """Dense, lexical and hybrid side by side: evidence recall@k curves, or accuracy bars."""
    rows = rep.get("retrieval") or {}
    if len(rows) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if all("recall_curve" in r for r in rows.values()):
        for mode, r in rows.items():
            ks = [p["k"] for p in r["recall_curve"]]
            ax.plot(ks, [p["recall"] for p in r["recall_curve"]], marker="o", ms=3,
                    label=f"{mode} (nDCG@10 {r['evidence'].get('ndcg@10', float('nan')):.3f})")
        ax.set_xlabel("evidence items k")
        ax.set_ylabel("recall@k (gold passage among the evidence)")
    else:
        modes = list(rows)
        acc = [rows[m]["classification"]["accuracy"] for m in modes]
        ax.bar(modes, acc, color="#4878a8")
        for i, a in enumerate(acc):
            ax.text(i, a, f"{a:.4f}", ha="center", va="bottom")
        ax.set_ylim(min(acc) - 0.05, min(1.0, max(acc) + 0.02))
        ax.set_ylabel("accuracy")
    ax.set_title(f"retrieval side by side — {title}" if title else "retrieval side by side")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right") if ax.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
