"""The runtime's settings, typed, each default stated once: :class:`RuntimeConfig`.

:class:`~layerfit.schedule.runtime.executor.Runtime` takes one (or the same fields as keywords,
which build one); :class:`~layerfit.serve.server.ServeSettings` embeds one, and the
command line's runtime options (:mod:`layerfit.cli.runtime_options`) set its fields one
to one. The library's defaults are the thesis's (one stored layer per task, every job
reads its weights); what a server changes, and why, is :data:`SERVER_OVERRIDES`, the one
place a command's runtime defaults differ.

Importing this module imports no PyTorch (the command line reads the defaults before it
knows which command runs): the checks that need the engine import it when they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from layerfit.errors import BudgetError, LayerfitError, ScheduleError
from layerfit.sizes import parse_bytes

ESTIMATES = ("capture", "profile")
AUTO_UNITS = "merge:auto"  # merge layers as far as the model's minimum budget allows
FREED_MEMORY = ("after-pass", "eagerly", "never")  # when freed scratch leaves the process


def freed_memory_mode(value: object, option: str = "return_freed_memory") -> str:
    """``value`` as one of :data:`FREED_MEMORY` (``True``/``False`` are the default and
    ``"never"``); raises naming ``option`` (a CLI's flag) for anything else."""
    if value is True:
        return "after-pass"
    if value is False:
        return "never"
    if value not in FREED_MEMORY:
        raise ScheduleError(f"{option} must be one of {', '.join(FREED_MEMORY)}, got {value!r}")
    return str(value)


def check_runtime_units(units: object, option: str | None = None) -> None:
    """Raise if ``units`` is no granularity the runtime takes: the engine's (``layers``,
    ``blocks:N``, ``merge:SIZE``) or ``merge:auto`` (before any model is opened); the
    error names ``option`` (a keyword or a flag) when given."""
    if not isinstance(units, str):
        raise ScheduleError(f"{option or 'units'} must be layers, merge:auto, merge:SIZE or blocks:N, got {units!r}")
    if units == AUTO_UNITS:
        return
    from layerfit.engine.units import check_units_spec  # imports PyTorch

    try:
        check_units_spec(units)
    except LayerfitError as exc:
        named = f"{option}: " if option else ""
        raise ScheduleError(f"{named}{exc}; the runtime also takes {AUTO_UNITS}") from exc


def size_setting(value: object, option: str) -> int:
    """``value`` in bytes: a number of bytes, or a size's text (``"512MB"``, read by
    :func:`~layerfit.sizes.parse_bytes`). Where a setting's text enters, it is read by
    this, once, and below that the setting is bytes; a refusal names ``option`` (the
    keyword, or the flag a command line spells it by)."""
    try:
        return parse_bytes(value)  # type: ignore[arg-type]  # anything else is refused
    except BudgetError as exc:
        raise BudgetError(f"{option}: {exc}") from None


def keyword(name: str) -> str:
    """A setting's name as the Python API spells it: its keyword (``validate``'s default)."""
    return name


@dataclass(frozen=True)
class RuntimeConfig:
    """Every setting of a :class:`~layerfit.schedule.runtime.executor.Runtime`, with its default.

    ``repository`` is the folder of prepared models (one sub-folder each);
    ``memory_budget`` the budget in bytes (given as bytes or as a size, ``"512MB"``,
    which creating the config reads, once: below it the budget is bytes, never text;
    text that is no size is refused then); ``workers`` the threads that run
    tasks; ``policy`` any of :func:`layerfit.schedule.policy_names` (``masa-fair``, the
    one that never goes over a budget every model fits alone in; ``masa`` is the thesis's
    Algorithm 1). The rest are keyword-only:

    - ``queue_limit`` — most unfinished jobs at once (``None``: no limit); beyond it
      ``submit`` raises :class:`~layerfit.errors.QueueFullError`;
    - ``estimates`` — ``"capture"`` or ``"profile"`` (the statm profiler runs each model
      a few times when it loads, thesis §5.3);
    - ``estimate_factor`` — scales every memory estimate the scheduler is told
      (sensitivity analysis, thesis §7.6); the real allocations do not change;
    - ``trace`` — keep every task's start and end, the ledger's history and every job's
      result for ``run_report`` (memory grows with the number of tasks);
    - ``load`` — load every model of the repository when the runtime starts;
    - ``direct_io`` — read units with ``O_DIRECT`` where the filesystem allows it;
    - ``gated`` — ``False`` runs a memory-oblivious policy (Bulk, DeepEye, FCFS, …) the
      way the thesis's EdgeCaffe baselines run: it ignores the budget and over-commits,
      leaving the operating system to page. Memory-aware policies keep the budget either way;
    - ``return_freed_memory`` — when the scratch that executions free leaves the process
      rather than staying resident in the C heap beside the budget (glibc only; it sets
      the whole process's allocator thresholds and one heap per CPU): ``"after-pass"``
      (or ``True``) when each network's forward pass ends; ``"eagerly"`` as soon as 128 KiB
      of a heap's top is free (a few MB less RSS, but a model that frees and allocates
      megabytes per layer computes up to twice as slowly); ``"never"`` (or ``False``)
      glibc's own adaptive thresholds (``bench/freed_memory.py`` compares the three);
    - ``units`` — what one load and one execute task cover: ``"layers"`` (one stored
      layer each, as the thesis schedules), ``"merge:auto"`` (consecutive layers joined
      as far as the model's minimum budget stays what it is by layers: fewer, larger reads
      and tasks, so less latency per request, at no cost in budget), ``"merge:SIZE"``
      (blocks of at most SIZE bytes; a larger layer stays alone) or ``"blocks:N"``;
    - ``cache_weights`` — keep units loaded by earlier jobs in the budget's spare memory
      (:class:`~layerfit.schedule.runtime.weight_cache.WeightCache`): a later job's load of the
      same unit takes it instead of reading it, and any task that needs the memory evicts
      it first, so the budget holds either way;
    - ``trust_factory`` — modules whose factories the repository's folders may run
      (:mod:`layerfit.store.trust`);
    - ``verify`` — when a unit's SHA-256 is checked: ``"first"`` (its first read by the
      model's engines), ``"always"`` (every read from storage; a cached unit is not read
      again) or ``"never"``; a unit that fails makes its model UNAVAILABLE until it is
      loaded again;
    - ``dequantize`` — a model prepared from a GGUF file computes with its weights
      dequantized to transformers' values (outputs bit-equal to its GGUF model) instead of
      packed (:class:`~layerfit.engine.config.EngineConfig`'s setting of that name).

    Creating one checks nothing else, so that a caller can check it naming its own options
    (``layerfit serve`` names flags): :meth:`validate` does, and the runtime calls it.
    """

    repository: str | Path
    memory_budget: int  # bytes (the constructor also takes a size's text)
    workers: int = 2
    policy: str = "masa-fair"
    _: KW_ONLY
    queue_limit: int | None = None
    estimates: str = "capture"
    estimate_factor: float = 1.0
    trace: bool = False
    load: bool = True
    direct_io: bool = True
    gated: bool = True
    return_freed_memory: bool | str = "after-pass"
    units: str = "layers"
    cache_weights: bool = False
    trust_factory: Iterable[str] | str = ()
    verify: str = "first"
    dequantize: bool = False

    def __post_init__(self) -> None:
        # the one place the Python API's budget text ("2GB") becomes bytes; a command line
        # reads its flag's text first (naming the flag), and bytes pass through unchanged
        object.__setattr__(self, "memory_budget", size_setting(self.memory_budget, "memory_budget"))

    def validate(self, name: Callable[[str], str] = keyword) -> None:
        """Raise :class:`~layerfit.errors.ScheduleError` for the first setting that cannot
        work, naming it as ``name`` spells a field: its keyword, or (``layerfit serve``)
        its flag. Each rule of the runtime's settings is here, once."""
        from layerfit.schedule.graph import check_estimate_factor
        from layerfit.schedule.policies import make_policy
        from layerfit.store.verify import VERIFY_MODES  # imports PyTorch

        if self.verify not in VERIFY_MODES:
            raise ScheduleError(f"{name('verify')} must be one of {', '.join(VERIFY_MODES)}, not {self.verify!r}")
        workers, queue_limit = self.workers, self.queue_limit
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ScheduleError(f"need at least one worker, got {workers!r} ({name('workers')})")
        if queue_limit is not None and (
            isinstance(queue_limit, bool) or not isinstance(queue_limit, int) or queue_limit < 1
        ):
            raise ScheduleError(f"{name('queue_limit')} must be a positive whole number, got {queue_limit!r}")
        if self.estimates not in ESTIMATES:
            raise ScheduleError(
                f"{name('estimates')} must be one of {', '.join(ESTIMATES)}, got {self.estimates!r}"
            )
        if not isinstance(self.policy, str):
            raise ScheduleError(f"{name('policy')} must be a policy's name, got {self.policy!r}")
        check_runtime_units(self.units, name("units"))
        if not isinstance(self.cache_weights, bool):
            raise ScheduleError(f"{name('cache_weights')} must be True or False, got {self.cache_weights!r}")
        freed_memory_mode(self.return_freed_memory, name("return_freed_memory"))
        if self.memory_budget <= 0:  # as the ledger says it
            raise ScheduleError(
                f"a memory budget must be positive, got {self.memory_budget} bytes ({name('memory_budget')})"
            )
        make_policy(self.policy, gated=self.gated)
        check_estimate_factor(self.estimate_factor, name("estimate_factor"))


#: What a server (``layerfit serve``, :class:`~layerfit.serve.server.ServeSettings`)
#: changes from :class:`RuntimeConfig`'s defaults, and why. The library and
#: ``layerfit schedule run`` keep the thesis's defaults, which its reproductions and the
#: tests of them assert: one stored layer per task, every job reading its weights, no
#: queue limit, the budget always given.
SERVER_OVERRIDES: Mapping[str, Any] = MappingProxyType(
    {
        # a server starts on a modest budget when none is given
        "memory_budget": "512MB",
        # latency per request: fewer, larger reads and tasks at the same minimum budget
        "units": AUTO_UNITS,
        # a server runs the same models again and again: reuse the units of earlier
        # requests from the budget's spare memory instead of reading them again
        "cache_weights": True,
        # a server answers 429 past this many requests rather than queue without bound
        "queue_limit": 64,
    }
)


def server_config(repository: str | Path, **settings: Any) -> RuntimeConfig:
    """A server's :class:`RuntimeConfig`: :data:`SERVER_OVERRIDES` over the defaults, and
    ``settings`` (any field) over both."""
    return RuntimeConfig(**{**SERVER_OVERRIDES, **settings, "repository": repository})


__all__ = [
    "AUTO_UNITS",
    "ESTIMATES",
    "FREED_MEMORY",
    "SERVER_OVERRIDES",
    "RuntimeConfig",
    "check_runtime_units",
    "freed_memory_mode",
    "keyword",
    "server_config",
    "size_setting",
]
