#!/usr/bin/env python3
"""Bytes vs quality of the KV configurations measured on each model (bench/quality/points.csv).

Three panels per model: Δppl (with its 95 % CI), top-1 agreement and passkey retrieval
(bench/quality/passkey.csv) against the closed-page KV bytes as a percentage of bf16. The
shipped default is a star; the issue-33 target box (≤ 20 % of bf16 bytes, ≤ 1 % Δppl,
≥ 97 % top-1) is shaded.

    python3 bench/quality/plot.py [--csv points.csv] [--passkey passkey.csv] [--out bytes_vs_quality.png]
"""
import argparse
import csv
import sys
from pathlib import Path


def read_rows(path, floats=(), ints=()):
    """The CSV's rows (lines starting with # skipped), with the named columns converted."""
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if not l.startswith("#")]
    for r in csv.DictReader(lines):
        where = f"{path}: row {r.get('model')}/{r.get('config')}"
        if None in r:
            sys.exit(f"{where}: more fields than the header (quote a source with commas)")
        for key, kind in [(k, float) for k in floats] + [(k, int) for k in ints]:
            try:
                r[key] = kind(r[key])
            except (TypeError, ValueError):
                sys.exit(f"{where}: {key} is not a number: {r[key]!r}")
        r["default"] = r["default"].strip() == "1"
        rows.append(r)
    if not rows:
        sys.exit(f"{path}: no rows")
    return rows


def read_points(path):
    return read_rows(path, floats=("closed_pct", "kl", "top1", "dppl", "dppl_lo", "dppl_hi"))


def read_passkey(path):
    rows = read_rows(path, floats=("closed_pct",), ints=("length", "hits", "trials"))
    for r in rows:
        if not 0 <= r["hits"] <= r["trials"] or r["trials"] == 0:
            sys.exit(f"{path}: row {r['model']}/{r['config']}: {r['hits']} hits of {r['trials']} trials")
    return rows


def main():
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(here / "points.csv"))
    ap.add_argument("--passkey", default=str(here / "passkey.csv"))
    ap.add_argument("--out", default=str(here / "bytes_vs_quality.png"))
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = read_points(args.csv)
    passkey = read_passkey(args.passkey)
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(3, len(models), figsize=(6.5 * len(models), 12), squeeze=False)
    for col, model in enumerate(models):
        pts = [r for r in rows if r["model"] == model]
        ax_p, ax_t = axes[0][col], axes[1][col]
        for ax in (ax_p, ax_t):
            ax.grid(alpha=0.3)
            ax.set_xlabel("closed-page KV bytes, % of bf16")
        # The target: both bounds at once (≤ 20 % of bf16 and Δppl ≤ 1 % / top-1 ≥ 97 %).
        ax_p.add_patch(Rectangle((0, -100), 20, 101, color="tab:green", alpha=0.12, lw=0))
        ax_t.add_patch(Rectangle((0, 0.97), 20, 0.03, color="tab:green", alpha=0.12, lw=0))
        for r in pts:
            marker, size = ("*", 220) if r["default"] else ("o", 40)
            color = "tab:red" if r["default"] else ("tab:purple" if "FDC" in r["config"] else "tab:blue")
            ax_p.errorbar(r["closed_pct"], r["dppl"], yerr=[[r["dppl"] - r["dppl_lo"]], [r["dppl_hi"] - r["dppl"]]],
                          fmt="none", ecolor=color, alpha=0.5, capsize=2)
            ax_p.scatter(r["closed_pct"], r["dppl"], marker=marker, s=size, color=color, zorder=3)
            ax_t.scatter(r["closed_pct"], r["top1"], marker=marker, s=size, color=color, zorder=3)
            label = r["config"] + (" (default)" if r["default"] else "")
            ax_p.annotate(label, (r["closed_pct"], r["dppl"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
            ax_t.annotate(label, (r["closed_pct"], r["top1"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        xmax = max(r["closed_pct"] for r in pts) * 1.25
        for ax in (ax_p, ax_t):
            ax.set_xlim(0, xmax)
        lo = min(min(r["dppl_lo"] for r in pts), -1)
        hi = max(r["dppl_hi"] for r in pts)
        ax_p.set_ylim(lo - 1, hi * 1.3)
        ax_p.set_yscale("symlog", linthresh=2)  # linear within ±2 %, where the targets are; FDC's tens of % above
        ticks = [t for t in (-5, -2, -1, 0, 1, 2, 5, 10, 20, 50, 100) if lo - 1 <= t <= hi * 1.3]
        ax_p.set_yticks(ticks, [f"{t:+d}" if t else "0" for t in ticks])
        ax_t.set_ylim(min(r["top1"] for r in pts) - 0.03, 1.0)
        ax_p.set_title(f"{model}: Δppl vs bytes (95 % CI)")
        ax_t.set_title(f"{model}: top-1 agreement vs bytes")
        ax_p.set_ylabel("Δ perplexity, % (linear within ±2, log beyond)")
        ax_t.set_ylabel("top-1 agreement with fp32")
    for col, model in enumerate(models):
        ax = axes[2][col]
        pts = [r for r in passkey if r["model"] == model]
        lengths = sorted({r["length"] for r in pts})
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, length in enumerate(lengths):
            color = colors[i % len(colors)]
            at = [r for r in pts if r["length"] == length]
            for r in at:
                rate = r["hits"] / r["trials"]
                if r["config"] == "fp32":  # the reference: a line, not a point at 200 %
                    ax.axhline(rate, color=color, ls="--", lw=1, alpha=0.6)
                    continue
                ax.scatter(r["closed_pct"] + (i - (len(lengths) - 1) / 2) * 0.4, rate, color=color,
                           marker="*" if r["default"] else "o", s=160 if r["default"] else 40, zorder=3,
                           label=f"{length} tokens" if r is next(x for x in at if x["config"] != "fp32") else None)
                ax.annotate(f"{r['config']} {r['hits']}/{r['trials']}", (r["closed_pct"], rate), fontsize=6,
                            xytext=(4, -8 - 7 * i), textcoords="offset points")
        ax.set_xlim(0, max([r["closed_pct"] for r in rows if r["model"] == model]) * 1.25)
        ax.set_ylim(-0.05, 1.08)
        ax.grid(alpha=0.3)
        ax.set_xlabel("closed-page KV bytes, % of bf16")
        ax.set_ylabel("passkeys retrieved")
        ax.set_title(f"{model}: passkey retrieval vs bytes (dashed: fp32 cache)")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("KV compression on the decode path vs an fp32 cache (bench/fidelity); shaded: the issue-33 target")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({len(rows)} points, {len(passkey)} passkey cells, {len(models)} models)")


if __name__ == "__main__":
    main()
