"""Fault injection: deliberate defects so the harness can prove that its checks fail.

All faults are off unless asked for with `--fault NAME[=VALUE]` (repeatable) or the env
variable `SHADOWLAB_ENGINE_FAULTS="a,b=3"`.

- `stale-restore`: restore a checkpoint but re-enter one token late (the token at the
  checkpoint position is skipped), so the warm output differs from a cold recompute.
- `skip-cascade`: keep every checkpoint the cascade should erase, and log no erase lines.
- `wrong-conversation-restore`: the retention store (SHADOWLAB_CKPT_RETAIN_MIB) matches an
  entry by position only, never comparing its tokens with the prompt, so a request restores a
  checkpoint of another conversation's prefix and its output differs from a cold recompute.
  Inert without retention.
- `split-noise`: numerics that depend on where the prompt is split into batches, like GPU
  kernels whose results change with the batch shape: after each prefill batch the recurrent
  state gets a tiny perturbation drawn from the batch's end position (deterministic: the same
  split points give the same outputs, in any process). Restores stay correct, so a warm turn
  differs from cold exactly when its batch schedule does.
- `nondeterministic`: after each prefill batch the recurrent state gets a tiny perturbation
  drawn from a fresh random seed (time, pid, a counter), so two cold runs of one prompt differ.
- `log-timing-skew`: each `prompt eval time` line prints a prefill time 1 ms longer than the
  answer's `timings.prompt_ms` (a log that is not this answer's): requests sent concurrently
  can then not be tied to their tasks.
- `wrong-task-id`: each answer's `id_task` names the next task, not its own.
- `crash-after-requests=N`: the process exits hard right after answering N completion requests.
- `hang-on-request=N`: completion request N (1-based) never answers.
- `slow-start=S`: sleep S seconds before loading the model (`/health` answers 503 meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass

ENV_VAR = "SHADOWLAB_ENGINE_FAULTS"

_FLAGS = ("stale-restore", "skip-cascade", "wrong-conversation-restore", "split-noise", "nondeterministic",
          "log-timing-skew", "wrong-task-id")
_COUNTS = ("crash-after-requests", "hang-on-request")
_SECONDS = ("slow-start",)
KNOWN = _FLAGS + _COUNTS + _SECONDS
# Relative size of the split-noise / nondeterministic perturbation: large enough that greedy
# tokens of the case-study prompts flip on the tiny model (tests/engine/test_split_faults.py),
# far below the state's own magnitude.
PERTURB_SCALE = 1e-2


class FaultError(ValueError):
    """A fault spec that names no known fault or carries a bad value."""


@dataclass(frozen=True)
class Faults:
    stale_restore: bool = False
    skip_cascade: bool = False
    wrong_conversation_restore: bool = False
    split_noise: bool = False
    nondeterministic: bool = False
    log_timing_skew: bool = False
    wrong_task_id: bool = False
    crash_after_requests: int | None = None
    hang_on_request: int | None = None
    slow_start: float | None = None

    def names(self) -> list[str]:
        """The active faults as `NAME[=VALUE]` specs (for `/props`)."""
        out = []
        if self.stale_restore:
            out.append("stale-restore")
        if self.skip_cascade:
            out.append("skip-cascade")
        if self.wrong_conversation_restore:
            out.append("wrong-conversation-restore")
        if self.split_noise:
            out.append("split-noise")
        if self.nondeterministic:
            out.append("nondeterministic")
        if self.log_timing_skew:
            out.append("log-timing-skew")
        if self.wrong_task_id:
            out.append("wrong-task-id")
        if self.crash_after_requests is not None:
            out.append(f"crash-after-requests={self.crash_after_requests}")
        if self.hang_on_request is not None:
            out.append(f"hang-on-request={self.hang_on_request}")
        if self.slow_start is not None:
            out.append(f"slow-start={self.slow_start:g}")
        return out


def _split_env(env_value: str | None) -> list[str]:
    if not env_value:
        return []
    return [part.strip() for part in env_value.split(",") if part.strip()]


def _parse_one(spec: str) -> tuple[str, object]:
    name, sep, value = spec.partition("=")
    name = name.strip()
    if name not in KNOWN:
        raise FaultError(f"unknown fault {name!r} (known: {', '.join(KNOWN)})")
    if name in _FLAGS:
        if sep:
            raise FaultError(f"fault {name!r} takes no value")
        return name, True
    if not sep:
        raise FaultError(f"fault {name!r} needs a value: {name}=N")
    try:
        number = int(value) if name in _COUNTS else float(value)
    except ValueError:
        raise FaultError(f"fault {name!r}: {value!r} is not a number") from None
    if (name in _COUNTS and number < 1) or number < 0:
        raise FaultError(f"fault {name!r}: value {value!r} out of range")
    return name, number


def parse_faults(specs: list[str] | tuple[str, ...] = (), env_value: str | None = None) -> Faults:
    """Parse `--fault` specs plus the env variable's comma list into `Faults`."""
    values: dict[str, object] = {}
    for spec in [*_split_env(env_value), *specs]:
        name, value = _parse_one(spec)
        values[name.replace("-", "_")] = value
    return Faults(**values)  # type: ignore[arg-type]
