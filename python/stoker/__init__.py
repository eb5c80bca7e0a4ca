"""stoker: a native-accelerated data loader for PyTorch.

Write a dataset once with :class:`ShardWriter`, then iterate it with :class:`Loader`::

    import stoker

    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter("out/train", fields) as w:
        w.write({"image": jpeg_bytes, "label": 3})

    loader = stoker.Loader(stoker.Dataset("out/train"), batch_size=256, shuffle=True,
                           transforms={"image": [stoker.ops.RandomResizedCrop(224)]})
    for batch in loader:          # {"image": uint8 tensor, "label": int64 tensor}
        ...
"""

from typing import TYPE_CHECKING, Any

from . import _accelerate, ops
from ._core import CudaError, DataError, DecodeError, Error
from ._media_fields import Audio, Video, audio, video
from .dataset import Dataset
from .fields import (
    Blob,
    Boxes,
    Field,
    Image,
    KeyPoints,
    NDArray,
    Scalar,
    Tokens,
    blob,
    boxes,
    image,
    keypoints,
    ndarray,
    scalar,
    tokens,
)
from .mix import Mix
from .token_dataset import TokenDataset
from .writer import ShardWriter, WriterLockError

if TYPE_CHECKING:
    from .loader import Loader
    from .service import RayService

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Loader imports torch (about 1-3 s): loaded on first use, so that `import stoker` for
    # writing, reading and the command line (`stoker --help`, `inspect`, `merge`) stays
    # quick. `from stoker import Loader` and `stoker.Loader` work as for any attribute.
    if name == "Loader":
        from .loader import Loader

        globals()["Loader"] = Loader
        return Loader
    if name == "RayService":  # stoker/service/: Ray is imported when a pool is made
        from .service import RayService

        globals()["RayService"] = RayService
        return RayService
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


# accelerate.skip_first_batches (which transformers' Trainer calls to resume) takes a
# stoker.Loader: NOTE [ skip_first_batches ] in _accelerate.py.
_accelerate.install()

__all__ = [
    "Audio",
    "Blob",
    "Boxes",
    "CudaError",
    "DataError",
    "Dataset",
    "DecodeError",
    "Error",
    "Field",
    "Image",
    "KeyPoints",
    "Loader",
    "Mix",
    "NDArray",
    "RayService",
    "Scalar",
    "ShardWriter",
    "TokenDataset",
    "Tokens",
    "Video",
    "WriterLockError",
    "audio",
    "blob",
    "boxes",
    "image",
    "keypoints",
    "ndarray",
    "ops",
    "scalar",
    "tokens",
    "video",
    "__version__",
]
