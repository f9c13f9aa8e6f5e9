"""Turns docs/bench/roofline-*.json and pytorch-*.jsonl (scripts/bench-roofline) into the roofline
section of docs/PERFORMANCE.md, between the markers <!-- roofline --> and <!-- /roofline -->
(appended when they are missing), and writes the same section to docs/bench/roofline.md.

Usage: roofline_report.py BENCH_DIR PERFORMANCE_MD
"""
import glob
import json
import os
import statistics
import sys

START, END = "<!-- roofline -->", "<!-- /roofline -->"


def load_rooflines(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "roofline-*.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def load_pytorch(folder):
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder, "pytorch-*.jsonl"))):
        build = os.path.basename(path)[len("pytorch-"):-len(".jsonl")]
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    rows.setdefault((build, row["model"]), {}).setdefault(row["side"], []).append(row)
    return rows


def g(x):
    return f"{x / 1e9:.1f}"


def section(runs, pytorch):
    out = [START, "## Roofline: how far from the machine's limits", ""]
    out.append("Measured by `scripts/bench-roofline` (once per LibTorch build; the Debian build with each BLAS "
               "chosen through `LD_LIBRARY_PATH` for its run alone). Peaks are what LibTorch itself reaches on "
               "this machine: a float32 1024×1024 GEMM, a 3×3 convolution layer (32×64×32×32 input, 64 filters), "
               "and a 256 MiB copy (bytes read + written). Each model trains on 3×32×32 synthetic images at "
               "micro-batch = target batch = 512 with SGD; FLOPs are those of its matrix multiplies and "
               "convolutions, forward and backward, counted from the operators' shapes (RecordFunction); "
               "*allocated* is the bytes the step allocates, a lower bound on its memory traffic (each byte is "
               "written at least once). Median of steps 3 onwards.")
    out += ["", "### Peaks", "", "| build, BLAS, threads | GEMM GFLOP/s | conv GFLOP/s | copy GB/s |", "|---|---|---|---|"]
    for r in runs:
        p = r["peaks"]
        out.append(f"| {r['label']} ({r['blas']}) | {g(p['gemm_flops_per_second'])} | {g(p['conv_flops_per_second'])} | "
                   f"{g(p['bandwidth_bytes_per_second'])} |")
    # The machine's compute peak at a thread count: the best rate LibTorch reached in any of the
    # micro-benchmarks at that count, whichever build or BLAS (a slow BLAS's GEMM is not the
    # machine's limit). Bandwidth likewise.
    peak = {}
    bandwidth = {}
    for r in runs:
        p = r["peaks"]
        peak[r["threads"]] = max(peak.get(r["threads"], 0), p["gemm_flops_per_second"], p["conv_flops_per_second"])
        bandwidth[r["threads"]] = max(bandwidth.get(r["threads"], 0), p["bandwidth_bytes_per_second"])
    out += ["", "The machine's peak at a thread count is the best rate any of these micro-benchmarks reached at that "
            "count, in any build: " + ", ".join(f"{g(v)} GFLOP/s and {g(bandwidth[t])} GB/s at {t} thread{'s' if t > 1 else ''}"
                                                 for t, v in sorted(peak.items())) + "."]
    out += ["", "### Each model against the machine's peak at the same thread count", "",
            "| build, BLAS, threads | model | samples/s | GFLOP per step | GFLOP/s | of peak FLOP/s | "
            "allocated GB/s | of peak bandwidth |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for m in r["models"]:
            out.append(f"| {r['label']} | {m['model']} | {m['samples_per_second']:,.0f} | {m['flops_per_step'] / 1e9:.2f} | "
                       f"{g(m['flops_per_second'])} | {100 * m['flops_per_second'] / peak[r['threads']]:.0f}% | "
                       f"{g(m['allocated_bytes_per_second'])} | "
                       f"{100 * m['allocated_bytes_per_second'] / bandwidth[r['threads']]:.0f}% |")
    # BLAS side by side in the Debian build.
    by_label = {r["label"]: r for r in runs}
    threads = sorted({r["threads"] for r in runs})
    blas_rows = []
    for t in threads:
        ref = by_label.get(f"debian-reference-t{t}")
        if not ref:
            continue
        for name in ("openblas", "blis"):
            other = by_label.get(f"debian-{name}-t{t}")
            if not other:
                continue
            for mr, mo in zip(ref["models"], other["models"]):
                blas_rows.append(f"| {t} | {mr['model']} | {mr['samples_per_second']:,.0f} | {other['blas']} | "
                                 f"{mo['samples_per_second']:,.0f} | {mo['samples_per_second'] / mr['samples_per_second']:.2f}× |")
    if blas_rows:
        out += ["", "### BLAS for Debian's LibTorch (samples/s, one run)", "",
                "| threads | model | reference BLAS | optimised | samples/s | speed-up |", "|---|---|---|---|---|---|"]
        out += blas_rows
    if pytorch:
        out += ["", "### BatchPilot's loop against a plain PyTorch loop", "",
                "The same TorchScript file (exported by the Python torch that matches the build), micro-batch 128, "
                "target batch 512 (4 micro-batches, loss scaled by n_i/T), SGD with momentum, the same threads, "
                "run alternately in one session (2 rounds each, median samples/s of steps 3 onwards; the ratio "
                "is of the medians). Goal: ≥ 1.0, i.e. BatchPilot's probing, accounting and events add nothing.", "",
                "| build | model | torch | BatchPilot samples/s | PyTorch samples/s | BatchPilot / PyTorch |",
                "|---|---|---|---|---|---|"]
        for (build, model), sides in sorted(pytorch.items()):
            if "batchpilot" not in sides or "pytorch" not in sides:
                continue
            bp = statistics.median(r["samples_per_second"] for r in sides["batchpilot"])
            py = statistics.median(r["samples_per_second"] for r in sides["pytorch"])
            out.append(f"| {build} | {model} | {sides['pytorch'][0].get('torch', '?')} | {bp:,.0f} | {py:,.0f} | {bp / py:.2f} |")
    out += ["", "### What it says", "",
            "- **BLAS.** Debian's LibTorch on the reference BLAS runs the MLP at a few GFLOP/s; an optimised BLAS "
            "speeds it up by the factor in the BLAS table, and the convolutional models, which go through oneDNN, "
            "hardly change. BLIS (pthreads) is what the scripts install: it beat OpenBLAS (pthreads) on the MLP at "
            "one thread, and OpenBLAS's own threads fight LibTorch's at two (the MLP lost about half its speed), "
            "while BLIS stays single-threaded inside LibTorch's parallel regions unless told otherwise. "
            "PyPI's LibTorch carries Intel MKL, faster again on GEMM.",
            "- **Threads.** LibTorch's default on this 2-vCPU machine is one thread (it counts physical cores); two "
            "threads train the convolutional models 1.5–1.7× faster, so BatchPilot uses every CPU the process may "
            "run on unless `--threads` says otherwise.",
            "- **Distance to the limit.** GEMM-bound models (the MLP) reach 40–70% of the machine's peak; the small "
            "convolutional models 20–45%, limited by small channel counts and memory-bound layers (normalisation, "
            "activations), which the allocated-bytes column shows as a tenth or more of the bandwidth.",
            "- **BatchPilot's own loop** is within run-to-run noise of a plain PyTorch loop on the same file "
            "(0.92–1.01 in the table, which moves by ±10% between rounds on this shared machine)."]
    out += ["", END]
    return "\n".join(out) + "\n"


def main():
    folder, performance = sys.argv[1], sys.argv[2]
    text = section(load_rooflines(folder), load_pytorch(folder))
    with open(os.path.join(folder, "roofline.md"), "w") as f:
        f.write(text)
    existing = open(performance).read() if os.path.exists(performance) else ""
    if START in existing and END in existing:
        head, rest = existing.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        updated = head + text + ("\n" + tail if tail else "")
    else:
        updated = existing.rstrip("\n") + "\n\n" + text
    with open(performance, "w") as f:
        f.write(updated)
    print(f"wrote the roofline section of {performance}")


if __name__ == "__main__":
    main()
