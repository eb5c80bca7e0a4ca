"""A user's script over stoker's public API, type-checked by `.ci/run` with
`mypy --strict` against the installed package (py.typed): every name it uses must be typed
well enough that strict mode finds nothing to complain about. Also runs (python
typed_usage.py DIR), so the types describe what the code really does."""

import struct
import sys
import zlib
from pathlib import Path
from typing import Dict, List

import numpy as np
import numpy.typing as npt
import stoker
import torch


def tiny_png() -> bytes:
    """A 1x1 red RGB PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def write(path: Path) -> stoker.Dataset:
    fields: Dict[str, stoker.Field] = {
        "x": stoker.ndarray("float32", (3, 8, 8)),
        "tokens": stoker.ndarray("int32", (None,)),
        "label": stoker.scalar("int64"),
        "raw": stoker.blob(),
        "image": stoker.image(layout="CHW"),
    }
    png = tiny_png()
    with stoker.ShardWriter(path, fields, shard_size="1MB", metadata={"who": "typed"}) as w:
        for i in range(10):
            x: npt.NDArray[np.float32] = np.full((3, 8, 8), i, np.float32)
            w.write({"x": x, "tokens": np.arange(i + 1, dtype=np.int32), "label": i,
                     "raw": b"r" * i, "image": png})
        written: int = len(w)
    assert written == 10
    return stoker.Dataset(path)


def load(ds: stoker.Dataset) -> List[int]:
    ops: List[stoker.ops.Op] = [stoker.ops.Resize(4), stoker.ops.CenterCrop(4),
                                stoker.ops.RandomHorizontalFlip(0.5),
                                stoker.ops.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))]
    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=1, drop_last=False,
                           num_threads=2, prefetch=2, device="cpu", transforms={"image": ops},
                           on_error="raise")
    n_batches: int = len(loader)
    loader.set_epoch(1)
    labels: List[int] = []
    for batch in loader:
        x: torch.Tensor = batch["x"]
        assert x.dtype == torch.float32
        labels += [int(v) for v in batch["label"].tolist()]
        state = loader.state_dict()
        loader.load_state_dict(state)
        break
    stats = loader.stats()
    assert stats["batches"] >= 1 and n_batches == 3
    loader.close()
    sample = ds[0]
    assert len(ds) == 10 and set(sample) == set(ds.fields)
    report = ds.verify()
    assert report["ok"]
    try:
        stoker.Dataset(ds.path + "-missing")
    except (FileNotFoundError, stoker.DataError) as e:
        print("as expected:", type(e).__name__)
    version: str = stoker.__version__
    print(f"stoker {version}: labels {labels}")
    return labels


if __name__ == "__main__":
    load(write(Path(sys.argv[1])))
