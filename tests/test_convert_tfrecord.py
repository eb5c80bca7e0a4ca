"""stoker convert tfrecord: TFRecord framing, tf.train.Example parsing, schema inference,
overrides, bad records, parallel conversion.

Files are written three independent ways: with TensorFlow where it is installed, with the
protobuf library from a descriptor of tf.train.Example built here (field numbers from
tensorflow/core/example/{example,feature}.proto), and byte by byte by hand.
"""

import gzip
import io
import os
import struct

import numpy as np
import pytest
import stoker
from conftest import dataset_content
from stoker import cli
from stoker.convert import convert_tfrecord
from stoker.convert._example_proto import MalformedExample, parse_example
from stoker.convert.tfrecord import TFRecordError, masked_crc32c, read_records

crc32c = pytest.importorskip("google_crc32c", reason="google-crc32c is in the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")


# -- writers independent of the reader under test ------------------------------------------

def _example_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="stoker_test_example.proto",
                                            package="tensorflow", syntax="proto3")
    for name, typ in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT),
                      ("Int64List", F.TYPE_INT64)):
        fd.message_type.add(name=name).field.add(name="value", number=1, type=typ,
                                                 label=F.LABEL_REPEATED)
    feat = fd.message_type.add(name="Feature")
    feat.oneof_decl.add(name="kind")
    for num, (name, typ) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                       ("int64_list", "Int64List")), 1):
        feat.field.add(name=name, number=num, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                       type_name=f".tensorflow.{typ}", oneof_index=0)
    feats = fd.message_type.add(name="Features")
    entry = feats.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Feature")
    feats.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".tensorflow.Features.FeatureEntry")
    fd.message_type.add(name="Example").field.add(
        name="features", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
        type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def serialize(features):
    """A tf.train.Example with {name: list of bytes | float array | int list} via protobuf."""
    pb = pytest.importorskip("google.protobuf", reason="protobuf is in the test extra")
    del pb
    ex = _example_class()()
    for name, vals in features.items():
        f = ex.features.feature[name]
        if isinstance(vals, np.ndarray) and vals.dtype.kind == "f":
            f.float_list.value.extend(vals.tolist())
        elif vals and isinstance(vals[0], bytes):
            f.bytes_list.value.extend(vals)
        else:
            f.int64_list.value.extend(int(v) for v in vals)
    return ex.SerializeToString()


def _masked(data):
    c = crc32c.value(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data))


def write_tfrecord(path, records, opener=open):
    with opener(path, "wb") as f:
        for r in records:
            f.write(frame(r))
    return path


def jpeg(seed, size=(24, 32)):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def png(seed):
    buf = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), seed % 256, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def sample_features(i):
    rng = np.random.default_rng(i)
    return {
        "image/encoded": [jpeg(i) if i % 3 else png(i)],
        "image/class/label": [i % 10 - 3],                       # negatives: 10-byte varints
        "emb": rng.standard_normal(4).astype(np.float32),
        "ids": list(rng.integers(-2**40, 2**40, i % 5)),          # variable length, maybe empty
        "name": [f"sample-{i}".encode()],
    }


@pytest.fixture
def tfrecords(tmp_path):
    """3 files of 7, 0 and 13 Examples, written with the protobuf library."""
    src = tmp_path / "src"
    src.mkdir()
    counts = [7, 0, 13]
    originals = []
    k = 0
    for j, n in enumerate(counts):
        recs = []
        for _ in range(n):
            originals.append(sample_features(k))
            recs.append(serialize(originals[-1]))
            k += 1
        write_tfrecord(src / f"train-{j:05d}-of-00003.tfrecord", recs)
    return src, originals


def check_equal(ds, originals):
    assert len(ds) == len(originals)
    for i, feats in enumerate(originals):
        s = ds[i]
        assert s["image/encoded"] == feats["image/encoded"][0]
        assert s["image/class/label"] == feats["image/class/label"][0]
        np.testing.assert_array_equal(s["emb"], feats["emb"])
        np.testing.assert_array_equal(s["ids"], np.array(feats["ids"], np.int64))
        assert s["name"] == feats["name"][0]


# -- framing and the wire format -----------------------------------------------------------

def test_crc32c_known_vectors():
    # RFC 3720 B.4 check value and the all-zero 32-byte vector
    assert crc32c.value(b"123456789") == 0xE3069283
    assert crc32c.value(bytes(32)) == 0x8A9136AA
    # the mask of TFRecord (tensorflow/core/lib/hash/crc32c.h): rotate right 15, add delta
    assert masked_crc32c(b"") == 0xA282EAD8
    c = 0xE3069283
    assert masked_crc32c(b"123456789") == (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(v):
    v &= 2**64 - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _ld(field, payload):
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def test_parse_hand_encoded_example():
    """Packed and unpacked lists, a negative int64, merged repeats, unknown fields."""
    packed_ints = _ld(1, b"".join(_varint(v) for v in [1, -1, 300] + list(range(20))))
    unpacked_ints = b"".join(_varint(1 << 3 | 0) + _varint(v) for v in (7, -2))
    floats_packed = _ld(1, struct.pack("<2f", 1.5, -2.0))
    float_unpacked = _varint(1 << 3 | 5) + struct.pack("<f", 3.25)
    unknown = _varint(9 << 3 | 0) + _varint(5) + _ld(10, b"zzz")

    def entry(name, feature):
        return _ld(1, _ld(1, name.encode()) + _ld(2, feature))

    features = (entry("a", _ld(3, packed_ints) + unknown)
                + entry("b", _ld(3, unpacked_ints))
                + entry("f", _ld(2, floats_packed) + _ld(2, float_unpacked))
                + entry("s", _ld(1, _ld(1, b"hello") + _ld(1, b"")))
                + entry("e", b"")
                + entry("s2", _ld(1, _ld(1, b"first")))
                + entry("s2", _ld(1, _ld(1, b"second"))))     # last map entry wins
    ex = parse_example(_ld(1, features) + unknown)
    assert ex["a"][0] == "int64"
    assert ex["a"][1].tolist() == [1, -1, 300] + list(range(20))
    assert ex["b"][1].tolist() == [7, -2]
    assert ex["f"][0] == "float" and ex["f"][1].tolist() == [1.5, -2.0, 3.25]
    assert ex["s"] == ("bytes", [b"hello", b""])
    assert ex["e"] == (None, [])
    assert ex["s2"] == ("bytes", [b"second"])


def test_parse_matches_protobuf_library():
    feats = sample_features(5)
    ex = parse_example(serialize(feats))
    assert ex["image/encoded"] == ("bytes", feats["image/encoded"])
    assert ex["image/class/label"][1].tolist() == feats["image/class/label"]
    np.testing.assert_array_equal(ex["emb"][1], feats["emb"])
    assert ex["ids"][1].tolist() == [int(v) for v in feats["ids"]]


@pytest.mark.parametrize("data", [b"\x0a", b"\x0a\x05\x0a\x03", b"\x0a\x02\x0a\xff",
                                  b"\x0f\x00", b"\xff" * 11])
def test_parse_malformed(data):
    with pytest.raises(MalformedExample):
        parse_example(data)


def test_read_records_offsets_and_gzip(tmp_path):
    recs = [b"", b"x" * 300, b"abc"]
    plain = write_tfrecord(tmp_path / "a.tfrecord", recs)
    assert [(n, off, d) for n, off, d in read_records(str(plain))] == \
        [(0, 0, b""), (1, 16, b"x" * 300), (2, 332, b"abc")]
    gz = write_tfrecord(tmp_path / "a.tfrecord.gz", recs, opener=gzip.open)
    assert [d for _, _, d in read_records(str(gz))] == recs


# -- conversion ----------------------------------------------------------------------------

def test_convert_infers_schema_and_values(tfrecords, tmp_path):
    src, originals = tfrecords
    stats = convert_tfrecord(src, tmp_path / "out", workers=1, progress=False)
    ds = stoker.Dataset(tmp_path / "out")
    assert stats["records"] == len(originals) == 20
    assert ds.fields == {"emb": stoker.ndarray("float32", (4,)),
                         "ids": stoker.ndarray("int64", (None,)),
                         "image/class/label": stoker.scalar("int64"),
                         "image/encoded": stoker.image(),
                         "name": stoker.blob()}
    check_equal(ds, originals)
    assert ds.metadata["source"] == "tfrecord"
    # the loader decodes the images it finds
    batch = next(iter(stoker.Loader(ds, batch_size=4, shuffle=False)))
    assert batch["image/class/label"].tolist() == [-3, -2, -1, 0]


def test_same_output_for_any_worker_count(tfrecords, tmp_path):
    src, originals = tfrecords
    outs = []
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}"
        convert_tfrecord(src, out, workers=workers, shard_size="4KB", progress=False)
        outs.append(out)
    want = dataset_content(outs[0])  # all but each write's random dataset id
    assert len(want["shards"]) > 2
    for out in outs[1:]:
        assert dataset_content(out) == want
    check_equal(stoker.Dataset(outs[2]), originals)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporaries left


def test_features_override(tfrecords, tmp_path):
    src, originals = tfrecords
    convert_tfrecord(src, tmp_path / "out", progress=False, workers=2,
                     features="image/class/label:int8, emb:float16[2,2], name:skip, "
                              "ids:int64[], image/encoded:blob")
    ds = stoker.Dataset(tmp_path / "out")
    assert list(ds.fields) == ["image/class/label", "emb", "ids", "image/encoded"]
    assert ds.fields["emb"] == stoker.ndarray("float16", (2, 2))
    for i, feats in enumerate(originals):
        s = ds[i]
        assert s["image/class/label"] == feats["image/class/label"][0]
        np.testing.assert_array_equal(s["emb"], feats["emb"].astype(np.float16).reshape(2, 2))


def test_override_that_does_not_fit_names_record(tfrecords, tmp_path):
    src, _ = tfrecords
    with pytest.raises(TFRecordError, match=r"train-00000-of-00003.tfrecord: record 1 at "
                                            r"offset \d+: feature 'ids'.*do not fit"):
        convert_tfrecord(src, tmp_path / "out", progress=False, workers=2,
                         features="ids:int32[]")
    assert not os.path.exists(tmp_path / "out")


def test_missing_and_new_features(tmp_path):
    recs = [serialize({"x": [1], "v": [1, 2]}), serialize({"x": [2]}),
            serialize({"x": [3], "v": [5], "late": [9]})]
    path = write_tfrecord(tmp_path / "a.tfrecord", recs)
    # inferred from the first two: 'v' is variable (missing = empty); 'late' is unknown
    with pytest.raises(TFRecordError, match=r"record 2 at offset \d+: feature 'late' is not in "
                                            "the schema"):
        convert_tfrecord(path, tmp_path / "o1", infer_records=2, progress=False)
    convert_tfrecord(path, tmp_path / "o2", infer_records=2, progress=False,
                     features="x:int64,v:int64[]")
    ds = stoker.Dataset(tmp_path / "o2")
    assert [ds[i]["v"].tolist() for i in range(3)] == [[1, 2], [], [5]]
    with pytest.raises(TFRecordError, match=f"record 1 at offset {16 + len(recs[0])}: feature "
                                            "'v': missing"):
        convert_tfrecord(path, tmp_path / "o3", progress=False, features="x:int64,v:int64[2]")


def test_bad_crc_reported_and_skipped(tfrecords, tmp_path):
    src, originals = tfrecords
    f = src / "train-00002-of-00003.tfrecord"
    data = bytearray(f.read_bytes())
    # the third record of the file: walk the framing to its data
    off = 0
    for _ in range(2):
        off += 16 + struct.unpack_from("<Q", data, off)[0]
    data[off + 12 + 5] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(TFRecordError, match=rf"train-00002-of-00003.tfrecord: record 2 at "
                                            rf"offset {off}: data CRC-32C mismatch"):
        convert_tfrecord(src, tmp_path / "out", progress=False, workers=2)
    assert not os.path.exists(tmp_path / "out")
    stats = convert_tfrecord(src, tmp_path / "out", progress=False, workers=2, skip_bad=True)
    assert [w for w, _ in stats["skipped"]] == [f"{f}: record 2 at offset {off}"]
    check_equal(stoker.Dataset(tmp_path / "out"), originals[:9] + originals[10:])


def test_truncated_and_foreign_files(tmp_path):
    good = [serialize({"x": [i]}) for i in range(3)]
    blob = b"".join(frame(r) for r in good)
    (tmp_path / "t.tfrecord").write_bytes(blob[:-3])
    with pytest.raises(TFRecordError, match=r"t.tfrecord: record 2 at offset \d+: truncated"):
        convert_tfrecord(tmp_path / "t.tfrecord", tmp_path / "o", progress=False)
    stats = convert_tfrecord(tmp_path / "t.tfrecord", tmp_path / "o", progress=False,
                             skip_bad=True)
    assert stats["records"] == 2 and "rest of the file skipped" in stats["skipped"][0][1]
    (tmp_path / "j.tfrecord").write_bytes(b'{"not": "a tfrecord file at all"}')
    with pytest.raises(TFRecordError, match="record 0 at offset 0: length CRC-32C mismatch"):
        convert_tfrecord(tmp_path / "j.tfrecord", tmp_path / "o2", progress=False)
    (tmp_path / "p.tfrecord").write_bytes(frame(b"\x0a\x05\x0a\x03"))
    with pytest.raises(TFRecordError, match="record 0 at offset 0: not a tf.train.Example"):
        convert_tfrecord(tmp_path / "p.tfrecord", tmp_path / "o3", progress=False)


def test_verify_reports_corrupt_image(tmp_path):
    bad = jpeg(1)[:-200]  # cut: starts like a JPEG, does not decode
    recs = [serialize({"img": [jpeg(0)]}), serialize({"img": [bad]})]
    path = write_tfrecord(tmp_path / "a.tfrecord", recs)
    with pytest.raises(TFRecordError, match=r"record 1 at offset \d+: feature 'img': corrupt"):
        convert_tfrecord(path, tmp_path / "o", progress=False, verify=True)
    assert convert_tfrecord(path, tmp_path / "o", progress=False)["records"] == 2


def test_cli(tfrecords, tmp_path, capsys):
    src, originals = tfrecords
    out = tmp_path / "out"
    assert cli.main(["convert", "tfrecord", str(src), str(out), "--workers", "2",
                     "--quiet"]) == 0
    assert "wrote 20 records from 3 file(s)" in capsys.readouterr().err
    check_equal(stoker.Dataset(out), originals)
    assert cli.main(["convert", "tfrecord", str(src), str(out), "--quiet"]) == 2
    assert "already holds a dataset" in capsys.readouterr().err
    assert cli.main(["convert", "tfrecord", str(src), str(tmp_path / "o2"), "--quiet",
                     "--features", "label"]) == 2
    assert "NAME:TYPE" in capsys.readouterr().err


def test_files_written_by_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed; the same path "
                             "is covered by the protobuf-written files above")
    originals = [sample_features(i) for i in range(6)]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for feats in originals:
            feature = {}
            for k, v in feats.items():
                if isinstance(v, np.ndarray):
                    feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=v))
                elif v and isinstance(v[0], bytes):
                    feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
                else:
                    feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(x) for x in v]))
            ex = tf.train.Example(features=tf.train.Features(feature=feature))
            w.write(ex.SerializeToString())
    convert_tfrecord(path, tmp_path / "out", progress=False)
    check_equal(stoker.Dataset(tmp_path / "out"), originals)
