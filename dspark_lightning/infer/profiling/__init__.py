"""What measures the machine, once and never on a request's path.

- :mod:`.measure_hardware`: :func:`~.measure_hardware.measure_hardware`, this machine's
  :class:`~..hardware.HardwareProfile` for an engine (the parts its scheduler lacks, from the cache or measured
  once), which ``decode()`` hands the engine;
- :mod:`.measure_sps`: the target's steps per second SPS(B), profiled once per target and device and cached;
- :mod:`.measure_draft_cost`: the drafter's cost per round, profiled once and cached (``decode()``'s setup reads it
  for the hardware-aware schedulers);
- :mod:`.roofline`: the floor of a verification step on this machine (``dspark-lightning profile`` prints it).

Counting a round's device -> host synchronisations is a test aid (``HostReads`` in ``tests/infer/host_reads.py``); where
the time of a round goes is a benchmark (``benchmarks/profile_breakdown.py``).

The matrix-kernel choice (:mod:`dspark_lightning.infer.verify.kernels`) is measured by the lean verifier itself when it
is built without a table: its products need one before the first forward.
"""
