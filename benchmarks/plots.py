"""PNG figures of a benchmark document (matplotlib, the optional ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIGURES = ("bench-dense.png", "bench-sparse.png", "bench-linear.png")
STYLES = {"framework": "-", "blocked": "--", "plain": ":"}
LABELS = {
    "framework": "library kernel (numpy: torch's)",
    "blocked": "blocked reference",
    "plain": "plain reference",
}


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
    rows = _rows(doc, "dense")
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    panels = [
        ("relative_time", "time / the library's kernel (numpy: torch's)", axes[0]),
        ("peak_bytes", "peak memory (MB)", axes[1]),
        ("fraction_of_gemm_peak", "GFLOP/s / GEMM GFLOP/s", axes[2]),
    ]
    backends = sorted({r["backend"] for r in rows})
    colours = dict(zip(backends, ("C0", "C1", "C2", "C3", "C4"), strict=False))
    for key, title, ax in panels:
        for backend in backends:
            for impl, style in STYLES.items():
                points = [
                    (r["length"], r[key])
                    for r in rows
                    if r["backend"] == backend and r["impl"] == impl and r[key]
                ]
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                if key == "peak_bytes":
                    ys = tuple(y / 1e6 for y in ys)
                ax.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    color=colours[backend],
                    label=f"{backend}: {LABELS[impl]}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].axhline(1.0, color="grey", linewidth=0.8)
    axes[1].legend(fontsize=7)
    c = doc["config"]
    figure.suptitle(
        f"dense attention, B={c['batch']} H={c['heads']} E={c['head_dim']} "
        f"{c['dtype']}{' causal' if c['causal'] else ''} (one run)"
    )
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
        label = f"{backend}: {impl}" + ("" if exponent is None else f", t ~ L^{exponent:.2f}")
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


def write_figures(doc: dict[str, Any], directory: Path) -> list[Path]:
    """The figures of the sections the document has; matplotlib must be importable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw, section in zip(
        FIGURES, (_dense, _sparse, _linear), ("dense", "sparse", "linear"), strict=True
    ):
        if _rows(doc, section):
            path = directory / name
            draw(doc, path, plt)
            plt.close("all")
            written.append(path)
    return written
