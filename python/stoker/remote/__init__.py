"""Datasets that live at a URL (``s3://``, ``https://``, any fsspec URL), read through a
local shard cache shared by the processes of a node.

``stoker.Dataset("s3://bucket/train", cache_dir=..., cache_limit="50GB")`` fetches
``index.json`` and returns; the shards download into the cache while the dataset is in
use. The parts, one module each:

- :mod:`.dataset`: :class:`RemoteDataset`, what ``stoker.Dataset(url)`` holds as
  ``ds.remote`` (NOTE [ Bounded cache ], NOTE [ Remote datasets across fork ]);
- :mod:`.fetcher`: the thread that feeds the C++ dataset (NOTE [ Fetcher turns ]);
- :mod:`.cache`: :class:`ShardCache`, the shards in a local directory (NOTE [ Shard cache
  protocol ]);
- :mod:`.space`: the directory's byte budget shared by its users and the lock descriptors
  that never outlive their owner (NOTE [ Cache budget ], NOTE [ Locks across fork ]);
- :mod:`.retry`: :class:`Retry`, the retry budget, and the cancellation of transfers;
- :mod:`.transport`: HTTP(S), S3 and fsspec sources; :mod:`.ranges`: byte ranges.
"""

from .cache import ShardCache, default_cache_dir
from .dataset import RemoteDataset, fetch_bytes
from .retry import Cancelled, CancelToken, Retry
from .space import NoRoomError
from .transport import RemoteError, Source, is_url, open_source

__all__ = ["RemoteDataset", "ShardCache", "RemoteError", "NoRoomError", "Retry", "Cancelled",
           "CancelToken", "Source", "is_url", "open_source", "default_cache_dir", "fetch_bytes"]
