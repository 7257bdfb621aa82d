"""The job's store on an etcd cluster (``CCLCTL_STORE=etcd://h1:p1,h2:p2,...``).

For a control plane that must survive the loss of any one host: etcd replicates every key
over its members (raft), and :class:`~cclctl.store.etcd.client.EtcdClient` moves to
another member when the one it talks to is gone. The embedded store stays the default.
"""
