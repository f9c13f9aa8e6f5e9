"""A plain PyTorch training loop, the reference BatchPilot's own loop is compared with.

Usage:
  pytorch_loop.py export OUT_DIR
      writes smallnet.pt (the SmallNet of docs/guide/own-model-and-data.md: convolutions and GroupNorm) and mlp.pt
      (3072-512-512-10) for 3x32x32 inputs and 10 classes, scripted with this Python's torch,
      and images/: 4096 random 32x32 colour images (binary PPM) in 10 class folders, the data
      both loops train on (BatchPilot reads it with --data image-folder)
  pytorch_loop.py train MODEL.pt --data OUT_DIR/images --micro M --target T --steps N --threads K
      trains MODEL.pt as BatchPilot does with a fixed micro-batch: T samples per optimizer step
      as T/M micro-batches, loss scaled by n_i/T, SGD with momentum 0.9 and lr 0.01, on the CPU;
      the images are held as bytes and each micro-batch is converted to float and normalised as
      BatchPilot's image folder does (/255, ImageNet mean and deviation); prints one JSON line
      with the median samples/s of steps 3..N.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Mlp(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


IMAGES, CLASSES, SIDE = 4096, 10, 32
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)  # BatchPilot's ImageFolderDataset::kMean
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)   # and kStd


def export(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.jit.script(SmallNet()).save(os.path.join(out, "smallnet.pt"))
    torch.jit.script(Mlp()).save(os.path.join(out, "mlp.pt"))
    pixels = torch.randint(0, 256, (IMAGES, SIDE, SIDE, 3), dtype=torch.uint8)
    header = f"P6\n{SIDE} {SIDE}\n255\n".encode()
    for i in range(IMAGES):
        folder = os.path.join(out, "images", f"class{i % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:05d}.ppm"), "wb") as f:
            f.write(header + bytes(pixels[i].flatten().tolist()))


def load_images(folder: str):
    """The images as uint8 [N, 3, H, W] and their class indices (folders in sorted order)."""
    classes = sorted(os.listdir(folder))
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(folder, name))):
            data = open(os.path.join(folder, name, file), "rb").read()
            header = f"P6\n{SIDE} {SIDE}\n255\n".encode()
            assert data.startswith(header), f"{file}: not a {SIDE}x{SIDE} binary PPM written by export"
            pixels = torch.frombuffer(bytearray(data[len(header):]), dtype=torch.uint8)
            images.append(pixels.view(SIDE, SIDE, 3).permute(2, 0, 1))
            labels.append(label)
    return torch.stack(images), torch.tensor(labels)


def train(path: str, data: str, micro: int, target: int, steps: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = torch.jit.load(path)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pool, labels = load_images(data)
    order = torch.randperm(len(pool))
    position = 0
    rates = []
    for _ in range(steps):
        start = time.perf_counter()
        done = 0
        while done < target:
            n = min(micro, target - done)
            if position + n > len(pool):
                order = torch.randperm(len(pool))
                position = 0
            index = order[position:position + n]
            position += n
            x = pool[index].float().div_(255.0).sub_(MEAN).div_(STD)
            y = labels[index]
            loss = F.cross_entropy(model(x), y) * (n / target)
            loss.backward()
            done += n
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        rates.append(target / (time.perf_counter() - start))
    return {"model": os.path.basename(path), "micro_batch": micro, "target_batch": target, "threads": threads,
            "torch": torch.__version__, "samples_per_second": statistics.median(rates[2:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("out")
    t = sub.add_parser("train")
    t.add_argument("model")
    t.add_argument("--data", required=True)
    t.add_argument("--micro", type=int, required=True)
    t.add_argument("--target", type=int, required=True)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    if args.command == "export":
        export(args.out)
    else:
        print(json.dumps(train(args.model, args.data, args.micro, args.target, args.steps, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
