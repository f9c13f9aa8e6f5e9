"""Turns docs/bench/roofline-*.json, threads-*.json and pytorch-*.jsonl (scripts/bench-roofline) into the roofline
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


def load_threads(folder):
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "threads-*.json"))):
        with open(path) as f:
            runs[os.path.basename(path)[len("threads-"):-len(".json")]] = json.load(f)
    return runs


def threads_section(threads):
    out = ["", "### Threads: who uses the CPUs, and which settings train fastest", "",
           "`batchpilot-bench-threads`: the built-in cnn and mlp on synthetic 3×32×32 data, and the cnn on 2048 "
           "image files decoded again for every micro-batch (*cnn-files*: the image cache off), `cpu`, target batch 512 "
           "at micro-batch 64 (8 micro-batches a step), SGD, headless (a Trainer on its own thread, as the CLI runs "
           "it) and in the real main window (offscreen, charts drawn live), with 1 or every CPU's intra-op threads "
           "and the prefetch thread on or off; all combinations interleaved, the order rotated each repetition. "
           "CPU time per thread comes from /proc/self/task over the run's wall time (in cores): *training* is the "
           "trainer thread and LibTorch's intra-op workers, *GUI* the window's thread; latency is the lateness of a "
           "10 ms timer on the GUI thread.", "",
           "| build | model | host | threads | prefetch | samples/s (median, min–max) | training cores | prefetch cores "
           "| GUI cores | GUI latency p50 / p99 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for build, r in sorted(threads.items()):
        for v in r["variants"]:
            latency = (f"{v['latency_p50_ms']:.1f} / {v['latency_p99_ms']:.1f}" if v["host"] == "gui" else "–")
            out.append(f"| {build} | {v['model']} | {v['host']} | {v['threads']} | {'on' if v['prefetch'] else 'off'} | "
                       f"{v['samples_per_second']:,.0f} ({v['samples_per_second_min']:,.0f}–{v['samples_per_second_max']:,.0f}) | "
                       f"{v['cores_training']:.2f} | {v['cores_prefetch']:.3f} | "
                       f"{v['cores_gui']:.2f} | {latency} |")
    out += ["", f"{next(iter(threads.values()))['repetitions']} repetitions per row."]
    return out


def threads_findings(threads):
    """Ratios the defaults were chosen on, from the Debian run (the build scripts/demo uses)."""
    r = threads.get("debian") or next(iter(threads.values()), None)
    if not r:
        return []
    rows = {(v["model"], v["host"], v["threads"], v["prefetch"]): v for v in r["variants"]}
    many = max(v["threads"] for v in r["variants"])
    def ratio(model, host, a, b, key="samples_per_second"):
        return rows[(model, host, a, True)][key] / rows[(model, host, b, True)][key]
    def pre(model, host, t):
        return rows[(model, host, t, True)]["samples_per_second"] / rows[(model, host, t, False)]["samples_per_second"]
    prefetch_share = max(v["cores_prefetch"] for v in r["variants"])
    workloads = sorted({v["model"] for v in r["variants"]})
    ratios = [pre(w, "headless", t) for w in workloads for t in (1, many)]
    low, high, middle = min(ratios), max(ratios), statistics.median(ratios)
    gui_share = [v["cores_gui"] for v in r["variants"] if v["host"] == "gui"]
    return [
        f"- **Threads, headless** ({many} vs 1 intra-op threads): cnn {ratio('cnn', 'headless', many, 1):.2f}×, "
        f"mlp {ratio('mlp', 'headless', many, 1):.2f}× (BLIS runs each GEMM on one thread, so the MLP gains nothing "
        "and pays the parallel elementwise layers' overhead). LibTorch's own default on this 2-vCPU machine is one "
        "thread (it counts physical cores); convolutional models are the common case and gain most, so a run uses "
        "every CPU the process may run on unless `--threads` or `OMP_NUM_THREADS` says otherwise (the test suite sets "
        "`OMP_NUM_THREADS=1`: `ctest -j 2` runs two tests at once, and two runs each on both CPUs wait on each "
        "other's descheduled OpenMP threads — the pip build's suite took 645 s that way and 321 s with one thread "
        "each).",
        f"- **Threads, in the window.** The GUI thread uses {min(gui_share):.2f}–{max(gui_share):.2f} of a core "
        f"drawing the charts; {many} intra-op threads competing with it trained the cnn at "
        f"{ratio('cnn', 'gui', many, 1):.2f}× and the mlp at {ratio('mlp', 'gui', many, 1):.2f}× the speed of 1, and "
        f"the window's median latency went from {rows[('mlp', 'gui', 1, True)]['latency_p50_ms']:.1f} to "
        f"{rows[('mlp', 'gui', many, True)]['latency_p50_ms']:.1f} ms (mlp). So the desktop app leaves one CPU to its "
        "GUI thread (every CPU but one, at least one thread; the About box says how many).",
        f"- **The prefetch thread** uses at most {prefetch_share:.3f} of a core. Prefetch on against off, headless "
        "(samples/s ratio): " + ", ".join(f"{w} {pre(w, 'headless', 1):.2f}× at 1 thread and {pre(w, 'headless', many):.2f}× "
                                          f"at {many}" for w in workloads) + ". "
        + f"Between {low:.2f}× and {high:.2f}×, median {middle:.2f}×, the runs' own spread being of that size. "
        "Where it competes with intra-op threads on every CPU, it takes a core from one of LibTorch's OpenMP "
        "workers and the others wait for it at the end of each parallel region; measured paired against a plain "
        "loop that loads in line (memory parity, 2 threads on 2 CPUs), BatchPilot with the thread trained the mlp "
        "at 0.95 and 0.98 of the loop and without it at 0.98 and 0.99. So a run loads ahead on the prefetch "
        "thread only where a CPU is free for it — fewer intra-op threads than CPUs (`--threads 1` on 2), or a CUDA "
        "device, whose CPUs wait for the GPU — and in line otherwise (`TrainerOptions::prefetch`, Auto; the "
        "desktop app and ranks sharing a machine count the CPUs their window and the other ranks keep busy)."
        + " (This measurement found that the trainer used to request the next micro-batch before taking the "
        "current one, which threw the current one's load away: every micro-batch was loaded twice and the "
        "trainer waited for both. It now requests the next one after taking the current one; "
        "tst_prefetcher checks that each micro-batch is loaded once, ahead.)",
    ]


def g(x):
    return f"{x / 1e9:.1f}"


def section(runs, pytorch, threads):
    out = [START, "", "## Roofline: how far from the machine's limits", ""]
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
    blas_rows = []
    for t in sorted({r["threads"] for r in runs}):
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
    if threads:
        out += threads_section(threads)
    ratios_all = []
    if pytorch:
        out += ["", "### BatchPilot's loop against a plain PyTorch loop", "",
                "The same TorchScript file (exported by the Python torch that matches the build) trained on the same "
                "data — 4096 random 32×32 colour images in 10 class folders, held as bytes and converted to float "
                "and normalised per micro-batch on both sides (BatchPilot's `--data image-folder`) — at micro-batch 128, "
                "target batch 512 (4 micro-batches, loss scaled by n_i/T), SGD with momentum, the same threads; "
                "the two sides run alternately in one session, each first in half the rounds (median samples/s "
                "of steps 3 onwards per run). *Paired* is the median over rounds of BatchPilot / PyTorch within a "
                "round, with its range. Goal: ≥ 1.0, i.e. BatchPilot's probing, accounting and events add nothing.", "",
                "| build | model | torch | rounds | BatchPilot samples/s | PyTorch samples/s | ratio of medians | "
                "paired (min–max) |", "|---|---|---|---|---|---|---|---|"]
        for (build, model), sides in sorted(pytorch.items()):
            if "batchpilot" not in sides or "pytorch" not in sides:
                continue
            bp = statistics.median(r["samples_per_second"] for r in sides["batchpilot"])
            py = statistics.median(r["samples_per_second"] for r in sides["pytorch"])
            by_round = {r["round"]: r["samples_per_second"] for r in sides["pytorch"]}
            paired = [r["samples_per_second"] / by_round[r["round"]] for r in sides["batchpilot"] if r["round"] in by_round]
            ratios_all += paired
            out.append(f"| {build} | {model} | {sides['pytorch'][0].get('torch', '?')} | {len(paired)} | {bp:,.0f} | "
                       f"{py:,.0f} | {bp / py:.2f} | {statistics.median(paired):.2f} ({min(paired):.2f}–{max(paired):.2f}) |")
    out += ["", "### What it says", "",
            "- **BLAS.** Debian's LibTorch on the reference BLAS runs the MLP at a few GFLOP/s; an optimised BLAS "
            "speeds it up by the factor in the BLAS table, and the convolutional models, which go through oneDNN, "
            "hardly change. BLIS (pthreads) is what the scripts install: it beat OpenBLAS (pthreads) on the MLP at "
            "one thread, and OpenBLAS's own threads fight LibTorch's at two (the MLP lost about half its speed), "
            "while BLIS stays single-threaded inside LibTorch's parallel regions unless told otherwise. "
            "PyPI's LibTorch carries Intel MKL, faster again on GEMM.",
            "- **Distance to the limit.** GEMM-bound models (the MLP) reach 40–70% of the machine's peak; the small "
            "convolutional models 20–45%, limited by small channel counts and memory-bound layers (normalisation, "
            "activations), which the allocated-bytes column shows as a tenth or more of the bandwidth.",
            ]
    out += threads_findings(threads)
    if ratios_all:
        above = sum(1 for x in ratios_all if x >= 1.0)
        out.append(f"- **BatchPilot's own loop** against a plain PyTorch loop on the same file and data: the median "
                   f"paired ratio over all builds and models is {statistics.median(ratios_all):.2f}, {above} of "
                   f"{len(ratios_all)} rounds at or above 1.0 (range {min(ratios_all):.2f}–{max(ratios_all):.2f}, "
                   "about the spread of one side's own rounds on this shared 2-vCPU machine). Probing, memory "
                   "accounting, events and the exact accumulation cost nothing this machine can resolve; the "
                   "prefetch thread (on in these runs) loads the next micro-batch while the plain loop loads it in line. (An earlier "
                   "version of this comparison gave the plain loop a pre-generated float pool while BatchPilot "
                   "generated its synthetic samples: the MLP's 0.92 there was that data work, not the loop.)")
    out += ["", END]
    return "\n".join(out) + "\n"


def main():
    folder, performance = sys.argv[1], sys.argv[2]
    text = section(load_rooflines(folder), load_pytorch(folder), load_threads(folder))
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
