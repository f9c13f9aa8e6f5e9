"""Compares two BatchPilot checkpoints with Python's torch, not with BatchPilot's own reader.

usage: compare_checkpoints.py RESUMED REFERENCE TOLERANCE

A checkpoint file is a 28-byte header (magic, archive length, CRC-32) followed by the archive
LibTorch's torch::serialize::OutputArchive writes, which torch.jit.load reads. Compares every
parameter, buffer and optimizer state tensor (largest absolute difference at most TOLERANCE) and
the trainer's counters (equal). Prints each difference; exit status 0 when they agree, 1 when not.
"""

import io
import sys
import warnings

import torch

# torch 2.x calls torch.jit deprecated; it still reads the archive LibTorch's C++ API writes.
warnings.filterwarnings("ignore", category=FutureWarning)

HEADER_BYTES = 28
MAGIC = b"BATCHPILOT-CKPT\n"
TENSOR_GROUPS = ("parameter", "buffer", "first", "second")
COUNTERS = ("step", "samples_seen", "sampler_epoch", "sampler_position", "optimizer_steps", "target_batch",
            "micro_batch", "loss_scale", "model_name", "optimizer_kind")


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:len(MAGIC)] != MAGIC:
        sys.exit(f"{path}: not a BatchPilot checkpoint")
    length = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    if len(data) != HEADER_BYTES + length:
        sys.exit(f"{path}: {len(data) - HEADER_BYTES} archive bytes, the header says {length}")
    return torch.jit.load(io.BytesIO(data[HEADER_BYTES:]), map_location="cpu")


def main():
    resumed, reference = load(sys.argv[1]), load(sys.argv[2])
    tolerance = float(sys.argv[3])
    problems = []
    compared = 0
    for group in TENSOR_GROUPS:
        count = getattr(reference, group + "count")
        if getattr(resumed, group + "count") != count:
            problems.append(f"{group}: {getattr(resumed, group + 'count')} tensors, reference {count}")
            continue
        for i in range(count):
            a, b = getattr(resumed, f"{group}{i}"), getattr(reference, f"{group}{i}")
            if a.shape != b.shape:
                problems.append(f"{group}{i}: shape {tuple(a.shape)}, reference {tuple(b.shape)}")
                continue
            difference = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
            compared += a.numel()
            if not difference <= tolerance:
                problems.append(f"{group}{i}: differs by {difference:.3g} (tolerance {tolerance:g})")
    for name in COUNTERS:
        a, b = getattr(resumed, name), getattr(reference, name)
        if a != b:
            problems.append(f"{name}: {a}, reference {b}")
    for p in problems:
        print(p)
    print(f"compared {compared} numbers in {sum(getattr(reference, g + 'count') for g in TENSOR_GROUPS)} tensors; "
          f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
