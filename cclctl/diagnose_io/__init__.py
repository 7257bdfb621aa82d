"""Input for the hang diagnosis: dump files and folders, a live job's statuses, and the state
of local processes. Everything that touches files, sockets or processes lives here (and in
the command), so :mod:`cclctl.diagnose` stays pure.
"""
