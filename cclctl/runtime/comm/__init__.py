"""The communicator: its collectives, calls, records, buffer checks and algorithm selection."""
