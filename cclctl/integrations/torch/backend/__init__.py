"""The ``cclctl`` torch.distributed backend: torch's collectives on cclctl's runtime.

``registration`` (the name, the creator), ``joining`` (the communicator a group runs on),
``process_group`` (torch's calls to runtime calls), ``ops`` (the runtime calls of each),
``blocks`` (all_to_all of blocks of any sizes),
``views`` (tensors as host arrays), ``progress`` (a group's thread), ``work`` (its
``Work``). ``import cclctl.torch`` registers it; see ``docs/torch.md``.
"""
