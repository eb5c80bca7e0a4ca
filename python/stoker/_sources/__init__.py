"""One class per kind of dataset: its plan-time checks, its wiring, and a running half
that owns its identity and its parts of the loader's state (DESIGN.md's layout).

So far the IterableDataset's (iterable.py: its running half is ``IterableRows`` in
stoker/_stage/iterable.py), and a stoker.Dataset's ``as_tuple`` check and per-epoch hook
(records.py); stoker datasets, map-style datasets, token datasets and mixtures are still
checked in stoker/_plan.py and wired in stoker/_build.py by ``LoaderPlan.source``."""
