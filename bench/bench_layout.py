"""What a stoker image batch's layout costs the training loop.

stoker hands image batches out as [N, 3, H, W] uint8; decoded HWC (the default), that is
the batch's memory viewed with channels_last strides. This times, on the same batch, in
one run:

  * the view itself (what the loader does per batch: a permute),
  * ``.contiguous()`` (a plain NCHW copy, for code that needs one),
  * ``.clone()`` of the same bytes (a straight copy: the peer the reorder is compared to),
  * ``.float()`` keeping channels_last (what a channels-last model's first step does).

    python bench/bench_layout.py [--batch 256] [--size 224] [--repeats 20]

Medians over the repeats, and the ratio of ``.contiguous()`` to ``.clone()``.
"""

import argparse
import statistics
import time

import torch


def median_seconds(fn, repeats):
    fn()  # warm: allocator, page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)  # the training loop's thread; comparable across machines
    hwc = torch.randint(0, 256, (a.batch, a.size, a.size, 3), dtype=torch.uint8)
    nchw = hwc.permute(0, 3, 1, 2)  # what the loader delivers
    assert nchw.is_contiguous(memory_format=torch.channels_last)
    mb = hwc.numel() / 1e6
    rows = [
        ("view as NCHW (the loader, per batch)", median_seconds(lambda: hwc.permute(0, 3, 1, 2),
                                                                a.repeats)),
        (".contiguous() (NCHW copy)", median_seconds(lambda: nchw.contiguous(), a.repeats)),
        (".clone() (same bytes, same order)", median_seconds(lambda: nchw.clone(), a.repeats)),
        (".float() (stays channels_last)", median_seconds(lambda: nchw.float(), a.repeats)),
    ]
    print(f"uint8 batch [{a.batch}, 3, {a.size}, {a.size}] ({mb:.1f} MB), 1 thread, "
          f"median of {a.repeats}")
    for name, s in rows:
        print(f"  {name:40s} {s * 1e3:9.3f} ms")
    print(f"  .contiguous() / .clone(): {rows[1][1] / rows[2][1]:.2f}x")


if __name__ == "__main__":
    main()
