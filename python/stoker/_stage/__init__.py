"""The Python stage: ``map=``, ``batch_map=``, ``collate_fn=`` and map-style datasets.

Modules, each importing only those before it: ``rng`` (per-sample generators),
``errors`` (notes on user exceptions), ``telemetry`` (where the time goes), ``sources``
(stoker records, map-style datasets), ``pool`` (the threads), ``collate`` (native
batching), ``processes`` (worker processes), ``stage`` (the stage itself). The Loader's
arguments for it are checked in ``stoker/_plan.py``.

NOTE [ Python stage ]
User code runs in the loader's own Python threads ("stoker-python-N"), never on a C++
worker: no C++ thread ever calls into Python (csrc/README.md). The stage sits *inside* a
batch's ring slot, between the C++ planning of batch k and its publication to the reader:

  C++ workers (no GIL)                  Python threads (the loader's)
  --------------------                  ------------------------------------------------
  plan batch k: its sample indices      take(): a chunk of the oldest batch handed off
  (sampler: permutation, rank share,      (csrc/stage/python_handoff.h; waits with the
  padding, resume offset, epochs)  -->     GIL released)
  slot k stays claimed: it counts       for each sample j of the chunk, in position order:
  in the prefetch window                  fetch: a stoker Dataset's record read, verified,
                                            decoded and transformed in C++ (GIL released),
                                            or obj[j] for a map-style dataset
                                          map:   fn(sample, rng(seed, epoch, j))
                                        the thread that finishes the batch's last chunk:
                                          collate: native batching into a block of the
                                            loader's pool (collate.py), or collate_fn
                                          batch_map: gn(batch, rng(seed, epoch, batch))
  ring, in order of k             <--     complete(k): slot k is published
  [device copy] -> consumer next()

Why there, and what it keeps:
  * Order, window, memory: batch k is still slot k of its stream. The reader takes slots
    in order, so the consumer sees batch k whatever thread finished it first; the window
    bounds C++ and Python work in flight together; the block comes from the same pool.
  * Resume: the core counts the batches the consumer received (state_dict), never what
    the stage prepared; a resumed loader hands the stage exactly the remaining batches.
  * Stop, close, break, Ctrl-C, fork, two iterators: each stream hands off only its own
    batches; stop() closes the ring, so take() no longer returns that stream's chunks and
    completing one is a no-op. The consumer still waits in C++ in 20 ms slices (signals
    run), and the stage's threads wait in slices too, so close() joins them promptly.
  * Why the stage fetches samples itself instead of receiving a C++-assembled batch: a
    batch's layout (padding, one image size) is fixed before it is assembled, and map
    exists to change shapes. The C++ decode still runs with the GIL released, so T
    Python threads decode in parallel, and ``map=lambda s, rng: s`` gives the bytes the
    loader gives without map.
  * Determinism: ``rng`` depends only on (seed, epoch, dataset index); a sample's output
    goes to its position, and batches are assembled in position order, so the batches
    are bit-identical for any thread count. Code that draws from Python's global
    ``random``, ``np.random`` or torch's global generator depends on which thread ran
    first and how many samples it ran before: use ``rng``.
  * Errors: the user's exception object travels by ticket; the C++ batch carries only
    the ticket (a C++ thread never holds a Python object) and the consumer re-raises the
    original object, with its traceback and a note naming the sample (shard and record,
    or dataset index). Within a batch the lowest failing position wins, as in C++.
    ``on_error="skip"`` replaces the sample with the next one in dataset order whose
    fetch and map succeed (the C++ rule), counted in ``stats()["skipped"]``.
  * A batch over a stoker dataset with batch_map alone is assembled by the C++ workers
    as usual and handed off whole (one chunk): batch_map runs on it, no Python per
    sample. With a CUDA device, batch_map runs after the copy instead (NOTE [ batch_map
    on the device ]); the stage then only notes which batch it is.
  * Telemetry: each chunk's wall time (minus the C++ decode it called) is the
    ``python`` stage; the kernel's schedstat splits the rest into CPU time, time waiting
    for a core, and time blocked, which for threads running about one core's worth
    between them is the GIL ("GIL-bound" in the verdict; pipeline/autotuner.h).
  * Pure-Python code can run in worker processes instead (NOTE [ Python stage
    processes ] in processes.py): two stage threads per process hand it their
    chunks (as many chunks in a batch as workers); everything above is unchanged.
  * Threads: as many as num_threads, following the tuner's active count (parked
    threads hold neither the pool nor the loader); they end at close(), when the loader
    is dropped, and before the interpreter exits.
"""
