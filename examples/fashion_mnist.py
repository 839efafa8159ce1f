"""Fashion-MNIST from Debian's dataset-fashion-mnist package as torch tensors.

    from fashion_mnist import load
    x, y = load("train")        # x: N x 1 x 28 x 28 float32 in [0, 1], y: N int64

The IDX files (gzip) are read with the standard library: a file that is not
an IDX file of the expected kind raises ValueError naming it.
"""
import gzip
import os
import struct

import numpy as np
import torch

DATA_DIR = os.environ.get("PS_DATA_DIR", "/usr/share/datasets/fashion-mnist")


def _idx(path, ndims):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(4 + 4 * ndims)
        if len(head) < 4 + 4 * ndims:
            raise ValueError(f"{path}: truncated IDX header")
        magic = struct.unpack(">I", head[:4])[0]
        if magic != 0x0800 | ndims:
            raise ValueError(f"{path}: not an IDX file of {ndims}-d unsigned bytes "
                             f"(magic {magic:#x}, expected {0x0800 | ndims:#x})")
        dims = struct.unpack(f">{ndims}I", head[4:])
        data = f.read()
    want = int(np.prod(dims))
    if len(data) != want:
        raise ValueError(f"{path}: {len(data)} data bytes, the header says {want}")
    return np.frombuffer(data, np.uint8).reshape(dims)


def load(split, data_dir=None):
    """(images, labels) of split "train" or "t10k"."""
    d = data_dir or DATA_DIR
    for suffix in (".gz", ""):
        imgs = os.path.join(d, f"{split}-images-idx3-ubyte{suffix}")
        if os.path.exists(imgs):
            break
    else:
        raise FileNotFoundError(f"{d}: no {split}-images-idx3-ubyte(.gz) "
                                "(Debian: apt install dataset-fashion-mnist)")
    x = _idx(imgs, 3)
    y = _idx(os.path.join(d, f"{split}-labels-idx1-ubyte{suffix}"), 1)
    if len(x) != len(y):
        raise ValueError(f"{d}: {len(x)} {split} images but {len(y)} labels")
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(y.astype(np.int64))


def evaluate(model, x, y, batch=1000):
    """Test accuracy (%) of model on (x, y)."""
    was = model.training
    model.eval()
    right = 0
    dev = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(x), batch):
            right += (model(x[i:i + batch].to(dev)).argmax(1).cpu() == y[i:i + batch]).sum().item()
    model.train(was)
    return 100.0 * right / len(x)
