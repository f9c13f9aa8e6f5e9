"""The virtual GPU's caching-allocator rules, checked on a real GPU.

Runs the allocation sequences of tests/core/memory/tst_caching_allocator.cpp on cuda:0 with
PyTorch's own allocator and compares torch.cuda.memory_reserved()/memory_allocated() with the
figures the model is tested against (worked out by hand from c10/cuda/CUDACachingAllocator.cpp).
Exit 1 naming each sequence whose figures differ. Used by scripts/gpu-check.
"""
import sys

import torch

MiB = 1 << 20
dev = torch.device("cuda:0")
failures = []


def fresh():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def block(nbytes):
    return torch.empty(int(nbytes), dtype=torch.uint8, device=dev)


def check(name, got, want):
    status = "ok" if got == want else "DIFFERS"
    print(f"{name}: {got / MiB:.3f} MiB (the model: {want / MiB:.3f} MiB) {status}")
    if got != want:
        failures.append(name)


fresh()
base = torch.cuda.memory_reserved()
# Segment sizes for single requests (reserved above what was reserved before).
for request, segment in [(1, 2 * MiB), (MiB, 2 * MiB), (MiB + 1, 20 * MiB), (19 * MiB // 2, 20 * MiB),
                         (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB), (25 * MiB, 26 * MiB)]:
    fresh()
    t = block(request)
    check(f"segment for {request} B", torch.cuda.memory_reserved() - base, segment)
    del t

# The devlog's order example: 8 x 16 MiB freed, then 4 x 32 MiB: 256 MiB; the reverse: 128 MiB.
fresh()
ts = [block(16 * MiB) for _ in range(8)]
del ts
ts = [block(32 * MiB) for _ in range(4)]
check("8 x 16 MiB freed, then 4 x 32 MiB", torch.cuda.memory_reserved() - base, 256 * MiB)
del ts
fresh()
ts = [block(32 * MiB) for _ in range(4)]
del ts
ts = [block(16 * MiB) for _ in range(8)]
check("4 x 32 MiB freed, then 8 x 16 MiB", torch.cuda.memory_reserved() - base, 128 * MiB)
del ts

# Fragmentation: 2 x 30 MiB freed, 2 x 16 MiB split them; a 20 MiB request needs a new segment
# (the model: with a 64 MiB budget that is an OOM with 32 MiB allocated).
fresh()
a, b = block(30 * MiB), block(30 * MiB)
del a, b
c, d = block(16 * MiB), block(16 * MiB)
check("two 16 MiB blocks split from two cached 30 MiB segments", torch.cuda.memory_reserved() - base, 60 * MiB)
check("  allocated", torch.cuda.memory_allocated(), 32 * MiB)
del c, d
fresh()
if failures:
    print("differs from the model: " + "; ".join(failures))
    sys.exit(1)
print("every sequence reserved what the model reserves")
