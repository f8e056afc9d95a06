"""Live policy reload: a changed policy file, or SIGHUP, becomes the contract of new streams.

Rules:

1. Each stream takes the current :class:`~extproc.core.contract.Contract` once, when
   it starts (:class:`ContractHolder`), and keeps it to its end: a reload never
   changes the rules in the middle of a request. With envoy/standalone.yaml the
   response stream needs no contract at all: the plan travels in the metadata.
2. The file is watched by polling ``os.stat`` of what its path resolves to, every
   ``interval_s`` (1 s by default): the resolved path, device, inode, size, mtime and
   ctime. A Kubernetes ConfigMap volume replaces the file by re-pointing a ``..data``
   symlink at a new directory: the resolved path and inode change even when size and
   mtime do not. An in-place rewrite changes size or times.
3. A change is loaded once the stamp has held still for one poll, so a file caught
   half-written is not refused before it is complete. A stamp that failed to load is
   not tried again until it changes (one log line per broken version). SIGHUP loads
   at once, whatever the stamp says.
4. Loading (YAML, schema, tokenizers) runs in a worker thread. Tokenizers whose source
   and file are unchanged are reused (``load_contract(reuse=...)``): the tokenizers
   library holds the interpreter lock while it parses a tokenizer.json, which pauses
   the event loop, so only a new or replaced tokenizer costs that pause. A file that
   cannot be served is refused with one warning naming file, field and reason, and the
   running contract keeps serving. ``extproc_policy_reloads_total{outcome}`` counts
   both.
5. Envoy's buffer and message limits, and this server's gRPC message limit, were sized
   from the policy the process started with. A policy that needs more is served (its
   own checks apply), but a warning names each limit that is now too small and
   ``extproc_policy_envoy_limits_stale`` is 1 until a policy within them is loaded
   again; restarting applies the new limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import GatewayPolicy, PolicyError, load_policy_file
from extproc.core.tokens import TokenizerLoadError
from extproc.service.metrics import POLICY_ENVOY_LIMITS_STALE, POLICY_RELOADS

log = logging.getLogger("extproc.service.reload")

# (resolved path, device, inode, size, mtime ns, ctime ns) of the policy file.
FileStamp = tuple[str, int, int, int, int, int]


@dataclass(frozen=True)
class ReloadSettings:
    """Where the policy comes from, and whether to watch it. Unwatched, SIGHUP is
    still a reload: the operator decides when."""

    config: Path
    tokenizer_overrides: Mapping[str, Path] = field(default_factory=dict)
    watch: bool = True
    interval_s: float = 1.0
    # The file as it was just before the starting policy was read from it: a change
    # made after that stamp is loaded by the first polls.
    started_from: FileStamp | None = None


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
    """The sizes a policy asks of Envoy and of the gRPC hop (extproc/commands/
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

    def shortfalls(self, needed: EnvoyLimits) -> tuple[str, ...]:
        """One phrase per limit of ours that ``needed`` exceeds."""
        names = (
            ("request body buffer", self.request_body_bytes, needed.request_body_bytes),
            ("response buffer", self.response_buffer_bytes, needed.response_buffer_bytes),
            ("gRPC message", self.grpc_message_bytes, needed.grpc_message_bytes),
        )
        return tuple(f"{name} {want} bytes > {have}" for name, have, want in names if want > have)


def policy_stamp(path: Path) -> FileStamp | None:
    """None while the file is missing (mid-swap, or deleted: keep serving)."""
    try:
        resolved = os.path.realpath(path)
        st = os.stat(resolved)
    except OSError:
        return None
    return (resolved, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# -- decisions (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class WatchState:
    loaded: FileStamp | None  # the file as it was when the running contract was read
    seen: FileStamp | None = None  # the previous poll's stamp
    refused: FileStamp | None = None  # the last stamp that failed to load


def after_poll(state: WatchState, stamp: FileStamp | None) -> tuple[WatchState, bool]:
    """(next state, load now?) for one poll of the watch."""
    settled = stamp is not None and stamp == state.seen
    load = settled and stamp not in (state.loaded, state.refused)
    return WatchState(state.loaded, stamp, state.refused), load


def after_load(state: WatchState, stamp: FileStamp | None, ok: bool) -> WatchState:
    if ok:
        return WatchState(stamp, state.seen, None)
    return WatchState(state.loaded, state.seen, stamp)


# -- the shell ----------------------------------------------------------------------


class PolicyReloader:
    """Watches the policy file and answers SIGHUP; swaps the holder's contract."""

    def __init__(
        self, settings: ReloadSettings, holder: ContractHolder, running: EnvoyLimits
    ) -> None:
        self._settings = settings
        self._holder = holder
        self._running = running
        self._state = WatchState(loaded=None)
        self.hangup = asyncio.Event()
        POLICY_RELOADS.labels("reloaded")
        POLICY_RELOADS.labels("rejected")
        POLICY_ENVOY_LIMITS_STALE.set(0)

    def mark_loaded(self, stamp: FileStamp | None) -> None:
        """The running contract was read from the file as ``stamp`` describes (take the
        stamp before reading, so that a change made meanwhile is loaded again)."""
        self._state = WatchState(loaded=stamp, seen=stamp)

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: poll the file, and reload when it changed or on SIGHUP."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.hangup.wait(), self._settings.interval_s)
            if stop.is_set():
                return
            stamp = policy_stamp(self._settings.config)
            if self.hangup.is_set():
                self.hangup.clear()
                log.info("SIGHUP: reloading the policy from %s", self._settings.config)
                await self.reload(stamp)
                continue
            if not self._settings.watch:
                continue
            self._state, load = after_poll(self._state, stamp)
            if load:
                await self.reload(stamp)

    async def reload(self, stamp: FileStamp | None) -> bool:
        """Load the file off the event loop; on success new streams get it."""
        try:
            contract = await asyncio.to_thread(self._load, self._holder.current)
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
        POLICY_RELOADS.labels("reloaded").inc()
        log.info(
            "policy reloaded from %s: new streams use it (models: %s)",
            self._settings.config,
            ", ".join(contract.policy.models),
        )
        self._check_limits(contract.policy)
        return True

    def _load(self, reuse: Contract) -> Contract:
        policy = load_policy_file(
            self._settings.config, tokenizer_overrides=self._settings.tokenizer_overrides
        )
        return load_contract(policy, reuse=reuse)

    def _refuse(self, stamp: FileStamp | None, source: str, field: str, reason: str) -> None:
        self._state = after_load(self._state, stamp, ok=False)
        POLICY_RELOADS.labels("rejected").inc()
        log.warning(
            "policy reload rejected, the running policy stays: %s: %s: %s",
            source,
            field,
            " ".join(reason.split()),
        )

    def _check_limits(self, policy: GatewayPolicy) -> None:
        short = self._running.shortfalls(EnvoyLimits.for_policy(policy))
        POLICY_ENVOY_LIMITS_STALE.set(1 if short else 0)
        if short:
            log.warning(
                "the reloaded policy needs larger limits than Envoy and the gRPC server "
                "were started with (%s): larger requests or answers fail until a restart "
                "applies them",
                "; ".join(short),
            )
