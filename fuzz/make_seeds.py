#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<harness>/: small valid (and a few nearly valid) inputs
for each libFuzzer harness, so that fuzzing starts deep inside each format. Files named
regress-* (inputs that once crashed a harness) are kept.

    fuzz/make_seeds.py [--checkpoint FILE]

Images are encoded here by hand (PNG, BMP, PGM/PPM, TGA, GIF) and JPEG with torchvision when it
can be imported. The checkpoint seed is a file written by batchpilot-cli (scripts/fuzz makes it:
--model mlp --width 8 --image-size 1x4x4 --classes 2 --samples 8, the model fuzz_checkpoint loads into).
Inputs of the harnesses that use FuzzedDataProvider are encoded the way it reads them: strings
from the front, numbers from the back.
"""
import argparse
import gzip
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


class Provider:
    """Builds bytes that LLVM's FuzzedDataProvider reads back as the values given, in order."""

    def __init__(self):
        self.front = bytearray()
        self.back = bytearray()  # in the order consumed; stored reversed at the end

    def integral(self, value, low, high):
        span, shift, chunk = high - low, 0, []
        value -= low
        while shift < 64 and (span >> shift) > 0:
            chunk.append(0)
            shift += 8
        # FuzzedDataProvider: result = (result << 8) | next byte from the end, most significant first.
        for i in range(len(chunk)):
            chunk[i] = (value >> (8 * (len(chunk) - 1 - i))) & 0xFF
        self.back += bytes(chunk)

    def boolean(self, value):
        self.integral(1 if value else 0, 0, 255)

    def string(self, data):
        self.front += data.replace(b"\\", b"\\\\") + b"\\x"

    def remaining(self, data):
        assert not self.back, "remaining bytes must come last and alone"
        self.front += data

    def bytes(self):
        return bytes(self.front) + bytes(reversed(self.back))


def write(harness, name, data):
    folder = os.path.join(CORPUS, harness)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# --- images ------------------------------------------------------------------------------------

def pixels(width, height, channels):
    return bytes(((x * 37 + y * 91 + c * 53) & 0xFF) for y in range(height) for x in range(width) for c in range(channels))


def png(width, height, channels):
    color = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    raw = pixels(width, height, channels)
    rows = b"".join(b"\x00" + raw[y * width * channels:(y + 1) * width * channels] for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def bmp(width, height):
    stride = (width * 3 + 3) & ~3
    rows = b"".join(pixels(width, 1, 3) + b"\x00" * (stride - width * 3) for _ in range(height))
    header = struct.pack("<2sIHHI", b"BM", 54 + len(rows), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return header + info + rows


def pnm(width, height, channels):
    kind = b"P5" if channels == 1 else b"P6"
    return kind + b"\n%d %d\n255\n" % (width, height) + pixels(width, height, channels)


def tga(width, height):
    return struct.pack("<BBBHHBHHHHBB", 0, 0, 2, 0, 0, 0, 0, 0, width, height, 24, 0) + pixels(width, height, 3)


def gif(width, height):
    # 2-colour global palette, one image, LZW minimum code size 2: clear, four pixels, end.
    header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    data = b"\x02\x02\x44\x01\x00"  # a tiny LZW stream (clear code, a pixel, end)
    return header + image + data + b"\x3b"


def jpeg(width, height):
    try:
        import torch
        from torchvision.io import encode_jpeg
    except ImportError:
        return None
    image = torch.tensor(list(pixels(width, height, 3)), dtype=torch.uint8).reshape(height, width, 3).permute(2, 0, 1)
    return bytes(encode_jpeg(image.contiguous(), quality=80).tolist())


def images():
    out = {"a.png": png(5, 4, 3), "grey.png": png(3, 3, 1), "rgba.png": png(4, 2, 4), "b.bmp": bmp(3, 2),
           "c.pgm": pnm(4, 3, 1), "d.ppm": pnm(2, 2, 3), "e.tga": tga(3, 3), "f.gif": gif(2, 2)}
    photo = jpeg(6, 5)
    if photo is not None:
        out["g.jpg"] = photo
    return out


# --- IDX -----------------------------------------------------------------------------------------

def idx_labels(labels):
    return struct.pack(">II", 0x00000801, len(labels)) + bytes(labels)


def idx_images(count, rows, cols):
    return struct.pack(">IIII", 0x00000803, count, rows, cols) + pixels(cols, rows * count, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a checkpoint.pt written by batchpilot-cli for the checkpoint seeds")
    args = parser.parse_args()
    for harness in ("byte_size", "device_spec", "csv", "mnist", "mnist_gz", "image_decode", "image_folder",
                    "run_config", "event_stream") + (("checkpoint",) if args.checkpoint else ()):
        # Seeds are rewritten; regression inputs (regress-*, crashes found by fuzzing) are kept.
        folder = os.path.join(CORPUS, harness)
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if not name.startswith("regress-"):
                os.remove(os.path.join(folder, name))

    for i, text in enumerate(["64MiB", "1.5 GiB", "512", "12KB", "0", "2 kib", "8EiB", "-1MiB", "1e3MB", "9223372036854775807"]):
        write("byte_size", f"seed{i}", text.encode())
    for i, text in enumerate(["cpu", "cuda:0", "cuda:1", "virtual:64MiB", "virtual:1.5GiB", "virtual:", "cuda:-1", "CPU"]):
        write("device_spec", f"seed{i}", text.encode())

    write("csv", "classes.csv", b"a,b,y\n1,2,0\n3,4,1\n5,6,2\n")
    write("csv", "names.csv", b'x,"a, b",y\n0.5,1e3,cat\n-1,2,"dog"\n\n2,NaN,cat\n')
    write("csv", "signed.csv", b"y,f\n-1,0.25\n1,0.5\n-1,0.75\n")
    write("csv", "regression.csv", b"f1,f2,y\n1,2,0.5\n2,3,1.5\n3,4,2.5\n")
    write("csv", "crlf.csv", b"y,a\r\n0,1\r\n1,2\r\n")

    labels, images_file = idx_labels([0, 1, 2, 1]), idx_images(4, 3, 3)
    for name, (lab, img) in {"valid": (labels, images_file),
                             "short_images": (labels, images_file[:-3]),
                             "count_mismatch": (idx_labels([0, 1]), images_file)}.items():
        seed = Provider()
        seed.string(lab)
        seed.remaining(img)
        write("mnist", name, seed.bytes())

    write("mnist_gz", "valid.gz", gzip.compress(idx_images(4, 3, 3)))
    write("mnist_gz", "plain", idx_images(4, 3, 3))
    write("mnist_gz", "two_members.gz", gzip.compress(idx_images(4, 3, 3)[:20]) + gzip.compress(idx_images(4, 3, 3)[20:]))

    for name, data in images().items():
        write("image_decode", name, bytes([0x35]) + data)  # RGB, resized to 5x6

    # fuzz_image_folder reads: channels, height, width, cache, classes; per class a name, a file
    # count, per file: nested?, file name, extension, bytes.
    pictures = list(images().items())
    for seed_index in range(3):
        seed = Provider()
        seed.boolean(seed_index != 1)
        seed.integral(4, 1, 12)
        seed.integral(5, 1, 12)
        seed.boolean(seed_index != 2)
        seed.integral(2, 0, 3)
        extensions = [".png", ".jpg", ".bmp", ".gif", ".tga", ".pgm", ".ppm", ".JPEG", ".txt", ""]
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789._-"
        for c in range(2):
            def name(text):
                seed.integral(len(text), 1, 12)
                for ch in text:
                    seed.integral(alphabet.index(ch), 0, len(alphabet) - 1)
            name(f"class{c}")
            seed.integral(2, 0, 3)
            for f in range(2):
                file_name, data = pictures[(seed_index * 4 + c * 2 + f) % len(pictures)]
                nested = f == 1 and seed_index == 0
                seed.boolean(nested)
                if nested:
                    name("sub")
                name(f"img{f}")
                ext = "." + file_name.split(".")[1]
                seed.integral(extensions.index(ext if ext in extensions else ".png"), 0, len(extensions) - 1)
                seed.string(data)
        write("image_folder", f"seed{seed_index}", seed.bytes())

    readme = {"model": {"name": "cnn", "norm": "group", "width": 32},
              "data": {"name": "synthetic", "samples": 4096, "image_size": [3, 32, 32], "classes": 10, "seed": 1},
              "device": "virtual:512MiB", "target_batch": 4096,
              "probe": {"initial_micro_batch": 1, "max_micro_batch": 0, "headroom": 0.05, "multiple_of": 8,
                        "max_trials": 24, "tolerance": 0.02},
              "optimizer": {"kind": "adam", "learning_rate": 0.001, "momentum": 0.9, "weight_decay": 0,
                            "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
              "steps": 200, "epochs": 0, "seed": 0, "lr_scaling": "linear", "regrow_after_steps": 20, "threads": 0,
              "checkpoint": {"directory": "runs/demo", "every_steps": 50}}
    write("run_config", "readme.json", json.dumps(readme, indent=1).encode())
    write("run_config", "csv.json", json.dumps({"model": {"name": "mlp"}, "data": {"name": "csv", "path": "d.csv",
                                               "target_column": "y", "regression": True}, "target_batch": 64}).encode())
    write("run_config", "comments.json", b'// a run\n{"steps": 10, /* few */ "device": "cpu", "model": {"name": "resnet", "norm": "batch"}}')
    write("run_config", "empty.json", b"{}")

    # The event stream of --serve: records of an id and an event's line, a comment that keeps the
    # connection alive, a record sent again, one without an id, one longer than the harness's most
    # (512 bytes), and a cut record at the end.
    with open(os.path.join(CORPUS, "events", "run.jsonl"), "rb") as f:
        lines = [line for line in f.read().split(b"\n") if line][:12]
    stream = b"".join(b"id: %d\ndata: %s\n\n" % (i + 1, line) for i, line in enumerate(lines[:6]))
    write("event_stream", "records", stream)
    write("event_stream", "hostile", stream + b": keep-alive\n\n" + b"id: 3\ndata: " + lines[2] + b"\n\n" +
          b"data: " + lines[6] + b"\n\n" + b"id: 99\ndata: " + b"x" * 700 + b"\n\n" +
          b"id: 8\ndata: " + lines[7] + b"\n\n" + b"id: 9\ndata: " + lines[8][:20])

    if args.checkpoint:
        with open(args.checkpoint, "rb") as f:
            whole = f.read()
        write("checkpoint", "raw", b"\x00" + whole)
        write("checkpoint", "archive", b"\x01" + whole[16 + 8 + 4:])  # the harness adds the header


if __name__ == "__main__":
    main()
