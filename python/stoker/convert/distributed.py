"""Writing a stoker dataset from a distributed engine: Ray Data and Spark.

Each task writes its rows as one part (:func:`stoker.convert.write_part`, numbered by the
task's position in the data), then the driver merges the parts, in task order, into one
dataset (:func:`stoker.convert.merge`). The merged shards are cut by ``shard_size`` alone,
so the result does not depend on how the data was partitioned. The parts directory must be
visible to the driver and every worker (one machine, or a shared file system).

Example::

    import ray, stoker
    from stoker.convert.distributed import write_ray

    ds = ray.data.read_parquet("s3://bucket/table")
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    write_ray(ds, "data/train", fields)                       # columns image, label

    # Spark: one part per partition (foreachPartition)
    write_spark(spark_df, "data/train", fields)
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, Mapping, Optional

from ..fields import Field
from .merge import _sibling_tmp, merge, write_part

__all__ = ["write_ray", "write_spark"]  # and StokerDatasink, built on first use (needs ray)

RowFn = Callable[[Dict[str, Any]], Mapping[str, Any]]


def _default_row(fields: Mapping[str, Field]) -> RowFn:
    names = list(fields)

    def to_sample(row: Dict[str, Any]) -> Dict[str, Any]:
        try:
            return {k: row[k] for k in names}
        except KeyError as e:
            raise ValueError(f"row has no column {e.args[0]!r} (columns: {sorted(row)}); "
                             "pass to_sample= to map rows to samples") from None
    return to_sample


def _datasink_class():
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    class StokerDatasink(Datasink):
        """A Ray Data sink writing each write task's rows as part ``task_idx``."""

        def __init__(self, parts_dir: str, fields: Mapping[str, Field], shard_size,
                     to_sample: Optional[RowFn]):
            self.parts_dir, self.fields, self.shard_size = parts_dir, dict(fields), shard_size
            self.to_sample = to_sample or _default_row(fields)

        def write(self, blocks, ctx):
            def rows():
                for block in blocks:
                    for row in BlockAccessor.for_block(block).iter_rows(
                            public_row_format=True):
                        yield self.to_sample(dict(row))
            return write_part(rows(), self.parts_dir, ctx.task_idx, self.fields,
                              shard_size=self.shard_size)

    return StokerDatasink


def __getattr__(name: str):
    if name == "StokerDatasink":  # needs ray; built on first use
        return _datasink_class()
    raise AttributeError(name)


def write_ray(dataset, out, fields: Mapping[str, Field], *, shard_size="256MB",
              to_sample: Optional[RowFn] = None, metadata: Any = None,
              overwrite: bool = False, part_shard_size="64MB") -> Dict[str, Any]:
    """Writes a ``ray.data.Dataset`` as a stoker dataset at ``out`` (parts, then merge).

    Args:
        dataset: the Ray dataset; its row order is the stoker dataset's order.
        fields: the schema; by default each row's columns of those names are the sample.
        to_sample: maps a row (dict) to a sample, when columns and fields differ.
        shard_size: target bytes per shard of the merged dataset.
        part_shard_size: shard size inside the temporary parts.

    Returns:
        :func:`stoker.convert.merge`'s result.
    """
    import ray

    parts = _sibling_tmp(os.fspath(out), "ray-parts")
    try:
        ctx = ray.data.DataContext.get_current()
        keep = ctx.execution_options.preserve_order
        ctx.execution_options.preserve_order = True  # task_idx follows the row order
        try:
            dataset.write_datasink(_datasink_class()(parts, fields, part_shard_size,
                                                     to_sample))
        finally:
            ctx.execution_options.preserve_order = keep
        return merge([parts], out, shard_size=shard_size, metadata=metadata,
                     overwrite=overwrite)
    finally:
        shutil.rmtree(parts, ignore_errors=True)


def write_spark(df, out, fields: Mapping[str, Field], *, shard_size="256MB",
                to_sample: Optional[RowFn] = None, metadata: Any = None,
                overwrite: bool = False, part_shard_size="64MB") -> Dict[str, Any]:
    """Writes a Spark DataFrame as a stoker dataset at ``out``: ``foreachPartition``
    writes part ``partitionId``, then the driver merges. Arguments as :func:`write_ray`;
    rows reach ``to_sample`` as ``Row.asDict()``."""
    parts = _sibling_tmp(os.fspath(out), "spark-parts")
    convert = to_sample or _default_row(fields)
    fields = dict(fields)

    def task(rows):
        from pyspark import TaskContext

        write_part((convert(r.asDict()) for r in rows), parts, TaskContext.get().partitionId(),
                   fields, shard_size=part_shard_size)

    try:
        df.foreachPartition(task)
        return merge([parts], out, shard_size=shard_size, metadata=metadata,
                     overwrite=overwrite)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
