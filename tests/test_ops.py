import pytest
import stoker
from stoker import _core, ops


def test_ops_build_the_typed_cpp_ops():
    built = ops.op_specs([ops.RandomResizedCrop(224), ops.Resize(256), ops.Resize((30, 40)),
                        ops.CenterCrop((10, 20)), ops.RandomHorizontalFlip(),
                        ops.Normalize((0.5, 0.4, 0.3), (0.1, 0.2, 0.3), "float16")])
    cpp = _core
    assert built == [
        cpp.RandomResizedCrop(224, 224, 0.08, 1.0, 3 / 4, 4 / 3),
        cpp.Resize(shorter=256),
        cpp.Resize(h=30, w=40),
        cpp.CenterCrop(10, 20),
        cpp.RandomHorizontalFlip(0.5),
        cpp.Normalize(mean=(0.5, 0.4, 0.3), std=(0.1, 0.2, 0.3), dtype="float16"),
    ]
    assert [type(b).kind for b in built] == [
        "random_resized_crop", "resize", "resize", "center_crop", "random_horizontal_flip",
        "normalize"]
    assert repr(built[1]) == "Resize(h=0, w=0, shorter=256)"
    assert built[0].ratio_hi == 4 / 3 and built[5].std == (0.1, 0.2, 0.3)
    assert built[5].dtype == "float16" and built[3].h == 10 and built[3].w == 20
    assert ops.CenterCrop(3).spec() == ("center_crop", [3, 3])
    assert ops.op_specs(ops.CenterCrop(3)) == [cpp.CenterCrop(3, 3)]
    assert ops.op_specs([]) == []
    assert set(_core.IMAGE_OPS) == {"random_resized_crop", "resize", "center_crop",
                                    "random_horizontal_flip", "normalize", "color_jitter",
                                    "random_grayscale", "gaussian_blur", "hsv_jitter",
                                    "rand_augment", "trivial_augment_wide", "auto_augment",
                                    "random_erasing", "random_crop", "pad",
                                    "random_vertical_flip", "letterbox", "random_rotation",
                                    "random_affine", "random_perspective",
                                    "sanitize_bounding_boxes", "mosaic", "detection_mixup",
                                    "copy_paste"}


@pytest.mark.parametrize("make, match", [
    (lambda: _core.CenterCrop(0, 3), "CenterCrop: h must be a positive whole number"),
    (lambda: _core.CenterCrop(3, 2.5), "w must be a positive whole number"),
    (lambda: _core.CenterCrop(3, 3, 3), "takes 2 parameters"),
    (lambda: _core.CenterCrop(3, w=3, x=1), "unknown parameter"),
    (lambda: _core.CenterCrop(3, h=3), "given twice"),
    (lambda: _core.Resize(4, 4, 4), "either"),
    (lambda: _core.RandomHorizontalFlip(float("nan")), r"\[0, 1\]"),
    (lambda: _core.Normalize((0, 0), (1, 1, 1)), "3 values"),
    (lambda: _core.Normalize((0, 0, 0), (1, 1, 1), "uint8"), "dtype"),
])
def test_cpp_ops_are_checked_when_built(make, match):
    with pytest.raises(ValueError, match=match):
        make()


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
        ops.op_specs([ops.Normalize((0,) * 3, (1,) * 3), ops.CenterCrop(4)])
    with pytest.raises(TypeError, match="stoker.ops.Op"):
        ops.op_specs([("center_crop", [4, 4])])


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


def test_subclass_errors_are_clear_at_construction_or_at_loader(tmp_path):
    class Unknown(ops.Op):
        kind = "sharpen"
        num_args = 1

        def args(self):
            return [1.0]

    class Bad(ops.Op):  # a C++ kind, a value out of range: the C++ op says which
        kind = "center_crop"
        num_args = 2

        def args(self):
            return [0, 4]

    with pytest.raises(ValueError, match="no C\\+\\+ image op of kind 'sharpen'"):
        Unknown().build()
    with pytest.raises(ValueError, match="CenterCrop: h must be a positive whole number"):
        ops.op_specs([Bad()])
    fields = {"image": stoker.image()}
    with stoker.ShardWriter(tmp_path / "d", fields) as w:
        w.write({"image": _png(8, 8)})
    for op, match in ((Unknown(), "sharpen"), (Bad(), "CenterCrop: h")):
        with pytest.raises(ValueError, match=match):
            stoker.Loader(tmp_path / "d", batch_size=1, transforms={"image": [op]})


def _png(h, w):
    import io

    import numpy as np
    Image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_a_new_op_subclass_reaches_the_cpp_pipeline():
    class Square(ops.Op):
        """Center square crop of a fixed side (a user-defined op reusing a C++ kind)."""
        kind = "center_crop"
        num_args = 2

        def __init__(self, side):
            self.side = side

        def args(self):
            return [self.side, self.side]

    assert _core.decode_image(_png(10, 12), ops.op_specs([Square(4)])).shape == (4, 4, 3)
    assert Square(4).build() == _core.CenterCrop(4, 4)


def test_public_names():
    assert set(ops.__all__) == {"Op", "RandomResizedCrop", "Resize", "CenterCrop",
                                "RandomHorizontalFlip", "Normalize", "ColorJitter",
                                "RandomGrayscale", "GaussianBlur", "HSVJitter", "RandAugment",
                                "TrivialAugmentWide", "AutoAugment", "RandomErasing",
                                "RandomCrop", "Pad", "RandomVerticalFlip", "Letterbox",
                                "RandomRotation", "RandomAffine", "RandomPerspective",
                                "SanitizeBoundingBoxes", "Mosaic", "DetectionMixUp", "CopyPaste",
                                "BatchOp", "MixUp", "CutMix", "ClipOp", "RandomClip",
                                "CenterClip", "AudioCropOp", "RandomAudioCrop",
                                "CenterAudioCrop"}
    assert stoker.ops is ops
    for name in ops.__all__:
        assert getattr(ops, name).__doc__ and "Example" in getattr(ops, name).__doc__
