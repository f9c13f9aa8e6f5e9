"""Exports models BatchPilot did not write, as a user would, for the tests.

Usage: python3 export_models.py OUT_DIR

Writes, with the torch and torchvision of the Python that runs it:
  resnet18_bn_scripted.pt   torchvision resnet18(num_classes=10), BatchNorm, torch.jit.script
  resnet18_bn_traced.pt     the same, torch.jit.trace on a 2x3x32x32 input in training mode
  resnet_gn_scripted.pt     torchvision ResNet (BasicBlock, one block per stage), GroupNorm(8)
  resnet_gn_traced.pt       the same, traced
  versions.txt              torch and torchvision versions, one per line
"""
import os
import sys
import warnings

import torch
import torchvision
from torchvision.models.resnet import BasicBlock, ResNet

warnings.filterwarnings("ignore")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    example = torch.randn(2, 3, 32, 32)

    bn = torchvision.models.resnet18(num_classes=10).train()
    torch.jit.script(bn).save(os.path.join(out, "resnet18_bn_scripted.pt"))
    torch.jit.trace(bn, example, check_trace=False).save(os.path.join(out, "resnet18_bn_traced.pt"))

    gn = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, norm_layer=lambda c: torch.nn.GroupNorm(8, c)).train()
    torch.jit.script(gn).save(os.path.join(out, "resnet_gn_scripted.pt"))
    torch.jit.trace(gn, example, check_trace=False).save(os.path.join(out, "resnet_gn_traced.pt"))

    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\ntorchvision {torchvision.__version__}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
