"""Writes edited copies of a BatchPilot checkpoint with Python's torch, not with BatchPilot's writer.

usage: edit_checkpoint.py SOURCE EDITS

SOURCE is a checkpoint.pt; EDITS a JSON file mapping each copy's path to the fields to change, as
a person editing the file by hand would:

    {"out/a/checkpoint.pt": {"step": -1, "learning_rate": "nan"},
     "out/b/checkpoint.pt": {"parameter0": {"dtype": "int64"}, "parametercount": 1000000000}}

A number or a string sets the field (a string for a number field is read as a float: "nan",
"inf"); an object changes a tensor: {"dtype": "int64"} converts it, {"shape": [3]} replaces it
with zeros of that shape, {"fill": -1} sets every element ("nan" and "inf" too). Each copy gets
BatchPilot's 28-byte header (magic, archive length, CRC-32) over the archive torch.jit.save
writes, so that it passes the checksum and is judged by its fields alone. An empty object copies
the checkpoint unchanged (through torch.jit.save all the same).
"""

import io
import json
import os
import sys
import warnings
import zlib

import torch

# torch 2.x calls torch.jit deprecated; it still reads and writes the archive LibTorch's C++ API uses.
warnings.filterwarnings("ignore", category=FutureWarning)

HEADER_BYTES = 28
MAGIC = b"BATCHPILOT-CKPT\n"


def number(value):
    return float(value) if isinstance(value, str) else value


def edited_tensor(tensor, change):
    if "dtype" in change:
        tensor = tensor.to(getattr(torch, change["dtype"]))
    if "shape" in change:
        tensor = torch.zeros(change["shape"], dtype=tensor.dtype)
    if "fill" in change:
        tensor = tensor.clone().fill_(number(change["fill"]))
    return tensor


def main():
    source, edits_path = sys.argv[1], sys.argv[2]
    with open(source, "rb") as f:
        data = f.read()
    if data[:len(MAGIC)] != MAGIC:
        sys.exit(f"{source}: not a BatchPilot checkpoint")
    with open(edits_path) as f:
        edits = json.load(f)
    for target, fields in edits.items():
        module = torch.jit.load(io.BytesIO(data[HEADER_BYTES:]), map_location="cpu")
        for name, value in fields.items():
            current = getattr(module, name)
            if isinstance(value, dict):
                value = edited_tensor(current, value)
            elif isinstance(current, float):
                value = float(number(value))
            setattr(module, name, value)
        archive = io.BytesIO()
        torch.jit.save(module, archive)
        payload = archive.getvalue()
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(MAGIC + len(payload).to_bytes(8, "little") + zlib.crc32(payload).to_bytes(4, "little") + payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
