"""`cclctl probe`: every directed link of a job measured pair by pair, the slow ones named.

Pure parts (no I/O): :mod:`options`, :mod:`schedule` (who meets whom, round by round),
:mod:`model` (the measured run), :mod:`verdict` (which links and hosts are flagged),
:mod:`render` (matrix, lists and sentences) and :mod:`document` (the ``cclctl.probe`` JSON).
The rank side: :mod:`channel` (messages over the job's own transport, each with a deadline),
:mod:`session` (one pair's measurements), :mod:`rounds` (the schedule run, reported to
rank 0) and :mod:`worker` (a spawned rank).
"""
