import math

import pytest
import stoker
from stoker import _core, ops


def test_specs_follow_the_cpp_conventions():
    spec = ops._specs([ops.RandomResizedCrop(224), ops.Resize(256), ops.Resize((30, 40)),
                       ops.CenterCrop((10, 20)), ops.RandomHorizontalFlip(),
                       ops.Normalize((0.5, 0.4, 0.3), (0.1, 0.2, 0.3), "float16")])
    assert spec == [
        ("random_resized_crop", [224.0, 224.0, 0.08, 1.0, math.log(3 / 4), math.log(4 / 3)]),
        ("resize", [256.0, -1.0]),
        ("resize", [30.0, 40.0]),
        ("center_crop", [10.0, 20.0]),
        ("random_horizontal_flip", [0.5]),
        ("normalize", [0.5, 0.4, 0.3, 0.1, 0.2, 0.3, 1.0]),
    ]
    assert all(isinstance(a, float) for _, args in spec for a in args)
    assert ops._specs(ops.CenterCrop(3)) == [("center_crop", [3.0, 3.0])]
    assert ops._specs([]) == []


@pytest.mark.parametrize("make, match", [
    (lambda: ops.RandomResizedCrop(0), "positive"),
    (lambda: ops.RandomResizedCrop((1, 2, 3)), "positive int or"),
    (lambda: ops.RandomResizedCrop(True), "size"),
    (lambda: ops.RandomResizedCrop(8, scale=(0.5, 0.1)), "scale"),
    (lambda: ops.RandomResizedCrop(8, scale=(0, 1)), "scale"),
    (lambda: ops.RandomResizedCrop(8, ratio=(2, 1)), "ratio"),
    (lambda: ops.RandomResizedCrop(8, ratio="ab"), "ratio"),
    (lambda: ops.Resize(-3), "positive"),
    (lambda: ops.Resize((3, 0)), "positive"),
    (lambda: ops.CenterCrop(2.5), "size"),
    (lambda: ops.RandomHorizontalFlip(1.5), r"\[0, 1\]"),
    (lambda: ops.RandomHorizontalFlip("x"), r"\[0, 1\]"),
    (lambda: ops.Normalize((0.5, 0.5), (1, 1, 1)), "3 values"),
    (lambda: ops.Normalize((0.5,) * 3, (1, 0, 1)), "non-zero"),
    (lambda: ops.Normalize((0.5,) * 3, (1,) * 3, "int8"), "dtype"),
])
def test_invalid_arguments_are_refused_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_normalize_must_be_last():
    with pytest.raises(ValueError, match="must be the last op"):
        ops._specs([ops.Normalize((0,) * 3, (1,) * 3), ops.CenterCrop(4)])
    with pytest.raises(TypeError, match="stoker.ops.Op"):
        ops._specs([("center_crop", [4, 4])])


def test_repr_is_readable_and_ops_compare_by_value():
    assert repr(ops.CenterCrop(224)) == "CenterCrop(size=(224, 224))"
    assert repr(ops.RandomHorizontalFlip()) == "RandomHorizontalFlip(p=0.5)"
    assert repr(ops.RandomResizedCrop((3, 4))) == \
        f"RandomResizedCrop(size=(3, 4), scale=(0.08, 1.0), ratio=({3 / 4!r}, {4 / 3!r}))"
    assert ops.Resize(5) == ops.Resize(5) and ops.Resize(5) != ops.Resize((5, 5))
    assert len({ops.CenterCrop(3), ops.CenterCrop((3, 3))}) == 1


def test_base_class_checks_the_contract():
    with pytest.raises(TypeError, match="kind"):
        class NoKind(ops.Op):
            num_args = 1

            def args(self):
                return [1]
    with pytest.raises(TypeError, match="args"):
        class NoArgs(ops.Op):
            kind = "resize"
            num_args = 2
    with pytest.raises(TypeError, match="num_args"):
        class NoCount(ops.Op):
            kind = "resize"

            def args(self):
                return [1, 2]

    class WrongCount(ops.Op):
        kind = "resize"
        num_args = 2

        def args(self):
            return [1.0]

    class NotFinite(ops.Op):
        kind = "resize"
        num_args = 2

        def args(self):
            return [float("nan"), 1.0]

    with pytest.raises(ValueError, match="2 numbers"):
        WrongCount().spec()
    with pytest.raises(ValueError, match="finite"):
        NotFinite().spec()


def test_a_new_op_subclass_reaches_the_cpp_pipeline():
    class Square(ops.Op):
        """Center square crop of a fixed side (a user-defined op reusing a C++ kind)."""
        kind = "center_crop"
        num_args = 2

        def __init__(self, side):
            self.side = side

        def args(self):
            return [self.side, self.side]

    import io

    import numpy as np
    Image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((10, 12, 3), np.uint8)).save(buf, format="PNG")
    assert _core.decode_image(buf.getvalue(), ops._specs([Square(4)])).shape == (4, 4, 3)


def test_public_names():
    assert set(ops.__all__) == {"Op", "RandomResizedCrop", "Resize", "CenterCrop",
                                "RandomHorizontalFlip", "Normalize"}
    assert stoker.ops is ops
    for name in ops.__all__:
        assert getattr(ops, name).__doc__ and "Example" in getattr(ops, name).__doc__
