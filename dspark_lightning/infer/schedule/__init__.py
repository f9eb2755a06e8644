"""Scheduling: each request's verification length per round, from the confidences and the hardware
(:class:`~dspark_lightning.infer.protocols.Scheduler`).

- ``schedulers.py``: the registered schedulers and the draft gate;
- ``sps.py``: the target's steps per second SPS(B), profiled once per machine;
- ``draft_cost.py``: the drafter's cost per round, as the hardware-aware schedulers read it;
- ``clock.py``: round timings on the device's own timeline, the steps' times the schedulers observe.
"""
