"""PNG figures of a benchmark document (matplotlib, the optional ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIGURES = ("bench-dense.png", "bench-sparse.png", "bench-linear.png", "bench-kernel.png")
STYLES = {"torch_sdpa": "-", "library": "-.", "reference": "--", "plain": ":", "kernel": "-"}
LABELS = {
    "torch_sdpa": "PyTorch SDPA (numpy, jax: on the same data)",
    "library": "jax.nn.dot_product_attention (jit)",
    "reference": "reference: scaled_dot_product_attention",
    "plain": "reference: plain_attention",
    "kernel": "your kernel",
}
COLOURS = {"numpy": "C0", "torch": "C1", "jax": "C2", "cupy": "C3", "array_api_strict": "C4"}


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else what to install."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'attnspec[bench]')"
    return None


def _rows(doc: dict[str, Any], section: str) -> list[dict[str, Any]]:
    return [r for r in doc["measurements"] if r["section"] == section and r["seconds"]]


def _dense(doc: dict[str, Any], path: Path, plt: Any) -> None:
    from .report import MAX_PEAK_BYTES, MAX_RELATIVE_TIME

    rows = _rows(doc, "dense") + _rows(doc, "long")
    cases = list(dict.fromkeys(r["params"]["case"] for r in rows))
    figure, axes = plt.subplots(len(cases), 3, figsize=(15, 3.6 * len(cases) + 1.2), squeeze=False)
    panels = [
        ("relative_time", "time / PyTorch SDPA's (same run)"),
        ("seconds", "wall time (s)"),
        ("peak_bytes", "peak memory above the inputs (MB)"),
    ]
    backends = sorted({r["backend"] for r in rows})
    handles: dict[str, Any] = {}
    for row, case in enumerate(cases):
        for column, (key, title) in enumerate(panels):
            ax = axes[row][column]
            for backend in backends:
                for impl, style in STYLES.items():
                    points = sorted(
                        (r["length"], r[key])
                        for r in rows
                        if r["backend"] == backend
                        and r["impl"] == impl
                        and r["params"]["case"] == case
                        and r[key]
                    )
                    if not points:
                        continue
                    xs, ys = zip(*points, strict=True)
                    if key == "peak_bytes":
                        ys = tuple(y / 1e6 for y in ys)
                    label = f"{backend}: {LABELS[impl]}"
                    (line,) = ax.plot(
                        xs, ys, style, marker="o", color=COLOURS.get(backend, "C5"), label=label
                    )
                    handles.setdefault(label, line)
            if key == "relative_time" and case == "causal":
                for backend in backends:
                    limit = MAX_RELATIVE_TIME.get(backend)
                    if limit is None:
                        continue
                    label = f"goal, {backend}: {limit}x PyTorch SDPA at L = 4096"
                    line = ax.axhline(
                        limit, color=COLOURS.get(backend, "C5"), linewidth=1.2, alpha=0.5
                    )
                    handles.setdefault(label, line)
            if key == "relative_time":
                ax.axhline(1.0, color="grey", linewidth=0.8)
            if key == "peak_bytes" and case == "causal":
                label = f"goal: {MAX_PEAK_BYTES / 1e9:.0f} GB at L = 131072"
                handles.setdefault(
                    label, ax.axhline(MAX_PEAK_BYTES / 1e6, color="red", linewidth=1.0)
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_title(f"{case}: {title}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    c = doc["config"]
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    figure.suptitle(
        f"dense attention, B={c['batch']} H={c['heads']} E={c['head_dim']} {c['dtype']} "
        f"(one run; each length's calls interleaved)"
    )
    # about 0.2 inch per legend row, below the panels
    legend_inches = 0.2 * -(-len(handles) // 3) + 0.3
    figure.tight_layout(rect=(0, legend_inches / figure.get_figheight(), 1, 0.97))
    figure.savefig(path, dpi=110)


def _kernel(doc: dict[str, Any], path: Path, plt: Any) -> None:
    rows = _rows(doc, "kernel")
    workloads = list(dict.fromkeys(r["params"]["workload"] for r in rows))
    impls = [i for i in ("kernel", "reference", "torch_sdpa") if any(r["impl"] == i for r in rows)]
    figure, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for key, title, ax in (
        ("seconds", "wall time (s)", axes[0]),
        ("peak_bytes", "peak memory above the inputs (MB)", axes[1]),
    ):
        width = 0.8 / max(1, len(impls))
        for offset, impl in enumerate(impls):
            values = []
            for workload in workloads:
                match = [
                    r[key]
                    for r in rows
                    if r["impl"] == impl and r["params"]["workload"] == workload and r[key]
                ]
                value = match[0] if match else 0
                values.append(value / 1e6 if key == "peak_bytes" else value)
            name = rows[0]["params"].get("kernel", "") if impl == "kernel" else ""
            label = f"{LABELS[impl]} ({name})" if name else LABELS[impl]
            positions = [i + width * (offset - (len(impls) - 1) / 2) for i in range(len(workloads))]
            ax.bar(positions, values, width, label=label)
        ax.set_xticks(range(len(workloads)), workloads, rotation=12, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    backend = rows[0]["backend"] if rows else "?"
    figure.suptitle(f"your kernel at the suite's realistic shapes ({backend}, one run)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _sparse(doc: dict[str, Any], path: Path, plt: Any) -> None:
    rows = _rows(doc, "sparse")
    patterns = list(dict.fromkeys(r["params"]["pattern"] for r in rows))
    kinds = ("sparse", "dense blocked", "dense plain")
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for key, title, ax in (
        ("seconds", "time (s)", axes[0]),
        ("peak_bytes", "peak memory (MB)", axes[1]),
    ):
        for offset, kind in enumerate(kinds):
            values = []
            for pattern in patterns:
                match = [r[key] for r in rows if r["impl"] == f"{kind} {pattern}" and r[key]]
                value = match[0] if match else 0
                values.append(value / 1e6 if key == "peak_bytes" else value)
            ax.bar(
                [i + 0.27 * (offset - 1) for i in range(len(patterns))], values, 0.27, label=kind
            )
        ax.set_xticks(range(len(patterns)), patterns, rotation=20)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    length = rows[0]["length"] if rows else "?"
    figure.suptitle(
        f"sparse kernels against the dense reference with the pattern's mask, "
        f"L = {length} (missing bars: did not fit in memory)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _linear(doc: dict[str, Any], path: Path, plt: Any) -> None:
    rows = _rows(doc, "linear")
    exponents = {t["name"]: t["value"] for t in doc["targets"]}
    figure, ax = plt.subplots(figsize=(6.5, 4.4))
    for (backend, impl), style in zip(
        sorted({(r["backend"], r["impl"]) for r in rows}),
        ("-", "--", "-.", ":", "-", "--"),
        strict=False,
    ):
        points = sorted(
            (r["length"], r["seconds"])
            for r in rows
            if r["backend"] == backend and r["impl"] == impl
        )
        xs, ys = zip(*points, strict=True)
        exponent = next(
            (
                v
                for n, v in exponents.items()
                if n.startswith(f"{impl} attention") and f"({backend})" in n
            ),
            None,
        )
        label = f"{backend}: {impl}, " + (
            "no exponent (fewer than 4 lengths spanning 8x)"
            if exponent is None
            else f"t ~ L^{exponent:.2f}"
        )
        ax.plot(xs, ys, style, marker="o", label=label)
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], color="grey", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("time (s)")
    ax.set_title("linear attention (grey: t ~ L)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _section_document(doc: dict[str, Any], sections: tuple[str, ...], figure: str) -> str:
    """The numbers of one figure, as JSON: the run's context and the section's rows."""
    import json

    rows = [r for r in doc["measurements"] if r["section"] in sections]
    names = {r["backend"] for r in rows}
    part = {
        "schema": doc["schema"],
        "figure": figure,
        "attnspec": doc["attnspec"],
        "created": doc["created"],
        "machine": doc["machine"],
        "config": doc["config"],
        "backends": {n: info for n, info in doc["backends"].items() if n in names},
        "measurements": rows,
        "targets": [
            t
            for t in doc["targets"]
            if any(f"({n})" in t["name"] for n in names)
            and (("linear" in t["name"]) == ("linear" in sections))
        ],
    }
    return json.dumps(part, indent=1) + "\n"


SECTIONS_OF = {
    "bench-dense.png": ("dense", "long"),
    "bench-sparse.png": ("sparse",),
    "bench-linear.png": ("linear",),
    "bench-kernel.png": ("kernel",),
}


def write_figures(doc: dict[str, Any], directory: Path) -> list[Path]:
    """The figures of the sections the document has, each with a JSON of its numbers beside
    it (``bench-dense.png`` and ``bench-dense.json``); matplotlib must be importable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw in zip(FIGURES, (_dense, _sparse, _linear, _kernel), strict=True):
        sections = SECTIONS_OF[name]
        if any(_rows(doc, section) for section in sections):
            path = directory / name
            draw(doc, path, plt)
            plt.close("all")
            numbers = path.with_suffix(".json")
            numbers.write_text(_section_document(doc, sections, name))
            written += [path, numbers]
    return written
