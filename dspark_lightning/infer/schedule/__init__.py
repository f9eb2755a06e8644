"""Scheduling: each request's verification length per round, from the confidences and the hardware
(:class:`~.schedulers.Scheduler`, the base class every scheduler subclasses).

- ``schedulers.py``: the ``Scheduler`` base class, the registered schedulers and the draft gate;
- ``sps.py``: the table of the target's steps per second SPS(B) (measured by ``infer/profiling/measure_sps.py``);
- ``draft_cost.py``: the drafter's cost per round, as the hardware-aware schedulers read it;
- ``clock.py``: round timings on the device's own timeline, the steps' times the schedulers observe.
"""
