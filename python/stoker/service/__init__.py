"""Disaggregated loading: a loader whose batches are made by a pool of producers on other
machines (``stoker.Loader(ds, ..., service=stoker.RayService(actors=8, cpus_per_actor=4))``),
with the local loader's batches, exactly once per epoch, and its resume state.

Modules, each importing only those before it: ``base`` (what a Loader asks of a service),
``checks`` (the plan's checks of ``service=``), ``pipeline`` (the replica a producer runs),
``wire`` (a batch in transit), ``stage`` (the loader's side: next() and stats), ``worker``
(the actor), ``dispatch`` (parts, the window, recomputation), ``ray_service`` (the pool).

NOTE [ Disaggregated loading ]
A batch is a pure function of its segment's key (epoch, rank, world size, offset,
pad_from) and its number (csrc/pipeline/batch_producer.h), so any process that holds the
same pipeline can make any batch, and make it again, identically. The service is built on
that, and on nothing else:

  trainer rank r (any process)                         actors (any nodes of the cluster)
  -------------------------------                      --------------------------------------
  Loader(ds, ..., service=svc)                         ServiceWorker: a replica of the loader
    core over placeholders: epochs, skip,                (Loader(ds, **arguments), built once
    resume, state_dict, len (the local rules)            from the pipeline's spec)
    iter(): claims segment K ------ parts of K ------>  run_part(K, first, count): the
    next(): batch j of K from the part that holds        replica's threads stream the part
      it  <------- objects in Ray's store ---------      (read, decode, ops, map, collate),
      then the placeholder: the core counts j            the part's batches: one object
    state_dict(): the core's (batches taken)

* The same batches: an actor runs the loader's own pipeline on the segment the trainer's
  core names, from where the part starts (NOTE [ Parts ] in csrc/pipeline/loader_core.h),
  so batch j is the local loader's batch j bit for bit, with its random transforms and
  map's per-sample generators (keyed by seed, epoch and index, never by the actor).
* Exactly once: the trainer takes batches in order and counts each once (its core), while
  which actor makes it, or makes it again, is free (NOTE [ Exactly once ] in dispatch.py).
  An actor lost mid-part costs its unfinished batches, computed again by the others; an
  actor that joins takes the next part. tf.data service's dispatcher hands out splits
  at most once (a worker's lost split is lost) and Ray Data's streaming_split coordinator
  hands blocks to consumers from one stream, in no reproducible order and with no
  checkpoint; here the order is the loader's and the checkpoint its state_dict().
* Resume: state_dict() is the local loader's (the epoch and the samples the job took),
  so it resumes on any number of actors, on the local loader, or at another trainer world
  size (the local rules: the resumed segment's key carries the new world and pad_from).
* Bounded: at most the window's batches per iterator are submitted and not taken (the
  loader's prefetch, or two parts per actor), each freed from the store once the loop
  drops its tensors (NOTE [ Batch transport ] in wire.py).
* Shared: several trainer ranks (or loaders of one pipeline) use one pool; an actor keeps
  a replica per pipeline, and each part names its rank and world.
"""

from .base import Service
from .ray_service import RayService

__all__ = ["RayService", "Service"]
