"""stoker.RayService: a pool of Ray actors that compute loaders' batches (NOTE
[ Disaggregated loading ] in stoker/service/__init__.py)."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .._loader_args import check_int
from .base import Service

__all__ = ["RayService", "NAMESPACE"]

_log = logging.getLogger("stoker")

# The Ray namespace of shared pools' actors (RayService(name=...)): every process of a job
# finds them there whatever namespace its own ray.init() chose.
NAMESPACE = "stoker-service"
# A shared pool's members are looked up again this often (actors other processes added).
_REFRESH_SECONDS = 2.0
# Batches per part (NOTE [ Exactly once ] in dispatch.py): a part is one stream on an actor,
# so a few batches amortise its start and a part lost costs little.
DEFAULT_PART = 4


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("stoker.RayService needs Ray: pip install 'stoker[distributed]' "
                          "(Ray 2.9 or newer, on every node of the cluster with stoker "
                          "itself)") from None
    return ray


class RayService(Service):
    """A pool of Ray actors that run a loader's pipeline (read, decode, transforms, map)
    on any nodes of a Ray cluster, and hand the batches to the training loop in order::

        svc = stoker.RayService(actors=8, cpus_per_actor=4)
        loader = stoker.Loader(ds, batch_size=256, shuffle=True, transforms=...,
                               service=svc)
        for batch in loader:        # the same batches as without service=, bit for bit
            ...

    Guarantees (docs/service.md): the same batches as the local loader, each exactly once
    per epoch whatever actors die or join (an actor's unfinished batches are computed
    again by the others), the same ``state_dict()``, and a resume on any actor count and
    any trainer world size. Batches in flight per trainer are bounded (the loader's
    ``prefetch``), and each is freed from the object store once the loop drops it.

    Args:
        actors: actors started now (more with :meth:`add`).
        cpus_per_actor: CPUs each actor reserves (Ray's ``num_cpus``), and the threads of
            its pipeline (unless the loader names ``num_threads``).
        name: shares the pool between processes: every process (the ranks of a job, a
            later job) that makes ``RayService(name=...)`` uses the same actors, started
            once (``actors`` is then how many the pool has at least). They live until
            :meth:`shutdown`, whatever process started them. None (default): the actors
            belong to this process and end with it.
        address: the cluster to connect to when this process is not connected yet
            (``ray.init(address=...)``); None: ``RAY_ADDRESS`` or a new local cluster. A
            Ray Train worker is connected already.
        actor_options: more of Ray's actor options (``resources=``, ``runtime_env=``,
            ``scheduling_strategy=``, ``label_selector=``...); the default spreads the
            actors over the nodes (``scheduling_strategy="SPREAD"``).
        replace_lost: start a new actor for each one lost (killed, its node gone), so the
            pool keeps its size (default True).
        part_batches: batches an actor computes per request (default 4).
    """

    def __init__(self, actors: int = 1, cpus_per_actor: int = 1, *, name: Optional[str] = None,
                 address: Optional[str] = None,
                 actor_options: Optional[Mapping[str, Any]] = None,
                 replace_lost: bool = True, part_batches: int = DEFAULT_PART):
        ray = _ray()
        actors = check_int("actors", actors, 0)
        self._cpus = check_int("cpus_per_actor", cpus_per_actor, 1)
        self._part = check_int("part_batches", part_batches, 1)
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        self._name = name
        self._options = dict(actor_options or {})
        self._replace = bool(replace_lost)
        if not ray.is_initialized():
            ray.init(address=address)
        self._members: List[Any] = []  # dispatch.Member
        self._refreshed = 0.0
        self._started = self._lost_count = 0
        if name is None:
            self.add(actors)
        else:
            for i in range(actors):
                self._start(f"{name}/{i}")
            self._refresh(force=True)

    # -- the pool ------------------------------------------------------------------------

    def _start(self, label: Optional[str] = None) -> Any:
        from .dispatch import Member
        from .worker import ServiceWorker

        ray = _ray()
        options: Dict[str, Any] = dict(num_cpus=self._cpus, max_restarts=0,
                                       max_concurrency=1, scheduling_strategy="SPREAD")
        options.update(self._options)
        if self._name is not None:
            options.update(name=label, namespace=NAMESPACE, lifetime="detached",
                           get_if_exists=True)
        else:
            label = label or f"actor-{self._started}"
        handle = ray.remote(ServiceWorker).options(**options).remote(label)
        self._started += 1
        member = Member(handle, str(label))
        if self._name is None:
            self._members.append(member)
        return member

    def add(self, n: int = 1) -> None:
        """Starts `n` more actors; loaders running now give them parts at once."""
        n = check_int("n", n, 0)
        for _ in range(n):
            self._start(None if self._name is None else f"{self._name}/{uuid.uuid4().hex[:8]}")
        self._refresh(force=True)

    def remove(self, n: int = 1) -> None:
        """Stops the `n` most recently started actors now. Their parts in flight are
        computed again by the others (nothing is lost); with replace_lost they are not
        replaced."""
        ray = _ray()
        n = check_int("n", n, 0)
        for m in list(reversed(self._live()))[:n]:
            m.dead = True
            m.removed = True
            ray.kill(m.handle, no_restart=True)
        self._members = [m for m in self._members if not m.dead]

    def shutdown(self) -> None:
        """Stops every actor of the pool (a shared pool's too, for every process)."""
        ray = _ray()
        for m in self._live():
            m.dead = True
            m.removed = True
            try:
                ray.kill(m.handle, no_restart=True)
            except Exception:
                pass
        self._members = []

    @property
    def actors(self) -> List[Any]:
        """The live actors' handles (``ray.kill(svc.actors[0])`` to see a loss recovered)."""
        return [m.handle for m in self._live()]

    def ready(self, timeout: Optional[float] = None) -> List[Tuple[str, str, int]]:
        """Waits until every actor is up (within `timeout` seconds: Ray's GetTimeoutError
        after that, e.g. when the cluster has no room for them); (label, node id, pid) of
        each."""
        ray = _ray()
        members = self._live()
        out = ray.get([m.handle.hello.remote() for m in members], timeout=timeout)
        for m, (_, node, _) in zip(members, out):
            m.node = node
        return out

    @property
    def producers(self) -> int:
        return len(self._live())

    @property
    def threads_per_producer(self) -> int:
        return self._cpus

    def _live(self) -> List[Any]:
        self._refresh()
        return [m for m in self._members if not m.dead]

    def _refresh(self, force: bool = False) -> None:
        """A shared pool's members: its named actors alive now (other processes may have
        added some)."""
        if self._name is None:
            return
        now = time.monotonic()
        if not force and now - self._refreshed < _REFRESH_SECONDS:
            return
        from .dispatch import Member

        ray = _ray()
        self._refreshed = now
        prefix = f"{self._name}/"
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix))
        known = {m.label: m for m in self._members if not m.dead}
        members = []
        for label in names:
            m = known.get(label)
            if m is None:
                try:
                    m = Member(ray.get_actor(label, namespace=NAMESPACE), label)
                except ValueError:  # gone since the listing
                    continue
            members.append(m)
        self._members = members

    def _lost(self, member: Any, error: BaseException) -> None:
        """A fetcher found `member` failed: replaced (a shared pool's by the same name, so
        that processes that all saw it lost start one actor between them)."""
        self._lost_count += 1
        try:  # an actor only unreachable for now would otherwise stay, unused
            _ray().kill(member.handle, no_restart=True)
        except Exception:
            pass
        if self._name is None:
            self._members = [m for m in self._members if m is not member]
        if self._replace and not getattr(member, "removed", False):
            try:
                self._start(member.label if self._name is not None else None)
            except Exception as e:  # the cluster may have no room now: the others go on
                _log.warning("stoker: could not start an actor to replace %s: %s",
                             member.label, e)
            self._refresh(force=True)

    # -- loaders ---------------------------------------------------------------------------

    def _fetcher(self, spec: Any, window: int) -> Any:
        import ray.cloudpickle as cloudpickle

        from .dispatch import RayFetcher

        ray = _ray()
        try:
            blob = cloudpickle.dumps(spec)
        except Exception as e:
            raise TypeError(f"stoker: the loader's dataset and arguments must pickle to run "
                            f"on a service ({type(e).__name__}: {e})") from e
        pid = hashlib.blake2b(blob, digest_size=16).hexdigest()
        # nested in a list, the ref reaches the actor as a ref: it fetches the spec once
        return RayFetcher(self._live, self._lost, [pid, ray.put(blob)], window, self._part)

    def describe(self) -> str:
        shared = f", name={self._name!r}" if self._name is not None else ""
        return (f"RayService({self.producers} actors, cpus_per_actor={self._cpus}"
                f"{shared})")

    def stats(self) -> Dict[str, Any]:
        return {"live_actors": self.producers, "cpus_per_actor": self._cpus,
                "started": self._started, "lost": self._lost_count}

    def __repr__(self) -> str:
        return self.describe()

    # -- pickling: the same pool in another process (a Ray Train worker) -----------------

    def __getstate__(self) -> Dict[str, Any]:
        return {"cpus": self._cpus, "part": self._part, "name": self._name,
                "options": self._options, "replace": self._replace,
                "handles": [(m.handle, m.label) for m in self._members if not m.dead]}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        from .dispatch import Member

        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        self._cpus, self._part, self._name = d["cpus"], d["part"], d["name"]
        self._options, self._replace = d["options"], d["replace"]
        self._members = [Member(h, label) for h, label in d["handles"]]
        self._refreshed = 0.0
        self._started = self._lost_count = 0
        self._refresh(force=True)
