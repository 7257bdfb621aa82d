"""Joining a job: init, rendezvous, job-wide signals and fault injection."""
