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

# The same fragmentation under a limit: with 64 MiB allowed above what is reserved now, the 20 MiB
# request needs a third segment, the two cached ones are split (nothing to release), so the
# allocator raises an OOM with 32 MiB allocated, "Tried to allocate 20.00 MiB" (the model's
# fragmentation OOM, tests/core/memory/tst_caching_allocator.cpp).
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 64 * MiB) / total, 0)
a, b = block(30 * MiB), block(30 * MiB)
del a, b
c, d = block(16 * MiB), block(16 * MiB)
try:
    e = block(20 * MiB)
    print("20 MiB after two split 30 MiB segments under a 64 MiB limit: allocated (the model: OOM) DIFFERS")
    failures.append("the fragmentation OOM under a limit")
    del e
except torch.OutOfMemoryError as error:
    text = str(error)
    tried = "Tried to allocate 20.00 MiB" in text
    print(f"20 MiB after two split 30 MiB segments under a 64 MiB limit: OOM with "
          f"{torch.cuda.memory_allocated() / MiB:.0f} MiB allocated, "
          f"{'says' if tried else 'does NOT say'} 'Tried to allocate 20.00 MiB' (the model: OOM, 32 MiB) "
          f"{'ok' if tried and torch.cuda.memory_allocated() == 32 * MiB else 'DIFFERS'}")
    print("  PyTorch's text: " + text.splitlines()[0][:400])
    if not tried or torch.cuda.memory_allocated() != 32 * MiB:
        failures.append("the fragmentation OOM under a limit")
del c, d
torch.cuda.set_per_process_memory_fraction(1.0, 0)
fresh()

# What the presets add outside the tensors (core/memory/gpu_presets.h): the CUDA context and the
# math libraries, which the allocator does not see, and cuBLAS's workspace, taken through the
# allocator at the first matrix product (the presets: 8,519,680 B; 32 MiB from compute capability
# 9.0). Measured on an H200: 527, 595 and 765 MiB at the three points below.
def outside():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / MiB


print(f"outside the allocator, the CUDA context: {outside():.0f} MiB")
major, minor = torch.cuda.get_device_capability(0)
before = torch.cuda.memory_reserved()
x = torch.randn(256, 256, device=dev)
y = x @ x
torch.cuda.synchronize()
workspace = torch.cuda.memory_reserved() - before - 2 * MiB  # less the small pool's segment of x and y
want = 32 * MiB if major >= 9 else 8519680
check(f"cuBLAS workspace at the first matrix product (compute capability {major}.{minor})", workspace, want)
del x, y
print(f"outside the allocator after the first matrix product: {outside():.0f} MiB")
images = torch.randn(8, 3, 64, 64, device=dev, requires_grad=True)
conv, linear = torch.nn.Conv2d(3, 16, 3).to(dev), torch.nn.Linear(64, 64).to(dev)
(conv(images).sum() + linear(torch.randn(8, 64, device=dev)).sum()).backward()
print(f"outside the allocator after a convolution's and a linear layer's forward and backward "
      f"(cuDNN loaded): {outside():.0f} MiB (the presets: 765 MiB on compute capability 9.x)")
del images, conv, linear
fresh()
if failures:
    print("differs from the model: " + "; ".join(failures))
    sys.exit(1)
print("every sequence reserved what the model reserves")
