"""The folder ``cclctl run`` puts first on PYTHONPATH: it holds only ``sitecustomize``."""
