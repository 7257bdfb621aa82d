"""`cclctl probe`'s measuring options: checked once, then handed to every rank as JSON, so
the parent and the ranks cannot disagree about the schedule or the sizes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cclctl.errors import BadInput, ConfigError
from cclctl.probe.schedule import PAIRS

DIRECTIONS = ("each", "both")
DEFAULT_SMALL = 8
DEFAULT_LARGE = 4 << 20
DEFAULT_TIMEOUT_S = 5.0
#: The most a link may carry in one message: a probe measures, it does not fill memory.
MAX_LARGE = 1 << 30


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    """``small``: the latency message (bytes); ``large``: the bandwidth message; ``iters``
    timed round trips for a latency (their median is the figure); a bandwidth is the median
    of as many timed transfers as fit ``budget_s`` (1 to 64); ``warmup`` untimed transfers
    first; ``timeout_s``: how long one transfer may take before its link counts as
    unreachable."""

    small: int = DEFAULT_SMALL
    large: int = DEFAULT_LARGE
    iters: int = 10
    warmup: int = 1
    budget_s: float = 0.25
    direction: str = "each"
    pairs: str = "all"
    rounds: int | None = None
    seed: int = 0
    per_host: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ConfigError(
                f"--direction {self.direction!r}: choose each or both", flag="--direction"
            )
        if self.pairs not in PAIRS:
            raise ConfigError(f"--pairs {self.pairs!r}: choose from {', '.join(PAIRS)}",
                              flag="--pairs")  # fmt: skip
        if self.small < 8:
            raise ConfigError(f"-b {self.small}: the latency message is at least 8 bytes",
                              flag="-b")  # fmt: skip
        if not self.small <= self.large <= MAX_LARGE:
            raise ConfigError(
                f"-e {self.large}: the bandwidth message is from -b ({self.small}) to 1G",
                flag="-e",
            )
        if self.iters < 1:
            raise ConfigError(f"-n/--iters {self.iters} must be at least 1", flag="--iters")
        if self.warmup < 0:
            raise ConfigError(f"-w/--warmup {self.warmup} must not be negative", flag="--warmup")
        if self.rounds is not None and self.rounds < 1:
            raise ConfigError(f"--rounds {self.rounds} must be at least 1", flag="--rounds")
        if not self.timeout_s > 0:
            raise ConfigError(f"-T/--timeout {self.timeout_s} must be above 0", flag="--timeout")
        if not self.budget_s > 0:
            raise ConfigError(f"--budget {self.budget_s} must be above 0", flag="--budget")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, text: str) -> ProbeOptions:
        try:
            data = json.loads(text)
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        except (ValueError, TypeError, AttributeError) as exc:
            raise BadInput(f"probe options are malformed: {exc}", where="probe") from None
