"""Measuring tools beside the runtime, never on a request's path.

- :mod:`.draft_cost`: the drafter's cost per round, profiled once and cached (``decode()``'s setup reads it for the
  hardware-aware schedulers);
- :mod:`.breakdown`: ``dspark-lightning profile --breakdown verify|draft``, where the time of a round goes;
- :mod:`.roofline`: the floor of a verification step on this machine (``dspark-lightning profile`` prints it);
- :mod:`.syncs`: :class:`~.syncs.HostReads`, counting device -> host synchronisations of a round on any device.

The SPS profile (:func:`dspark_lightning.infer.profile_sps`) and the matrix-kernel choice
(:mod:`dspark_lightning.infer.kernels`) stay with the runtime: the schedulers and the lean verifier read them.
"""
