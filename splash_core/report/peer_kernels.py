"""Peer kernels (``peer_kernels``, ``bench/peer_kernels.py``): SPLASH's MLA decode beside
FlashMLA and SGLang's Triton decode on the same caches, with the ratio to FlashMLA per point
and the decode provider it chose per head count."""

from __future__ import annotations

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, ms, table, tokens

FP8_CACHE = "On the scaled-fp8 cache (656 bytes a token)"
LINE_STYLES = {"splash": "-", "flashmla": "--", "sglang": ":"}


def kernel_names(summary: dict) -> list[str]:
    """The kernels that ran (not skipped), on the bf16 cache first, then those only on fp8."""
    kernels, fp8 = summary["kernels"], summary.get("kernels_fp8", {})
    names = [n for n in kernels if "skipped" not in kernels[n]]
    return names + [n for n in fp8 if "skipped" not in fp8[n] and n not in names]


def splash_over_flashmla(got: dict) -> float | None:
    """SPLASH's time over FlashMLA's at one point (kernel -> sample), None unless both ran."""
    flash = got.get("flashmla")
    return None if flash is None or "splash" not in got else got["splash"]["ms"] / flash["ms"]


def by_point(samples: list[dict]) -> dict[tuple, dict]:
    """(cache, heads, batch, context) -> kernel -> sample."""
    points: dict[tuple, dict] = {}
    for x in samples:
        points.setdefault((x.get("kv", "bf16"), x["heads"], x["batch"], x["context"]), {})[x["kernel"]] = x
    return points


def render(result: Result, ctx: Context) -> list[str]:
    """The kernels, the same run's rates, one row per point and the decode provider per head count."""
    s = result["summary"]
    names = kernel_names(s)
    lines = _kernel_lines(s) + _rates_lines(s.get("rates", {}))
    lines += _point_table(result["samples"], names) + [""] + _provider_lines(s)
    if len(names) > 1:
        lines += [f"![decode TFLOP/s by kernel]({_plot(result, ctx, names)})", ""]
    return lines


def _kernel_lines(summary: dict) -> list[str]:
    lines = []
    for label, ks in (("Kernels", summary["kernels"]), (FP8_CACHE, summary.get("kernels_fp8", {}))):
        if ks:
            lines += [f"{label}: " + "; ".join(f"`{n}` {k['what']}{_kernel_state(k)}" for n, k in ks.items()) + ".", ""]
    return lines


def _kernel_state(kernel: dict) -> str:
    if "skipped" in kernel:
        return f" (skipped: {kernel['skipped']})"
    return f" ({'correct' if kernel.get('correct') else 'WRONG'} on the reference case)"


def _rates_lines(rates: dict) -> list[str]:
    if not rates:
        return []
    return [f"Same run: copy bandwidth {rates['copy_gbps']:.0f} GB/s, bf16 matmul {rates['matmul_tflops']:.0f} "
            "TFLOP/s.", ""]


def _point_table(samples: list[dict], names: list[str]) -> list[str]:
    rows = []
    for (kv, heads, batch, context), got in sorted(by_point(samples).items()):
        cells = [MISSING if n not in got else _cell(got[n]) for n in names]
        ratio = splash_over_flashmla(got)
        rows.append([kv, str(heads), str(batch), tokens(context), *cells,
                     MISSING if ratio is None else f"{ratio:.2f}x"])
    return table(["KV", "heads", "B", "context", *names, "splash / flashmla"], rows, "lrrr" + "r" * (len(names) + 1))


def _cell(x: dict) -> str:
    return f"{ms(x['ms'])} ({x['tflops']:.0f} TF, {x['kv_gbps']:.0f} GB/s)"


def _provider_lines(summary: dict) -> list[str]:
    lines = []
    for which, picks in (("", summary.get("providers") or {}), (" on the fp8 cache", summary.get("providers_fp8") or {})):
        if picks:
            lines += [f"Decode provider per head count{which} (FlashMLA from the fewest KV tokens, batch x context, "
                      "at which it was faster at every measured point; Triton below): " + "; ".join(
                          f"{h} heads: {_provider(p)}" for h, p in sorted(picks.items(), key=lambda kv: int(kv[0])))
                      + ".", ""]
    return lines


def _provider(pick: dict) -> str:
    start = pick["flashmla_from_kv_tokens"]
    return "Triton everywhere" if start is None else f"FlashMLA from {tokens(start)} tokens"


def _plot(result: Result, ctx: Context, names: list[str]) -> str:
    samples = result["samples"]
    heads = sorted({x["heads"] for x in samples})
    batches = sorted({x["batch"] for x in samples})
    fig, axes = figures.figure(1, len(heads), width=3.2, height=2.6)
    for ax, h in zip(axes[0], heads):
        for n in names:
            for batch in batches:
                pts = _bf16_series(samples, n, h, batch)
                if pts:
                    ax.plot([x["context"] for x in pts], [x["tflops"] for x in pts], marker="o", markersize=3,
                            linewidth=1, linestyle=LINE_STYLES.get(n, "-."), label=f"{n}, B={batch}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{h} heads per rank")
        ax.set_xlabel("context (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("attention TFLOP/s (bf16 cache)")
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    path, name = ctx.image_path(result, "peer-kernels")
    figures.save(fig, path)
    return name


def _bf16_series(samples: list[dict], kernel: str, heads: int, batch: int) -> list[dict]:
    """One kernel's points on the bf16 cache at one head count and batch, by context."""
    return sorted((x for x in samples if x["kernel"] == kernel and x["heads"] == heads and x["batch"] == batch
                   and x.get("kv", "bf16") == "bf16"), key=lambda x: x["context"])
