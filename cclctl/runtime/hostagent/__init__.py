"""The host agent: one process per host that carries its ranks' statuses to the job's store.

Each rank sends its status to the agent of its host over a local socket
(:mod:`.route`); the agent (:mod:`.server`) writes them as one document per status interval
(:mod:`cclctl.host_status`), so the store takes one write per host instead of one per rank.
The host's first local rank starts it (:mod:`.spawn`); a rank that finds no agent, or loses
it, publishes its own status as before, and the agent's death never stops a rank. The
agent also carries its ranks' rendezvous claims to the store as one group and answers them
with the job's world document (:mod:`.rendezvous`, :mod:`.fanin`), and holds the host's
one wait on the job's revoke record and hands it to its ranks (:mod:`.revoke_fanout`,
:mod:`.revoke_feed`); a rank it does not answer waits itself.
"""
