"""A live job seen through its store: every rank's published status, fetched and classified.

``cclctl top`` draws it and ``cclctl diagnose hang --store`` reasons over it, so nothing here
imports typer or rich: :mod:`.snapshot` fetches and parses, :mod:`.classify` names each
rank's state, :mod:`.culprit` reads the diagnosis onto the ranks (suspects, who waits on
them), :mod:`.document` and :mod:`.table` turn the result into JSON and table rows.
"""
