"""One version chain for every versioned file of a run directory (asv's habit).

    META.read(data, source=path)      the object upgraded to META.current, or RunDirError

Each file kind states its version key, the version this shadowlab writes, and one upgrade per
step (n -> n + 1); reading refuses a file newer than it understands (naming the file, both
versions and what to do) instead of misreading it, and upgrades an older one step by step.
meta.json, verdicts.json, plan.json, shard.json and merge.json all go through ``Versioned.read``,
so there is one mechanism, and the upgrades themselves live beside the schema they upgrade
(records.py for meta.json, verdict_schema.py for verdicts.json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shadowlab.errors import RunDirError
from shadowlab.results.codec import json_type_name
from shadowlab.results.layout import RunLayout

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Versioned:
    """A versioned file kind. ``upgrades[n]`` turns a version-n object into a version-(n + 1)
    one (it may leave the key alone: the chain sets it). ``default``: the version of a file that
    states none (None: the key is required)."""

    name: str  # the file, as a message names it
    key: str  # the key holding its version
    current: int  # the version this shadowlab writes
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)
    default: int | None = None
    hint: str = "upgrade shadowlab to read this run directory"

    def version_of(self, data: Mapping[str, Any], *, source: str) -> int:
        """The stated version; RunDirError when it is no positive integer or newer than ours."""
        version = data.get(self.key, self.default)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RunDirError(f"no valid {self.key} ({json_type_name(version)})", path=source)
        if version > self.current:
            raise RunDirError(f"{self.name} {self.key} {version} is newer than this shadowlab understands "
                              f"({self.current})", path=source, hint=self.hint)
        return version

    def read(self, data: Any, *, source: str) -> dict[str, Any]:
        """``data`` (a parsed JSON object) upgraded step by step to ``current``."""
        if not isinstance(data, dict):
            raise RunDirError(f"{self.name} is not a JSON object", path=source)
        version = self.version_of(data, source=source)
        while version < self.current:
            step = self.upgrades.get(version)
            if step is None:
                raise RunDirError(f"{self.name} {self.key} {version} is older than this shadowlab reads "
                                  f"(it reads {min(self.upgrades, default=self.current)} to {self.current})",
                                  path=source, hint="rerun with the shadowlab that wrote it")
            data = {**step(data), self.key: version + 1}
            version += 1
        return data


# The files without upgrades yet (their first version is the only one). meta.json's chain is
# records.META, verdicts.json's verdict_schema.VERDICTS.
PLAN = Versioned(RunLayout.PLAN, "plan_version", 1, default=1)
SHARD = Versioned(RunLayout.SHARD, "shard_version", 1, hint="merge with a newer shadowlab")
MERGE = Versioned(RunLayout.MERGE, "merge_version", 1)


__all__ = ["MERGE", "PLAN", "SHARD", "Upgrade", "Versioned"]
