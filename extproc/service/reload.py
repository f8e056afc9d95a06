"""Live policy reload: a changed policy file, or SIGHUP, becomes the contract of new streams.

Rules:

1. Each stream takes the current :class:`~extproc.core.contract.Contract` once, when
   it starts (:class:`ContractHolder`), and keeps it to its end: a reload never
   changes the rules in the middle of a request. With envoy/standalone.yaml the
   response stream needs no contract at all: the plan travels in the metadata.
2. The file is watched by polling ``os.stat`` of what its path resolves to, every
   ``interval_s`` (1 s by default): the resolved path, device, inode, size, mtime and
   ctime (:class:`FileStamp`). A Kubernetes ConfigMap volume replaces the file by
   re-pointing a ``..data`` symlink at a new directory: the resolved path and inode
   change even when size and mtime do not. An in-place rewrite changes size or times.
   The polls run with or without the watch: unwatched, they only tell when the file
   has settled, for SIGHUP.
3. A file is read only once it has settled: its stamp unchanged over ``settle_s``
   (2 s by default) of polls, and its mtime at least that old (a file dated in the
   future, by a skewed clock, is judged by the polls alone). So a file caught
   half-written is never read, even when what was written so far parses (the presets
   would fill in what is missing). The watch then loads a settled stamp it has not
   loaded or refused; SIGHUP loads the file as soon as it is settled, whatever was
   loaded. The bytes parsed are those of that settled version
   (:func:`~extproc.service.policy_file.read_policy_file`): a write racing the read,
   or a change since the stamp settled, sends the watch back to waiting, unreported.
4. Only a regular file of at most 1 MiB is read. A path that resolves to a FIFO, a
   device, a directory or a socket, a dangling symlink, or nothing at all, is never
   opened in a way that can block: once that state has settled it is refused with
   one warning and one count, once per distinct state (a missing file mid-swap,
   shorter than ``settle_s``, is never reported).
5. Loading (YAML, schema, tokenizers, the prompt budget check of
   :func:`~extproc.service.contract_loading.load_contract`) runs in a worker thread.
   Tokenizers whose source and file are unchanged are reused
   (``load_contract(reuse=...)``): the tokenizers library holds the interpreter lock
   while it parses a tokenizer.json, which pauses the event loop, so only a new or
   replaced tokenizer costs that pause.
   A file that cannot be served is refused with one warning naming file, field and
   reason, and the running contract keeps serving; a refused stamp is not tried again
   until it changes. The :class:`PolicyReloadMetrics` the reloader is given counts both
   outcomes (``extproc_policy_reloads_total{outcome}``).
6. Each reload says what changed in effect (:mod:`extproc.core.policy.changes`): per
   model, per limit, models added and removed; or that nothing did.
7. What the process and its Envoy took from the starting policy cannot change by a
   reload (:class:`FixedAtStart`): Envoy's buffer and message limits and this server's
   gRPC message limit, and the precheck markers `extproc run` rendered into Envoy. A
   policy that needs others is served (its own checks apply), but a warning names each
   one and ``extproc_policy_settings_not_applied{setting}`` is 1 until a policy that
   fits is loaded again; a restart applies them. ``extproc_policy_envoy_limits_stale``
   is 1 while any limit is.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol, get_args

from extproc.core.contract import Contract
from extproc.core.policy import GatewayPolicy, PolicyError, load_policy_text
from extproc.core.policy.changes import policy_changes
from extproc.core.tokens import TokenizerLoadError
from extproc.service.contract_loading import load_contract
from extproc.service.memory import trim_heap
from extproc.service.policy_file import (
    FILE_FIELD,
    PolicyFileChangedError,
    PolicyFileVersion,
    read_policy_file,
)
from extproc.service.regular_file import REGULAR, kind_of, not_regular, stat_failure

log = logging.getLogger("extproc.service.reload")

# What a reload cannot change (the label values of extproc_policy_settings_not_applied).
LimitSetting = Literal["request_body_buffer", "response_buffer", "grpc_message"]
NotAppliedSetting = Literal[LimitSetting, "precheck_markers"]
LIMIT_SETTINGS: tuple[LimitSetting, ...] = get_args(LimitSetting)
NOT_APPLIED_SETTINGS: tuple[NotAppliedSetting, ...] = get_args(NotAppliedSetting)


class PolicyReloadMetrics(Protocol):
    """What the policy reloader reports, on the event loop. extproc/service/metrics.py
    keeps it in Prometheus."""

    def reloaded(self) -> None:
        """A policy file was loaded: new streams use it."""

    def rejected(self) -> None:
        """The policy file, or what its path leads to, cannot be served: the running
        policy stays."""

    def setting_not_applied(self, setting: NotAppliedSetting, not_applied: bool) -> None:
        """Whether the running policy needs ``setting`` otherwise than this process (and
        the Envoy `extproc run` rendered) started with: only a restart applies it."""

    def envoy_limits_stale(self, stale: bool) -> None:
        """Whether any of LIMIT_SETTINGS is not applied."""


@dataclass(frozen=True)
class ReloadSettings:
    """Where the policy comes from, and whether to watch it. Unwatched, SIGHUP is
    still a reload: the operator decides when."""

    config: Path
    tokenizer_overrides: Mapping[str, Path] = field(default_factory=dict)
    watch: bool = True
    interval_s: float = 1.0
    # How long a file must hold still (and its mtime be old) before it is read.
    settle_s: float = 2.0
    # The file as it was just before the starting policy was read from it: a change
    # made after that stamp is loaded by the first polls.
    started_from: FileStamp | None = None
    # The markers `extproc run` rendered into Envoy's precheck from the starting
    # policy (envoy_config.rendered_precheck_markers); None when this process renders
    # no Envoy, or its template has no precheck.
    precheck_markers: tuple[str, ...] | None = None


class ContractHolder:
    """The contract that new streams take. Replaced whole, on the event loop."""

    def __init__(self, contract: Contract) -> None:
        self._contract = contract

    @property
    def current(self) -> Contract:
        return self._contract

    def replace(self, contract: Contract) -> None:
        self._contract = contract


@dataclass(frozen=True)
class EnvoyLimits:
    """The sizes a policy asks of Envoy and of the gRPC hop (extproc/runtime/
    envoy_config.py renders them; server.py sets the gRPC one)."""

    request_body_bytes: int
    response_buffer_bytes: int
    grpc_message_bytes: int

    @classmethod
    def for_policy(cls, policy: GatewayPolicy) -> EnvoyLimits:
        return cls(
            request_body_bytes=policy.limits.max_request_bytes,
            response_buffer_bytes=policy.max_response_bytes(),
            grpc_message_bytes=policy.max_message_bytes(),
        )

    def shortfall_by_setting(self, needed: EnvoyLimits) -> dict[LimitSetting, str]:
        """Per setting (LIMIT_SETTINGS) of ours that ``needed`` exceeds, a phrase."""
        limits: tuple[tuple[LimitSetting, str, int], ...] = (
            ("request_body_buffer", "request body buffer", self.request_body_bytes),
            ("response_buffer", "response buffer", self.response_buffer_bytes),
            ("grpc_message", "gRPC message", self.grpc_message_bytes),
        )
        wanted = (
            needed.request_body_bytes,
            needed.response_buffer_bytes,
            needed.grpc_message_bytes,
        )
        return {
            setting: f"{name} {want} bytes > {have}"
            for (setting, name, have), want in zip(limits, wanted, strict=True)
            if want > have
        }


@dataclass(frozen=True)
class FixedAtStart:
    """What this process, and the Envoy `extproc run` rendered, took from the starting
    policy and keep until a restart."""

    limits: EnvoyLimits
    precheck_markers: tuple[str, ...] | None = None  # None: not rendered from the policy

    @classmethod
    def for_policy(
        cls, policy: GatewayPolicy, precheck_markers: tuple[str, ...] | None
    ) -> FixedAtStart:
        return cls(EnvoyLimits.for_policy(policy), precheck_markers)

    def not_applied(self, policy: GatewayPolicy) -> dict[NotAppliedSetting, str]:
        """Per setting (NOT_APPLIED_SETTINGS) that ``policy`` needs otherwise, why."""
        short = self.limits.shortfall_by_setting(EnvoyLimits.for_policy(policy))
        out: dict[NotAppliedSetting, str] = dict(short.items())
        rendered = self.precheck_markers
        if rendered is not None and set(policy.response_markers()) != set(rendered):
            out["precheck_markers"] = _markers_phrase(rendered, policy.response_markers())
        return out


def _markers_phrase(rendered: tuple[str, ...], needed: tuple[str, ...]) -> str:
    missing = [m for m in needed if m not in rendered]
    shown = ", ".join(rendered) or "none: no precheck"
    if missing:
        effect = (
            "requests naming them take the second ext_proc stream (right answers, one stream more)"
        )
    else:
        effect = "a request naming them may cost one ext_proc message more"
    return (
        f"precheck markers rendered into Envoy [{shown}], the policy needs "
        f"[{', '.join(needed) or 'none'}]: {effect}"
    )


# -- the file's state ---------------------------------------------------------------


@dataclass(frozen=True)
class FileStamp:
    """What the policy path resolves to, as the watch compares it. A path that is
    no regular file has a ``problem`` and no size or times (a FIFO written to stays
    the same state)."""

    resolved: str
    device: int = 0
    inode: int = 0
    size: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    problem: str | None = None  # why it is not read; None for a regular file

    @property
    def regular(self) -> bool:
        return self.problem is None

    @classmethod
    def of_version(cls, version: PolicyFileVersion) -> FileStamp:
        return cls(
            version.resolved,
            version.device,
            version.inode,
            version.size,
            version.mtime_ns,
            version.ctime_ns,
        )


def policy_stamp(path: Path) -> FileStamp:
    """The path's state now (``os.stat`` only: nothing is opened)."""
    source = os.fspath(path)
    resolved = os.path.realpath(source)
    try:
        st = os.stat(resolved)
    except OSError as exc:
        return FileStamp(resolved, problem=stat_failure(source, resolved, exc))
    kind = kind_of(st.st_mode)
    if kind != REGULAR:
        return FileStamp(resolved, st.st_dev, st.st_ino, problem=not_regular(kind, resolved))
    return FileStamp(resolved, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# -- decisions (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Now:
    monotonic: float  # seconds, for how long a stamp has held still
    wall_ns: int  # the clock file times are written with

    @classmethod
    def read(cls) -> Now:
        return cls(time.monotonic(), time.time_ns())


class Action(enum.Enum):
    WAIT = "wait"
    LOAD = "load"  # read and load the settled file
    REFUSE = "refuse"  # report the settled state of a path that is not read


@dataclass(frozen=True)
class WatchState:
    loaded: FileStamp | None  # the file as it was when the running contract was read
    seen: FileStamp | None = None  # the latest poll's stamp
    seen_at: float = 0.0  # when a poll first saw ``seen`` (monotonic seconds)
    refused: FileStamp | None = None  # the last stamp that failed to load or was refused
    hangup: bool = False  # SIGHUP: act on the file once it has settled


def settled(state: WatchState, now: Now, settle_s: float) -> bool:
    """The stamp seen has held still for ``settle_s`` and, for a regular file, its
    mtime is at least that old (or in the future: then the polls alone decide)."""
    seen = state.seen
    if seen is None or now.monotonic - state.seen_at < settle_s:
        return False
    age_ns = now.wall_ns - seen.mtime_ns
    return not (seen.regular and 0 <= age_ns < settle_s * 1e9)


def after_poll(
    state: WatchState, stamp: FileStamp, now: Now, *, settle_s: float, watch: bool
) -> tuple[WatchState, Action]:
    """(next state, what to do) for one poll of the file."""
    if stamp != state.seen:
        state = replace(state, seen=stamp, seen_at=now.monotonic)
    if not settled(state, now, settle_s) or not (watch or state.hangup):
        return state, Action.WAIT
    if state.hangup or stamp not in (state.loaded, state.refused):
        return state, Action.LOAD if stamp.regular else Action.REFUSE
    return state, Action.WAIT


def after_load(state: WatchState, stamp: FileStamp, ok: bool) -> WatchState:
    if ok:
        return replace(state, loaded=stamp, refused=None, hangup=False)
    return replace(state, refused=stamp, hangup=False)


def after_race(state: WatchState) -> WatchState:
    """The file changed since it settled: it must settle again (a SIGHUP still waits)."""
    return replace(state, seen=None)


# -- the shell ----------------------------------------------------------------------


class PolicyReloader:
    """Watches the policy file and answers SIGHUP; swaps the holder's contract and
    reports to ``metrics``, which show from the start that every setting is applied."""

    def __init__(
        self,
        settings: ReloadSettings,
        holder: ContractHolder,
        fixed: FixedAtStart,
        metrics: PolicyReloadMetrics,
    ) -> None:
        self._settings = settings
        self._holder = holder
        self._fixed = fixed
        self._metrics = metrics
        self._state = WatchState(loaded=None)
        self.hangup = asyncio.Event()
        metrics.envoy_limits_stale(False)
        for setting in NOT_APPLIED_SETTINGS:
            metrics.setting_not_applied(setting, False)

    def mark_loaded(self, stamp: FileStamp | None) -> None:
        """The running contract was read from the file as ``stamp`` describes (take the
        stamp before reading, so that a change made meanwhile is loaded again)."""
        self._state = WatchState(loaded=stamp, seen=stamp, seen_at=time.monotonic())

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: poll the file, and reload when it changed or on SIGHUP."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.hangup.wait(), self._settings.interval_s)
            if stop.is_set():
                return
            if self.hangup.is_set():
                self.hangup.clear()
                log.info(
                    "SIGHUP: reloading the policy from %s (as soon as it has held still for %g s)",
                    self._settings.config,
                    self._settings.settle_s,
                )
                self._state = replace(self._state, hangup=True)
            await self.poll()

    async def poll(self) -> None:
        stamp = policy_stamp(self._settings.config)
        self._state, action = after_poll(
            self._state,
            stamp,
            Now.read(),
            settle_s=self._settings.settle_s,
            watch=self._settings.watch,
        )
        if action is Action.LOAD:
            await self.reload(stamp)
        elif action is Action.REFUSE:
            self._refuse(stamp, str(self._settings.config), FILE_FIELD, stamp.problem or "")

    async def reload(self, stamp: FileStamp) -> bool:
        """Load the file, as ``stamp`` describes it, off the event loop; on success new
        streams get it."""
        old = self._holder.current
        try:
            contract = await asyncio.to_thread(self._load, old, stamp)
        except PolicyFileChangedError as exc:
            self._state = after_race(self._state)
            log.info("policy file %s %s: read again once it holds still", exc.source, exc.reason)
            return False
        except PolicyError as exc:
            self._refuse(stamp, exc.source, exc.field, exc.reason)
            return False
        except (TokenizerLoadError, ValueError, OSError) as exc:
            self._refuse(stamp, str(self._settings.config), "tokenizer", str(exc))
            return False
        except Exception as exc:  # never let a bad file end the watch
            self._refuse(stamp, str(self._settings.config), "<load>", type(exc).__name__)
            return False
        self._state = after_load(self._state, stamp, ok=True)
        self._holder.replace(contract)
        self._report_changes(old, contract)
        self._check_fixed(contract.policy)
        self._metrics.reloaded()  # last: whoever sees it sees the log too
        # A tokenizer.json parsed again leaves its freed heap mapped (server.py); a
        # reload is rare, so the trim is not worth deciding on.
        await asyncio.to_thread(trim_heap)
        return True

    def _load(self, reuse: Contract, expected: FileStamp) -> Contract:
        version = read_policy_file(self._settings.config)
        if FileStamp.of_version(version) != expected:
            raise PolicyFileChangedError(str(self._settings.config), FILE_FIELD, "changed")
        policy = load_policy_text(
            version.text,
            source=str(self._settings.config),
            tokenizer_overrides=self._settings.tokenizer_overrides,
        )
        return load_contract(policy, reuse=reuse)

    def _report_changes(self, old: Contract, new: Contract) -> None:
        lines = list(policy_changes(old.policy, new.policy).lines())
        # A tokenizer.json replaced under an unchanged policy entry: loaded again.
        lines += [
            f"{name}: tokenizer file replaced, loaded again"
            for name, key in new.tokenizer_keys.items()
            if name in old.tokenizer_keys
            and key != old.tokenizer_keys[name]
            and new.policy.models[name].tokenizer == old.policy.models[name].tokenizer
        ]
        models = ", ".join(new.policy.models)
        if not lines:
            log.info(
                "policy reloaded from %s: nothing changed in effect (models: %s)",
                self._settings.config,
                models,
            )
            return
        log.info(
            "policy reloaded from %s: new streams use it (models: %s)",
            self._settings.config,
            models,
        )
        for line in lines:
            log.info("policy change: %s", line)

    def _refuse(self, stamp: FileStamp, source: str, field: str, reason: str) -> None:
        self._state = after_load(self._state, stamp, ok=False)
        log.warning(
            "policy reload rejected, the running policy stays: %s: %s: %s",
            source,
            field,
            " ".join(reason.split()),
        )
        self._metrics.rejected()

    def _check_fixed(self, policy: GatewayPolicy) -> None:
        not_applied = self._fixed.not_applied(policy)
        for setting in NOT_APPLIED_SETTINGS:
            self._metrics.setting_not_applied(setting, setting in not_applied)
        short = [not_applied[s] for s in LIMIT_SETTINGS if s in not_applied]
        self._metrics.envoy_limits_stale(bool(short))
        if short:
            log.warning(
                "the reloaded policy needs larger limits than Envoy and the gRPC server "
                "were started with (%s): larger requests or answers fail until a restart "
                "applies them",
                "; ".join(short),
            )
        if "precheck_markers" in not_applied:
            log.warning(
                "the reloaded policy is served, but not as `extproc run` set Envoy up "
                "until a restart: %s",
                not_applied["precheck_markers"],
            )
