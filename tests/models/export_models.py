"""Exports models BatchPilot did not write, as a user would, for the tests.

Usage: python3 export_models.py OUT_DIR

Writes, with the torch and torchvision of the Python that runs it:
  resnet18_bn_scripted.pt   torchvision resnet18(num_classes=10), BatchNorm, torch.jit.script
  resnet18_bn_traced.pt     the same, torch.jit.trace on a 2x3x32x32 input in training mode
  resnet_gn_scripted.pt     torchvision ResNet (BasicBlock, one block per stage), GroupNorm(8)
  resnet_gn_traced.pt       the same, traced
  transformer_scripted.pt   a small vision transformer (8x8 patches, 4 encoder layers of width
                            256, no dropout): 3.2 million parameters, few activations per sample,
                            the kind of model whose fixed memory dominates; torch.jit.script
  versions.txt              torch and torchvision versions, one per line
"""
import os
import sys
import warnings

import torch
import torchvision
from torchvision.models.resnet import BasicBlock, ResNet

warnings.filterwarnings("ignore")


class PatchTransformer(torch.nn.Module):
    """3x32x32 images as 16 patches of 8x8, a transformer encoder, the mean token to 10 classes."""

    def __init__(self, width: int = 256, layers: int = 4, classes: int = 10):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, width, kernel_size=8, stride=8)
        self.position = torch.nn.Parameter(torch.zeros(1, 16, width))
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, dropout=0.0,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.position
        return self.head(self.encoder(tokens).mean(dim=1))


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

    torch.jit.script(PatchTransformer().train()).save(os.path.join(out, "transformer_scripted.pt"))

    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\ntorchvision {torchvision.__version__}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
