"""``python -m cclctl`` is the same as the ``cclctl`` command."""

from cclctl.cli import main

if __name__ == "__main__":
    main()
