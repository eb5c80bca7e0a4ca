"""The Python stage: ``map=``, ``batch_map=``, ``collate_fn=`` and map-style datasets.

Modules, each importing only those before it: ``rng`` (per-sample generators),
``errors`` (notes on user exceptions), ``telemetry`` (where the time goes), ``sources``
(stoker records, map-style datasets), ``pool`` (the threads), ``structure`` (a sample's
structure, as default_collate sees it), ``collate`` (native batching), ``workers``
(DataLoader's worker protocol, the global random generators), ``state`` (what the
stage's parts agree on: the end of an epoch, the fork count), ``taking`` (how its threads
take chunks), ``transport`` (what crosses to a worker process: framing, arenas),
``lifecycle`` (a worker process's start and end), ``processes`` (worker processes),
``activity`` (what each stage thread is doing), ``pending`` (the batches being mapped),
``stall`` (what a late batch waits for, in words), ``stuck`` (workers stuck in user
code, replaced), ``deliveries`` (what a batch carries by ticket), ``views`` (the core's
tensors as the loop gets them), ``samples`` (one sample: fetched, mapped, checked; what a
worker process runs), ``probe`` (the watch on the global random generators),
``placement`` (threads or worker processes, and auto's move), ``thread_init``
(worker_init_fn on threads), ``chunks`` (a chunk's samples), ``assemble`` (a batch's
assembly), ``consumer`` (the batch the loop gets), ``stage`` (the stage: its parts, its
threads' life, next()), ``iterable`` (an IterableDataset's readings), ``iterable_stage``
(the stage that fills its batches: NOTE [ Iterable datasets ]).
The Loader's arguments for it are checked by the plan (``stoker/_plan.py``).

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
  * Nothing waits forever on user code: close() and the process's end join the threads
    for at most pool.JOIN_SECONDS; a thread still in user code is left behind (a daemon
    thread told to stop: when that code returns it drops its batch, whose stream
    stopped, and ends). Worker processes are ended within a few seconds (NOTE [ Worker
    faults ] in processes.py). A worker stuck past ``timeout``, or past the epoch it
    belonged to, is replaced (NOTE [ Stuck workers ] in stuck.py).
  * No value is a signal: the end of an epoch is the core's (stage.END), never a value
    a hook returned. collate_fn's None is a batch (as DataLoader yields it); batch_map's
    None is an error that names it.
  * A process forked inside user code that returns from it ends there (os._exit(0),
    Samples.check_fork in samples.py), in the loader's process as in a worker: it never
    completes a batch or writes a reply.
  * A stall says where: while the consumer waits for a batch longer than the slow
    first batch's time (2 s), next() logs what each stage thread or worker process is
    doing (map, the dataset read, collate_fn, batch_map), on which sample and since
    when (a worker's status is in memory it shares with the loader), at INFO, then at
    WARNING every 10 s (stall.py).
"""
