"""The Python stage's parts on their own (stoker/_stage/__init__.py lists them): each owns
its state and says it itself, without a loader around it."""

import threading

from stoker._stage.activity import Activity
from stoker._stage.deliveries import Deliveries, Delivery
from stoker._stage.pending import PendingBatches


class _Task:
    """What the parts read of a C++ task: its batch and whether its stream stopped."""

    def __init__(self, id, batch=0, epoch=0, samples=4):
        self.id, self.batch, self.epoch, self.samples = id, batch, epoch, samples
        self.rank, self.world_size = 0, 1
        self.stopped = False


class _Lease:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


def test_pending_batches_drop_the_stopped_ones_at_the_next_batch():
    pending = PendingBatches()
    a, b = _Task(1, batch=3), _Task(2, batch=1, epoch=1)
    pa = pending.of(a)
    assert pending.of(a) is pa and len(pending) == 1  # one record per task
    lease = _Lease()
    pa.leases.append(lease)
    pending.of(b)
    assert pending.oldest() is a  # by epoch, then batch
    a.stopped = True
    pending.of(_Task(3, batch=4, epoch=1))  # a new batch: the stopped one leaves
    assert len(pending) == 2 and lease.released == 1
    assert pending.oldest() is b
    pending.reset()
    assert len(pending) == 0 and pending.oldest() is None


def test_deliveries_are_not_purged_while_a_consumer_is_in_next():
    deliveries = Deliveries()
    task = _Task(1)
    ticket = deliveries.put(Delivery(task))
    task.stopped = True  # its stream stopped: the last batch of an epoch, not taken yet
    deliveries.enter()
    deliveries.enter()  # a second consumer (another iterator)
    for _ in range(64):  # at least one purge is due
        deliveries.put(Delivery(_Task(2)))
    assert not deliveries.leave()  # the other consumer is still in next()
    assert deliveries.take(ticket) is not None
    ticket = deliveries.put(Delivery(task))
    ran = [deliveries.leave()] + [(deliveries.enter(), deliveries.leave())[1]
                                  for _ in range(16)]
    assert any(ran) and deliveries.take(ticket) is None  # purged once nobody was in next()
    assert deliveries.error(0) is None


def test_activity_lists_the_threads_alive_and_their_own_records():
    activity = Activity()
    assert activity.current() is None  # the consumer's thread marks nothing
    go, done = threading.Event(), threading.Event()

    def work():
        d = activity.mine()
        assert activity.mine() is d and activity.current() is d
        d.at(7, "map")
        go.set()
        done.wait(10)

    t = threading.Thread(target=work, name="stage-thread")
    t.start()
    assert go.wait(10)
    (d,) = activity.threads()
    assert (d.name, d.phase, d.index) == ("stage-thread", "map", 7)
    assert activity.threads(lambda d: d.phase == "dataset") == []
    done.set()
    t.join()
    assert activity.threads() == []  # a thread that ended is not listed


def test_thread_init_runs_again_for_a_later_epoch_than_the_one_it_started_in():
    """worker_init_fn on threads, without persistent_workers: a thread started at iter()
    of epoch 0 that takes nothing of it runs init again before its first work of epoch 1
    (its init was for epoch 0); work of the epoch it started in runs no second init; a
    thread started with no epoch known (a stuck one's successor) counts its first work's
    epoch as its init's."""
    from stoker._stage.thread_init import ThreadInit

    class _Placement:
        processes = False

    # on a thread of its own, as the stage's are: started() makes its thread a worker
    # for get_worker_info(), which the tests after this one must not find in theirs
    failed = []
    t = threading.Thread(target=lambda: _thread_init_checks(ThreadInit, _Placement, failed))
    t.start()
    t.join()
    if failed:
        raise failed[0]


def _thread_init_checks(ThreadInit, _Placement, failed):
    try:
        _thread_init_body(ThreadInit, _Placement)
    except BaseException as e:
        failed.append(e)


def _thread_init_body(ThreadInit, _Placement):
    calls = []
    init = ThreadInit(calls.append, False, object(), 0, 2, _Placement())
    init.start_epoch = 0
    init.started(0)
    init.started(1)
    init.epoch(0, 0)  # thread 0: work of its start epoch
    init.epoch(1, 1)  # thread 1: nothing of epoch 0, work of epoch 1
    init.epoch(0, 1)
    assert calls == [0, 1, 1, 0]
    init.start_epoch = None
    init.started(1)
    init.epoch(1, 3)
    assert calls == [0, 1, 1, 0, 1]
    persistent = ThreadInit(calls.append, True, object(), 0, 2, _Placement())
    persistent.start_epoch = 0
    persistent.started(0)
    persistent.epoch(0, 2)
    assert calls == [0, 1, 1, 0, 1, 0]
