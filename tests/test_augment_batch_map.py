"""batch_map with code that draws from torch's global generator (kornia.augmentation,
torchvision.transforms.v2 on tensors, torch.rand): each call runs with torch's generators
forked and seeded from (seed, epoch, rank, world size, batch) (NOTE [ torch's generator in
batch_map ] in stoker/_stage/rng.py), so batches are the same for any thread count, run to
run, and after a resume; the loop's own generator is left as it was."""

import io

import numpy as np
import pytest
import stoker
import torch
from PIL import Image

K = pytest.importorskip("kornia.augmentation")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch_map") / "ds"
    rng = np.random.default_rng(0)
    with stoker.ShardWriter(path, {"image": stoker.image(), "label": stoker.scalar("int64")},
                            shard_size="16KB") as w:
        for i in range(40):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buf, "PNG")
            w.write({"image": buf.getvalue(), "label": i})
    return stoker.Dataset(path)


AUG = K.AugmentationSequential(
    K.RandomAffine(degrees=15, translate=(0.1, 0.1), p=1.0),
    K.ColorJitter(0.3, 0.3, 0.3, 0.05, p=0.8),
    K.RandomHorizontalFlip(),
    K.RandomErasing(p=0.5),
)


def kornia_map(batch, rng):
    batch["image"] = AUG(batch["image"].float() / 255)
    batch["noise"] = torch.rand(len(batch["label"]))  # plain torch draws too
    return batch


def run(ds, threads, state=None, stop=None):
    """The epoch's batches (or the first `stop`, and the state after them); the loader is
    closed on return, so that none of its threads runs batch_map any more."""
    with stoker.Loader(ds, batch_size=8, shuffle=True, seed=5, num_threads=threads,
                       transforms={"image": [stoker.ops.RandomResizedCrop(16)]},
                       batch_map=kornia_map) as loader:
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for k, b in enumerate(loader):
            out.append({n: t.clone() for n, t in b.items()})
            if stop is not None and k + 1 == stop:
                return out, loader.state_dict()
        return out, None


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for n in x:
            torch.testing.assert_close(x[n], y[n], rtol=0, atol=0, msg=n)


def test_kornia_in_batch_map_is_the_same_run_to_run_and_for_any_thread_count(ds):
    one, _ = run(ds, 1)
    again, _ = run(ds, 1)
    three, _ = run(ds, 3)
    assert len(one) == 5
    same(one, again)
    same(one, three)
    # the draws differ from batch to batch
    assert not torch.equal(one[0]["noise"], one[1]["noise"])


def test_kornia_in_batch_map_resumes_exactly(ds):
    full, _ = run(ds, 2)
    head, state = run(ds, 2, stop=2)
    rest, _ = run(ds, 1, state=state)
    same(head + rest, full)


def test_batch_map_leaves_the_loops_generator_alone(ds):
    """Once the loader is closed: while it runs, its threads' calls and the loop's own CPU
    draws share torch's one generator (docs/augment.md says to give the loop its own)."""
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    run(ds, 2)
    torch.testing.assert_close(torch.rand(3), want, rtol=0, atol=0)
