"""Hang diagnosis: rank documents (dumps or live statuses) in, a Diagnosis out.

Pure: nothing here opens a socket, a file or a process. :func:`engine.diagnose` is the entry
point; :mod:`.model` holds what it returns and :mod:`.report` words it for people.
"""
