#!/usr/bin/env python3
"""Draw a `kiln-bench gemm --json` report: per shape, achieved bandwidth and
throughput against M, one line per kiln format and per peer, with the
ceilings: the measured copy bandwidth, and BF16 and FP8 peak TFLOP/s (given
here, or in the report, or else the best cuBLAS / cuBLASLt row measured).

usage: python3 bench/plot.py REPORT.json -o OUT.png [--peak-bf16 T] [--peak-fp8 T]
"""
import argparse
import json
import sys

PEER_LABELS = {
    "bf16_cublas": "cuBLAS bf16",
    "fp8_tensor": "cuBLASLt fp8",
    "fp8_block": "cuBLASLt fp8 block",
}


def series_name(row):
    if row.get("kind") == "kiln":
        return "kiln " + row.get("format", "?")
    return PEER_LABELS.get(row.get("kind"), row.get("kind", "?"))


def timed(row):
    # Reports from older tools have no status; a row with an error has no time.
    return row.get("us") and row.get("status", "ok") == "ok"


def best_tflops(rows, kinds):
    values = [r["tflops"] for r in rows if r.get("kind") in kinds and r.get("tflops")]
    return max(values) if values else None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="the JSON written by kiln-bench gemm --json")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--peak-bf16", type=float, help="BF16 TFLOP/s ceiling")
    ap.add_argument("--peak-fp8", type=float, help="FP8 TFLOP/s ceiling")
    args = ap.parse_args(argv)

    try:
        with open(args.report) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{args.report}: {e}")
    rows = [r for r in report.get("rows", []) if timed(r)]
    if not rows:
        sys.exit(f"{args.report}: no timed rows to draw")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy = report.get("copy_TBps")
    peak_bf16 = (args.peak_bf16 or report.get("peak_bf16_tflops")
                 or best_tflops(rows, {"bf16_cublas"}))
    peak_fp8 = (args.peak_fp8 or report.get("peak_fp8_tflops")
                or best_tflops(rows, {"fp8_tensor", "fp8_block"}))

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(series_name(r) for r in rows))
    colors = plt.get_cmap("tab20")
    style = {n: colors(i % 20) for i, n in enumerate(names)}

    fig, axes = plt.subplots(len(shapes), 2, figsize=(14, 4.2 * len(shapes)), squeeze=False)
    for (bw, tf), shape in zip(axes, shapes):
        mine = [r for r in rows if r["shape"] == shape]
        for name in names:
            pts = sorted((r["M"], r["TBps"], r["tflops"]) for r in mine if series_name(r) == name)
            if not pts:
                continue
            ms = [p[0] for p in pts]
            peer = not name.startswith("kiln ")
            kw = dict(color=style[name], marker="s" if peer else "o", markersize=4,
                      linestyle="--" if peer else "-", linewidth=2 if peer else 1.3, label=name)
            bw.plot(ms, [p[1] for p in pts], **kw)
            tf.plot(ms, [p[2] for p in pts], **kw)
        if copy:
            bw.axhline(copy, color="black", linestyle=":", label=f"copy {copy:.2f} TB/s")
        if peak_bf16:
            tf.axhline(peak_bf16, color="dimgray", linestyle=":", label=f"bf16 {peak_bf16:.0f} TFLOP/s")
        if peak_fp8:
            tf.axhline(peak_fp8, color="black", linestyle="-.", label=f"fp8 {peak_fp8:.0f} TFLOP/s")
        n, k = mine[0]["N"], mine[0]["K"]
        bw.set_title(f"{shape} (N={n}, K={k}): achieved bandwidth")
        tf.set_title(f"{shape} (N={n}, K={k}): throughput")
        bw.set_ylabel("TB/s (weights + activations + output)")
        tf.set_ylabel("TFLOP/s")
        tf.set_yscale("log")
        for ax in (bw, tf):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M (tokens)")
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = {}, []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in handles:
                handles[l] = h
                labels.append(l)
    fig.legend([handles[l] for l in labels], labels, loc="lower center",
               ncol=min(6, len(labels)), bbox_to_anchor=(0.5, 0.0))
    device = report.get("device", "")
    fig.suptitle(f"kiln-bench gemm on {device}" if device else "kiln-bench gemm")
    fig.tight_layout(rect=(0, 0.04 + 0.012 * (len(labels) // 6), 1, 0.98))
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
