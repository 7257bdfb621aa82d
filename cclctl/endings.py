"""How a rank's process ended other than cleanly: a rank document's ``ending`` field.

An exception ended it (``uncaught``) or a signal stopped it (``terminated``). The writer of
the document words its ``reason`` to begin with :data:`ENDING_WORDS` (``uncaught
RuntimeError: ...``, ``terminated by SIGTERM``) for people, and sets ``ending`` for readers,
which never parse the reason; :func:`ending_of` reads it back from a document written before
the field existed.
"""

from __future__ import annotations

ENDING_UNCAUGHT, ENDING_TERMINATED = "uncaught", "terminated"
ENDING_WORDS = {ENDING_UNCAUGHT: "uncaught ", ENDING_TERMINATED: "terminated by "}


def ending_of(reason: str) -> str:
    """The ending a process's own ``reason`` gives (its writer words it with
    :data:`ENDING_WORDS`); "" for any other reason. A document from before the ``ending``
    field reads this way."""
    return next((kind for kind, words in ENDING_WORDS.items() if reason.startswith(words)), "")
