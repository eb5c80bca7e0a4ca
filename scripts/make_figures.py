"""Draws the README's two figures with matplotlib; nothing in them is drawn by hand.

    python scripts/make_figures.py           # writes docs/img/architecture.svg, benchmarks.svg

* ``architecture.svg``: the data flow of DESIGN.md ("Data flow"), from the description in
  ``ARCHITECTURE`` below: one box per stage, where it runs, and the arrows between them.
* ``benchmarks.svg``: samples/s of stoker and of its peers, parsed out of
  ``bench/RESULTS.md`` (the medians of the runs of each benchmark's first table), so the
  chart changes when the results do: rerun this script after updating RESULTS.md.
  tests/test_figures.py checks that the chart shows the numbers RESULTS.md holds now.

Needs matplotlib (``pip install matplotlib``). The SVGs keep their text as text (small,
searchable) and carry no date, so the same inputs give the same files.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
OUT = ROOT / "docs" / "img"

# -- the data flow ---------------------------------------------------------------------------

# (column, row, title, detail, where it runs): a grid of boxes, the data flowing down the
# middle column; the side boxes are what a batch meets when asked for.
ARCHITECTURE = [
    (1, 0, "shards + index.json", "mmap'd files, or a local cache\nof s3:// and https:// shards",
     "disk"),
    (1, 1, "sampler", "epoch permutation (seed, epoch),\nrank share, resume cursor", "C++"),
    (1, 2, "worker threads", "read + verify (xxHash), decode (libjpeg-turbo,\nlibpng), ops "
     "(crop, resize, RandAugment...)\nstraight into batch slot k", "C++, no GIL"),
    (0, 2, "Python stage (optional)", "map=, batch_map=, collate_fn=,\nany __getitem__ dataset",
     "Python threads or processes"),
    (1, 3, "batch ring", "pinned host memory, ordered by k,\nlock-free on the fast path",
     "C++"),
    (2, 3, "copy thread", "async host-to-device copy\non its own CUDA stream",
     "C++, with device=\"cuda\""),
    (1, 4, "your training loop", "next(): a dict of torch.Tensor, no copy\n(DLPack); "
     "state_dict(), stats()", "Python"),
]
ARROWS = [((1, 0), (1, 1)), ((1, 1), (1, 2)), ((1, 1), (0, 2)), ((0, 2), (1, 3)),
          ((1, 2), (1, 3)), ((1, 3), (1, 4)), ((1, 3), (2, 3)), ((2, 3), (1, 4))]
COLOURS = {"disk": "#e8e8e8", "C++": "#cfe3f7", "C++, no GIL": "#cfe3f7",
           "C++, with device=\"cuda\"": "#d9f0d3", "Python": "#fde9c9",
           "Python threads or processes": "#fde9c9"}


def _setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "stoker",
                         "font.family": "DejaVu Sans", "font.size": 9})
    return plt


def draw_architecture(path: Path) -> None:
    plt = _setup()
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    w, h, dx, dy = 3.6, 1.15, 4.0, 1.55
    fig, ax = plt.subplots(figsize=(11, 8))
    centre: Dict[Tuple[int, int], Tuple[float, float]] = {}
    for col, row, title, detail, where in ARCHITECTURE:
        x, y = col * dx, -row * dy
        centre[col, row] = (x, y)
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                    boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc=COLOURS[where], ec="#555555", lw=1))
        ax.text(x, y + 0.36, title, ha="center", va="center", weight="bold", fontsize=10)
        ax.text(x, y - 0.02, detail, ha="center", va="center", fontsize=7.5, color="#333333",
                linespacing=1.3)
        ax.text(x, y - 0.43, where, ha="center", va="center", fontsize=7, color="#777777",
                style="italic")
    for a, b in ARROWS:
        (x0, y0), (x1, y1) = centre[a], centre[b]
        if x0 == x1:
            start, end = (x0, y0 - h / 2), (x1, y1 + h / 2)
        elif y0 == y1:
            start = (x0 + (w / 2 if x1 > x0 else -w / 2), y0)
            end = (x1 - (w / 2 if x1 > x0 else -w / 2), y1)
        else:
            start = (x0 + (w / 2 if x1 > x0 else -w / 2) * 0.8, y0 - h / 2)
            end = (x1 - (w / 2 if x1 > x0 else -w / 2) * 0.8, y1 + h / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color="#444444", lw=1.2))
    ax.text(dx, 0.95, "stoker: how a batch is made", ha="center", fontsize=13, weight="bold")
    ax.text(dx, -4 * dy - 0.85, "Batch k is the same samples in the same order for a given "
            "(seed, epoch, rank, world size), whatever the number of threads.",
            ha="center", fontsize=8, color="#555555")
    ax.set_xlim(-w / 2 - 0.2, 2 * dx + w / 2 + 0.2)
    ax.set_ylim(-4 * dy - 1.1, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


# -- the benchmarks --------------------------------------------------------------------------

def _section(text: str, heading: str) -> str:
    """The text of the `## heading...` section of RESULTS.md."""
    m = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m is None:
        raise ValueError(f"bench/RESULTS.md: no section '## {heading}'")
    return m.group(1)


def _first_table(section: str) -> Tuple[List[str], List[List[str]]]:
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    if len(rows) < 3:
        raise ValueError("bench/RESULTS.md: a section without its table")
    return rows[0], [r for r in rows[2:]]


def _number(cell: str) -> float:
    return float(cell.replace(",", "").replace("~", ""))


def _column(header: Sequence[str], rows: List[List[str]], name: str) -> List[str]:
    if name not in header:
        raise ValueError(f"bench/RESULTS.md: no column {name!r} in {header}")
    return [r[header.index(name)] for r in rows]


def _median(cells: Sequence[str]) -> float:
    return statistics.median(_number(c) for c in cells)


def _best_of(cells: Sequence[str]) -> float:
    """The median over runs of the best of "a / b / c" (the best DataLoader setting)."""
    return statistics.median(max(_number(v) for v in c.split("/")) for c in cells)


Bars = List[Tuple[str, float]]


def benchmark_numbers(text: str = None) -> Dict[str, Tuple[Bars, float]]:
    """{benchmark: ([(contender, samples/s), ...], stoker / best DataLoader)}, stoker first,
    from RESULTS.md: the medians of the runs, and the median of the runs' own ratios where
    the table gives them (what the README quotes)."""
    text = RESULTS.read_text(encoding="utf-8") if text is None else text
    out: Dict[str, Tuple[Bars, float]] = {}

    head, rows = _first_table(_section(text, "Fixed-size records"))
    dl = [max(_number(a), _number(b), _number(c)) for a, b, c in zip(
        _column(head, rows, "DataLoader w=0"), _column(head, rows, "w=1"),
        _column(head, rows, "w=2"))]
    out["Fixed-size records, uint8[3,64,64] + label"] = ([
        ("stoker, 2 threads", _median(_column(head, rows, "stoker 2 thr"))),
        ("DataLoader (best of 0-2 workers)", statistics.median(dl)),
        ("NumPy loop over a memmap", _median(_column(head, rows, "NumPy loop"))),
        ("memcpy of the same bytes (ceiling)", _median(_column(head, rows, "memcpy ceiling"))),
    ], _median([c.rstrip("x") for c in _column(head, rows, "stoker / best DL")]))

    head, rows = _first_table(_section(text, "Images"))
    out["JPEGs, RandomResizedCrop(224) + flip"] = ([
        ("stoker, 2 threads", _median(_column(head, rows, "stoker 2 thr"))),
        ("DataLoader + PIL (best of 0-2 workers)",
         _best_of(_column(head, rows, "DataLoader+PIL w=0 / 1 / 2"))),
        ("full decodes, libjpeg-turbo, 2 threads", _median(_column(head, rows, "2 thr"))),
    ], _median([c.rstrip("x") for c in _column(head, rows, "stoker / best DL")]))

    head, rows = _first_table(_section(text, "Augmentation"))
    by = {r[0]: r[1] for r in rows}

    def find(prefix: str) -> str:
        hits = [v for k, v in by.items() if k.startswith(prefix)]
        if len(hits) != 1:
            raise ValueError(f"bench/RESULTS.md, Augmentation: no single row {prefix!r}")
        return hits[0]

    bars = [
        ("stoker", _number(find("stoker timm-style"))),
        ("DataLoader + Pillow (best of 0-2 workers)",
         _best_of([find("DataLoader + Pillow")])),
        ("DataLoader + albumentations (best of 0-2 workers)",
         _best_of([find("DataLoader + albumentations")])),
    ]
    out["JPEGs, timm-style augmentation (RRC, flip, RandAugment, Normalize, erasing)"] = (
        bars, bars[0][1] / max(v for _, v in bars[1:]))
    return out


def label(value: float) -> str:
    """How a figure of samples/s is written on the chart (the test looks for these)."""
    return f"{value:,.0f}"


def ratio_label(ratio: float) -> str:
    return f"{ratio:.1f}x"


def draw_benchmarks(path: Path, numbers: Dict[str, Tuple[Bars, float]]) -> None:
    plt = _setup()
    rows = sum(len(b) for b, _ in numbers.values())
    fig, axes = plt.subplots(len(numbers), 1, figsize=(9, 0.42 * rows + 0.9 * len(numbers)),
                             gridspec_kw={"height_ratios": [len(b) for b, _ in
                                                            numbers.values()]})
    for ax, (title, (bars, best_ratio)) in zip(axes, numbers.items()):
        names = [n for n, _ in bars][::-1]
        values = [v for _, v in bars][::-1]
        colours = ["#2a7ab9" if n.startswith("stoker") else
                   "#bbbbbb" if "ceiling" in n or "NumPy" in n or "full decodes" in n
                   else "#e39b3b" for n in names]
        ax.barh(names, values, color=colours, height=0.7)
        for i, (n, v) in enumerate(zip(names, values)):
            ratio = f"  ({ratio_label(best_ratio)} DataLoader)" if n.startswith("stoker") else ""
            ax.text(v, i, f" {label(v)}{ratio}", va="center", fontsize=8)
        ax.set_title(title, loc="left", fontsize=9.5, weight="bold")
        ax.set_xlim(0, max(values) * 1.35)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(axis="y", labelsize=8)
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlabel("samples/s, the median of the runs in bench/RESULTS.md (2-core VM); "
                        "x DataLoader: the median of the runs' ratios", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    draw_architecture(OUT / "architecture.svg")
    numbers = benchmark_numbers()
    draw_benchmarks(OUT / "benchmarks.svg", numbers)
    for title, (bars, ratio) in numbers.items():
        print(f"{title}: " + ", ".join(f"{n} {label(v)}" for n, v in bars)
              + f"; {ratio_label(ratio)} DataLoader")
    print(f"wrote {OUT.relative_to(ROOT)}/architecture.svg and benchmarks.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
