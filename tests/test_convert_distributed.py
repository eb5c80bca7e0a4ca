"""Writing from distributed engines: parts per task, then one atomic merge whose output
does not depend on the partitioning (Ray Data with a local 2-CPU cluster; Spark when
pyspark and a JVM are installed)."""

import io
import os
import shutil
import sys

import numpy as np
import pytest
import stoker
from conftest import dataset_content
from stoker import cli
from stoker.convert import merge, write_part

# subprocesses of a framework with their own timeouts (pyproject: 120 s a test)
pytestmark = pytest.mark.timeout(600)

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")

FIELDS = {"img": stoker.image(), "label": stoker.scalar("int64"),
          "x": stoker.ndarray("int32", (None,))}
N = 150


def jpeg(i):
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 5, 3), i % 256, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def row(i):
    return {"img": jpeg(i), "label": i, "x": np.arange(i % 7, dtype=np.int32) + i}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The dataset written in one piece by ShardWriter."""
    out = tmp_path_factory.mktemp("ref") / "ds"
    with stoker.ShardWriter(out, FIELDS, shard_size="4KB") as w:
        for i in range(N):
            w.write(row(i))
    return out


def same_as_reference(out, reference):
    """The same records, shard boundaries and record tables as the one-piece write: only the
    write's random dataset id differs."""
    got, want = dataset_content(out), dataset_content(reference)
    assert len(want["shards"]) > 3
    assert got == want


@pytest.mark.parametrize("cuts", [[N], [10, 11, 129, N], [0, 3, 50, 50, 100, 149, N]])
def test_merge_is_independent_of_partitioning(reference, tmp_path, cuts):
    bounds = [0] + cuts
    for t, (a, b) in enumerate(zip(bounds, bounds[1:])):
        write_part((row(i) for i in range(a, b)), tmp_path / "parts", t, FIELDS,
                   shard_size="1KB")
    stats = merge([tmp_path / "parts"], tmp_path / "out", shard_size="4KB")
    assert stats["records"] == N and stats["parts"] == len(cuts)
    same_as_reference(tmp_path / "out", reference)
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_merge_cli_and_errors(reference, tmp_path, capsys):
    parts = tmp_path / "parts"
    for t, (a, b) in enumerate([(0, 70), (70, N)]):
        write_part((row(i) for i in range(a, b)), parts, t, FIELDS)
    a, b = str(parts / "part-000000"), str(parts / "part-000001")
    assert cli.main(["merge", a, b, str(tmp_path / "out"), "--shard-size", "4KB",
                     "--quiet"]) == 0
    assert "merged 2 parts, 150 records" in capsys.readouterr().err
    same_as_reference(tmp_path / "out", reference)
    # the target exists: refused; with --overwrite replaced in one rename
    assert cli.main(["merge", a, b, str(tmp_path / "out"), "--quiet"]) == 2
    assert "already holds a dataset" in capsys.readouterr().err
    assert cli.main(["merge", b, a, str(tmp_path / "out"), "--quiet", "--overwrite"]) == 0
    assert stoker.Dataset(tmp_path / "out")[0]["label"] == 70
    # a missing task, a different schema
    shutil.rmtree(parts / "part-000000")
    write_part([row(0)], parts, 2, FIELDS)
    with pytest.raises(FileNotFoundError, match="a task's part is missing"):
        merge([parts], tmp_path / "o2")
    write_part([{"label": 1}], tmp_path / "other", 0, {"label": stoker.scalar("int64")})
    with pytest.raises(ValueError, match="schema"):
        merge([b, tmp_path / "other" / "part-000000"], tmp_path / "o2")
    assert not os.path.exists(tmp_path / "o2")


def test_merge_failure_leaves_no_output(tmp_path):
    write_part((row(i) for i in range(20)), tmp_path / "parts", 0, FIELDS)
    part = stoker.Dataset(tmp_path / "parts" / "part-000000")
    shard = tmp_path / "parts" / "part-000000" / part.shards[0]["path"]
    del part
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(stoker.DataError):
        merge([tmp_path / "parts"], tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["parts"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ray's own, on import and setup
def test_ray_data(reference, tmp_path):
    ray = pytest.importorskip("ray", reason="ray[data] is installed by .ci/run (the merge "
                              "path is covered above without it)")
    from stoker.convert.distributed import write_ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        ds = ray.data.from_items([row(i) for i in range(N)])
        for blocks in (1, 4, 9):
            out = tmp_path / f"out{blocks}"
            stats = write_ray(ds.repartition(blocks), out, FIELDS, shard_size="4KB")
            assert stats["records"] == N and stats["parts"] == blocks
            same_as_reference(out, reference)
        # columns that differ from the fields, mapped per row
        renamed = ds.map(lambda r: {"image": r["img"], "y": r["label"], "x": r["x"]})
        write_ray(renamed, tmp_path / "mapped", FIELDS, shard_size="4KB",
                  to_sample=lambda r: {"img": r["image"], "label": r["y"], "x": r["x"]})
        same_as_reference(tmp_path / "mapped", reference)
    finally:
        ray.shutdown()


def test_spark(reference, tmp_path, monkeypatch):
    pytest.importorskip("pyspark", reason="pyspark is not installed (the merge path is "
                        "covered above without it)")
    if shutil.which("java") is None:
        pytest.skip("no JVM (apt-get install default-jre-headless)")
    from pyspark.sql import SparkSession
    from stoker.convert.distributed import write_spark

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # workers need this stoker

    spark = (SparkSession.builder.master("local[2]").appName("stoker-test")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        rows = [(bytearray(r["img"]), r["label"], r["x"].tolist()) for r in map(row, range(N))]

        def to_sample(r):
            return {"img": bytes(r["img"]), "label": r["label"],
                    "x": np.array(r["x"], np.int32)}

        for parts in (1, 5):
            # parallelize keeps the order: partition k holds the k-th slice of the rows
            rdd = spark.sparkContext.parallelize(rows, numSlices=parts)
            df = spark.createDataFrame(rdd, "img binary, label long, x array<int>")
            out = tmp_path / f"out{parts}"
            stats = write_spark(df, out, FIELDS, shard_size="4KB", to_sample=to_sample)
            assert stats["parts"] == parts
            same_as_reference(out, reference)
    finally:
        spark.stop()
