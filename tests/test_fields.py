import numpy as np
import pytest
import stoker
from stoker.fields import schema_hash


def test_scalar_roundtrip_and_dtype_checks():
    f = stoker.scalar("int64")
    assert f.decode(f.encode(7)) == 7
    assert f.decode(f.encode(np.int32(7))) == 7
    with pytest.raises(ValueError, match="does not fit"):
        f.encode(1.5)
    with pytest.raises(ValueError, match="scalar"):
        f.encode([1, 2])
    with pytest.raises(ValueError, match="does not fit"):
        stoker.scalar("uint8").encode(300)
    with pytest.raises(ValueError, match="unsupported dtype"):
        stoker.scalar("complex64")


def test_ndarray_fixed_and_variable_shapes():
    f = stoker.ndarray("float32", (2, 3))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(f.decode(f.encode(x)), x)
    with pytest.raises(ValueError, match="expected shape"):
        f.encode(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="expected dtype float32, got float64"):
        f.encode(np.zeros((2, 3)))
    v = stoker.ndarray("int32", (None, 2))
    y = np.arange(10, dtype=np.int32).reshape(5, 2)
    np.testing.assert_array_equal(v.decode(v.encode(y)), y)
    assert v.decode(v.encode(np.zeros((0, 2), np.int32))).shape == (0, 2)
    with pytest.raises(ValueError, match="only the first may be None"):
        stoker.ndarray("int32", (2, None))
    # a sample (or a variable sample's row) must fit a record: lengths are u32
    stoker.ndarray("uint8", (2**32 - 1,))
    with pytest.raises(ValueError, match="exceeds a record's limit"):
        stoker.ndarray("uint8", (2**32,))
    with pytest.raises(ValueError, match="per sample row exceeds"):
        stoker.ndarray("float32", (None, 2**20, 2**10))


def test_image_field_accepts_only_encoded_images():
    f = stoker.image()
    assert f.encode(b"\xff\xd8\xff\xe0rest") == b"\xff\xd8\xff\xe0rest"
    with pytest.raises(ValueError, match="not a JPEG or PNG"):
        f.encode(b"GIF89a")
    with pytest.raises(ValueError, match="expected encoded JPEG or PNG bytes"):
        f.encode(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="layout"):
        stoker.image(layout="WHC")


def test_schema_hash_depends_on_names_types_and_order():
    a = {"x": stoker.scalar("int64"), "y": stoker.blob()}
    assert schema_hash(a) == schema_hash(dict(a))
    assert schema_hash(a) != schema_hash({"y": stoker.blob(), "x": stoker.scalar("int64")})
    assert schema_hash(a) != schema_hash({"x": stoker.scalar("int32"), "y": stoker.blob()})


def test_every_spelling_of_a_dtype_gives_the_same_field():
    """Names are checked without NumPy (opening a dataset does not import it); NumPy types,
    dtype strings and NumPy integers as dimensions give the same fields, and ``dtype`` is
    the little-endian NumPy dtype."""
    want = stoker.ndarray("float32", (3, 2))
    for spelling in (np.float32, np.dtype("float32"), "<f4", "f4", np.dtype(">f4")):
        f = stoker.ndarray(spelling, (np.int64(3), np.uint8(2)))
        assert f == want and f.spec() == want.spec() and repr(f) == repr(want)
        assert f.shape == (3, 2) and all(type(d) is int for d in f.shape)
    assert isinstance(want.dtype, np.dtype) and want.dtype == np.dtype("<f4")
    assert want.dtype.itemsize == 4 and want.dtype.byteorder in ("<", "=")
    assert stoker.scalar(np.int64).dtype == np.dtype("<i8") == stoker.scalar("int64").dtype
    assert stoker.tokens(np.uint16) == stoker.tokens("uint16")
    assert stoker.keypoints(np.int64(17)) == stoker.keypoints(17)
    for bad in ("complex64", "f8x", "bfloat16", np.complex64, object):
        with pytest.raises(ValueError):
            stoker.scalar(bad)
    for bad_dim in (True, np.bool_(True), 2.0, np.float32(2), -1):
        with pytest.raises(ValueError, match="dimensions must be non-negative ints"):
            stoker.ndarray("uint8", (bad_dim,))
    with pytest.raises(ValueError, match="num_keypoints"):
        stoker.keypoints(True)
    with pytest.raises(ValueError, match="token dtype"):
        stoker.tokens("float32")


def test_torch_dtypes_name_the_same_fields():
    """`stoker.ndarray(x.dtype, ...)` with a tensor's dtype, as a DataLoader user writes."""
    import torch

    assert stoker.ndarray(torch.float32, (3, 2)) == stoker.ndarray("float32", (3, 2))
    assert stoker.scalar(torch.int64) == stoker.scalar("int64")
    with pytest.raises(ValueError, match="unsupported dtype"):
        stoker.ndarray(torch.bfloat16, (2,))
