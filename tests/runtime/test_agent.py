"""The rank's agent: one per (process, rank), its services started once, the watchdog's
expiries sent to the front end whose communicator the call belongs to, and everything ended
by the last front end that releases it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cclctl.config import RuntimeConfig
from cclctl.records import CollectiveRecord
from cclctl.runtime.agent import FailureHooks, current, for_process


def _cfg(tmp_path: Path) -> RuntimeConfig:
    return RuntimeConfig(job="agent-test", trace_dir=str(tmp_path), timeout_s=1000.0)


def test_one_agent_per_rank_of_a_process_until_its_last_user_releases_it(
    tmp_path: Path,
) -> None:
    first = for_process(_cfg(tmp_path), rank=5, world_size=8)
    again = for_process(_cfg(tmp_path), rank=5, world_size=8)
    other = for_process(_cfg(tmp_path), rank=6, world_size=8)  # a thread rank of its own
    assert first is again and current(5) is first
    assert other is not first
    assert first.watch() is again.watch()  # one watchdog
    assert not first.release() and not first.closed  # another front end still uses it
    assert first.release() and first.closed and current(5) is None
    assert for_process(_cfg(tmp_path), rank=5, world_size=8) is not first
    assert current(5) is not None and current(5).release()  # type: ignore[union-attr]
    assert other.release()


def test_an_expired_call_goes_to_the_front_end_of_its_communicator(tmp_path: Path) -> None:
    agent = for_process(_cfg(tmp_path), rank=0, world_size=2)
    seen: list[tuple[str, str]] = []
    agent.register("0:0-1", [0, 1], FailureHooks(lambda rec, why: seen.append(("a", rec.comm))))
    agent.register("1:0-1", [0, 1], FailureHooks(lambda rec, why: seen.append(("b", rec.comm))))
    try:
        watchdog = agent.watch()
        for comm in ("1:0-1", "0:0-1", "9:0"):  # the last: nobody's, so the first front end's
            agent.telemetry.start(CollectiveRecord(comm, 1, "all_reduce", start_ns=1))
        watchdog.check(now_ns=2_000 * 10**9)
        assert sorted(seen) == [("a", "0:0-1"), ("a", "9:0"), ("b", "1:0-1")]
    finally:
        assert agent.release()


def test_the_dump_triggers_are_installed_by_the_first_front_end_only(tmp_path: Path) -> None:
    agent = for_process(_cfg(tmp_path), rank=3, world_size=4)
    for_process(_cfg(tmp_path), rank=3, world_size=4)
    installed: list[str] = []

    def install(who: str) -> list[Callable[[], None]]:
        installed.append(who)
        return [lambda: installed.remove(who)]

    undo = agent.install_dumps(lambda: install("runtime"))
    assert agent.install_dumps(lambda: install("torch")) == []
    assert installed == ["runtime"]
    for fn in undo:
        fn()
    assert installed == []
    assert not agent.release() and agent.release()
