"""Plots of the benchmark suite (matplotlib, Agg backend): lines over time with the raw
points faint behind a smoothed curve, grouped bars for times per pass. Every figure has a
title that says the setup, labelled axes with units and a legend; PNGs stay small."""

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]
DPI = 90


def smooth(ys, window):
    """Centred moving average over `window` points (None values skipped)."""
    out = []
    half = max(0, window // 2)
    for i in range(len(ys)):
        w = [y for y in ys[max(0, i - half): i + half + 1] if y is not None]
        out.append(sum(w) / len(w) if w else None)
    return out


def wrap(title, width=100):
    return "\n".join(textwrap.wrap(title, width))


def _thousands(x, _pos):
    if x >= 1000:
        return f"{x / 1000:g}k"
    return f"{x:g}"


def save(fig, path):
    """Lays out `fig`, writes it to `path` and closes it."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def time_series(path, title, series, ylabel, log=False, smooth_s=10.0, ylim=None, note=None):
    """`series`: list of (label, [(t_s, y), ...]). Raw points faint, smoothed line solid."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for i, (label, pts) in enumerate(series):
        pts = [(t, y) for t, y in pts if y is not None and (not log or y > 0)]
        if not pts:
            continue
        c = COLORS[i % len(COLORS)]
        ts = [t for t, _ in pts]
        ys = [y for _, y in pts]
        step = (ts[-1] - ts[0]) / max(1, len(ts) - 1) if len(ts) > 1 else 0.5
        win = max(1, int(round(smooth_s / step))) if step > 0 else 1
        ax.scatter(ts, ys, s=3, color=c, alpha=0.15, linewidths=0)
        ax.plot(ts, smooth(ys, win), color=c, lw=1.8, label=label)
    if log:
        ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("time since the start of the run (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(wrap(title), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#555555")
    save(fig, path)


def grouped_bars(path, title, groups, bars, values, ylabel, xlabel, log=False, hline=None, annotate=True, panels=None,
                 colors=None, errors=None):
    """Bars grouped on the x axis. `values[(panel, group, bar)] = y` (None = not measured).
    `panels` splits the figure into side-by-side axes (e.g. one per workload); `errors`,
    keyed as `values`, draws error bars (a standard deviation, say)."""
    panels = panels or [None]
    width_in = min(15, 4.6 * len(panels) + 1.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(width_in, 4.6), squeeze=False, sharey=False)
    width = 0.8 / max(1, len(bars))
    for pi, panel in enumerate(panels):
        ax = axes[0][pi]
        for bi, bar in enumerate(bars):
            xs, ys, es = [], [], []
            for gi, g in enumerate(groups):
                v = values.get((panel, g, bar))
                if v is None:
                    continue
                xs.append(gi - 0.4 + width * (bi + 0.5))
                ys.append(v)
                es.append((errors or {}).get((panel, g, bar)) or 0)
            rects = ax.bar(xs, ys, width=width * 0.95, color=(colors or COLORS)[bi % len(colors or COLORS)],
                           label=bar if pi == 0 else None, yerr=es if errors else None, capsize=2)
            if annotate and len(groups) * len(bars) <= 24:
                for r, y in zip(rects, ys):
                    ax.annotate(f"{y:.3g}", (r.get_x() + r.get_width() / 2, r.get_height()), ha="center",
                                va="bottom", fontsize=6, xytext=(0, 1), textcoords="offset points")
        if hline:
            label, y = hline if not isinstance(hline, dict) else hline.get(panel, (None, None))
            if y is not None:
                ax.axhline(y, color="#444444", ls="--", lw=1, label=label if pi == 0 else None)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([str(g) for g in groups], fontsize=8)
        if log:
            ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
        ax.grid(True, axis="y", alpha=0.3)
        if panel is not None:
            ax.set_title(str(panel), fontsize=9)
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
    fig.suptitle(wrap(title, min(150, int(12 * width_in))), fontsize=10)
    handles, labels = [], []
    for ax in axes[0]:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(6, max(1, len(labels))),
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def bar_chart(path, title, labels, values, ylabel, xlabel, kinds=None, ylim=None):
    """One bar per label; `kinds` (same length) colours and names the bars in the legend."""
    kinds = kinds or [None] * len(labels)
    names = []
    for k in kinds:
        if k not in names:
            names.append(k)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for ki, kind in enumerate(names):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        rects = ax.bar(idx, [values[i] for i in idx], color=COLORS[ki % len(COLORS)], label=kind)
        for r, i in zip(rects, idx):
            ax.annotate(f"{values[i]:.3f}", (r.get_x() + r.get_width() / 2, r.get_height()), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8, rotation=20, ha="right")
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(wrap(title), fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if any(k is not None for k in names):
        ax.legend(fontsize=8)
    save(fig, path)
