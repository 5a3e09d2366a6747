"""Peer kernels (``peer_kernels``, ``bench/peer_kernels.py``): SPLASH's MLA decode beside
FlashMLA and SGLang's Triton decode on the same caches, with the ratio to FlashMLA per point
and the decode provider it chose per head count."""

from __future__ import annotations

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, ms, table, tokens


def render(result: Result, ctx: Context) -> list[str]:
    s = result["summary"]
    rates = s.get("rates", {})
    kernels = s["kernels"]
    fp8 = s.get("kernels_fp8", {})
    names = [n for n in kernels if "skipped" not in kernels[n]]
    names += [n for n in fp8 if "skipped" not in fp8[n] and n not in names]
    lines = []
    for label, ks in (("Kernels", kernels), ("On the scaled-fp8 cache (656 bytes a token)", fp8)):
        if ks:
            lines += [f"{label}: " + "; ".join(
                f"`{n}` {k['what']}" + (f" (skipped: {k['skipped']})" if "skipped" in k else
                                        f" ({'correct' if k.get('correct') else 'WRONG'} on the reference case)")
                for n, k in ks.items()) + ".", ""]
    if rates:
        lines += [f"Same run: copy bandwidth {rates['copy_gbps']:.0f} GB/s, bf16 matmul {rates['matmul_tflops']:.0f} "
                  "TFLOP/s.", ""]
    by_point: dict[tuple, dict] = {}
    for x in result["samples"]:
        by_point.setdefault((x.get("kv", "bf16"), x["heads"], x["batch"], x["context"]), {})[x["kernel"]] = x
    rows = []
    for (kv, heads, batch, context), got in sorted(by_point.items()):
        row = [kv, str(heads), str(batch), tokens(context)]
        for n in names:
            x = got.get(n)
            row.append(MISSING if x is None else f"{ms(x['ms'])} ({x['tflops']:.0f} TF, {x['kv_gbps']:.0f} GB/s)")
        flash = got.get("flashmla")
        row.append(MISSING if flash is None or "splash" not in got else f"{got['splash']['ms'] / flash['ms']:.2f}x")
        rows.append(row)
    lines += table(["KV", "heads", "B", "context", *names, "splash / flashmla"], rows,
                   "lrrr" + "r" * (len(names) + 1)) + [""]
    for which, picks in (("", s.get("providers") or {}), (" on the fp8 cache", s.get("providers_fp8") or {})):
        if picks:
            lines += [f"Decode provider per head count{which} (FlashMLA from the fewest KV tokens, batch x context, "
                      "at which it was faster at every measured point; Triton below): " + "; ".join(
                          f"{h} heads: " + ("Triton everywhere" if p["flashmla_from_kv_tokens"] is None else
                                            f"FlashMLA from {tokens(p['flashmla_from_kv_tokens'])} tokens")
                          for h, p in sorted(picks.items(), key=lambda kv: int(kv[0]))) + ".", ""]
    if len(names) > 1:
        lines += [f"![decode TFLOP/s by kernel]({_plot(result, ctx, names)})", ""]
    return lines


def _plot(result: Result, ctx: Context, names: list[str]) -> str:
    heads = sorted({x["heads"] for x in result["samples"]})
    fig, axes = figures.figure(1, len(heads), width=3.2, height=2.6)
    styles = {"splash": "-", "flashmla": "--", "sglang": ":"}
    for ax, h in zip(axes[0], heads):
        for n in names:
            for batch in sorted({x["batch"] for x in result["samples"]}):
                pts = sorted((x for x in result["samples"] if x["kernel"] == n and x["heads"] == h
                              and x["batch"] == batch and x.get("kv", "bf16") == "bf16"), key=lambda x: x["context"])
                if pts:
                    ax.plot([x["context"] for x in pts], [x["tflops"] for x in pts], marker="o", markersize=3,
                            linewidth=1, linestyle=styles.get(n, "-."), label=f"{n}, B={batch}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{h} heads per rank")
        ax.set_xlabel("context (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("attention TFLOP/s (bf16 cache)")
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    path, name = ctx.image_path(result, "peer-kernels")
    figures.save(fig, path)
    return name
