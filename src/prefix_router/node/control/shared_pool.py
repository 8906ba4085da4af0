"""``serve --processes N``: one worker pool for all the processes, over the local channel.

- Admin changes (add, remove, drain, undrain a worker), made in whichever process the admin request
  reached, reach every process. Each worker name has three last-writer-wins registers, its membership
  (added with its config, or removed), its draining flag and its role (``PATCH``; an add sets it too),
  stamped ``(wall clock ns, process index)``.
  A process applies a register when a newer stamp arrives: in any order, more than once, after a restart
  (a fresh process starts from the configured workers and catches up). Every process sends its change at
  once and all its registers again every ``publish`` (once a second), so a lost message or a restarted
  process is made good within a second. At most ``MAX_NAMES`` names are kept (the oldest go).
- Health probes and engine scrapes run in process 0 only; their results go to the other processes
  (gathered for 50 ms, one message per round), which feed them to their pool and routing core exactly as
  their own would be (``WorkerPool.report``, ``MetricsScraper.apply``), so each engine sees one prober
  and one scraper, not N. A worker that passes a probe while not healthy is identified again too.
  Identification (``/v1/models`` every ``health.models_interval_s``) still runs in every process. Should
  process 0 die, the supervisor restarts it; meanwhile the others keep their last view and their passive
  health checks.
- What the token units learn (``routing/units.py``: a model's key bytes in engine tokens, from each
  report's ``usage.prompt_tokens``) is sent to the other processes the same way (``Router.on_units_sample``,
  ``Router.learn_units``): every process learns from every report, so they value a match alike and warm up
  together (each used to learn from its own reports only: a match valued 800 tokens in one, 686 in another).
- Dashboard sessions signed out in one process (``NodeState.revoked``) are revoked in every process: sent
  at once, and all of them again with every ``publish`` (a restarted process learns them within a second).

Worker configs travel with their API key: the channel's sockets live in a private directory (0700) of
the user running the router, and the key never leaves these processes' memory otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pydantic

from prefix_router.node.state import AdminChange, NodeState
from prefix_router.pool import EngineLoad, PoolError, Worker, WorkerSettings
from prefix_router.replication import LocalReplication
from prefix_router.routing import ROLES, Role

log = logging.getLogger("prefix_router.processes")
ADMIN, PROBE, SCRAPE, UNITS, SIGNED_OUT = b"A", b"P", b"E", b"U", b"O"
MAX_NAMES = 4096
PER_MESSAGE = 256  # registers per admin message
RELAY_DELAY_S = 0.05  # probe and scrape results gathered this long go out in one message
RELAY_MAX = 512  # results per message
LOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineLoad))
Stamp = tuple[int, int]
ZERO: Stamp = (0, 0)


@dataclass(slots=True)
class Registers:
    """What the admin API last said about one worker name."""

    member_at: Stamp = ZERO
    present: bool = True
    worker: dict[str, Any] | None = None  # the config of the last add (JSON, API key in clear)
    drain_at: Stamp = ZERO
    draining: bool = False
    role_at: Stamp = ZERO
    role: Role | None = None

    def latest(self) -> Stamp:
        return max(self.member_at, self.drain_at, self.role_at)

    def wire(self, name: str) -> dict[str, Any]:
        return {
            "n": name, "m": self.member_at, "p": self.present, "w": self.worker,
            "d": self.drain_at, "dr": self.draining, "ra": self.role_at, "r": self.role,
        }  # fmt: skip


class SharedPool:
    """This process's side (``index``) of the shared pool; ``install`` wires it into the node's state."""

    def __init__(
        self,
        state: NodeState,
        channel: LocalReplication,
        index: int,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.state, self.channel, self.index, self.wall_ns = state, channel, index, wall_ns
        self.leader = index == 0
        self.registers: dict[str, Registers] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._identifying: set[str] = set()  # bounded by the pool
        self._relay: dict[bytes, list[Any]] = {PROBE: [], SCRAPE: [], UNITS: []}
        self._relay_timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        monitor = self.state.monitor
        self.channel.subscribe(ADMIN, self._on_admin)
        self.channel.subscribe(PROBE, self._on_probe)
        self.channel.subscribe(SCRAPE, self._on_scrape)
        self.channel.subscribe(UNITS, self._on_units)
        self.channel.subscribe(SIGNED_OUT, self._on_signed_out)
        self.state.revoked.on_revoke = self._signed_out
        self.state.router.on_units_sample = self._sampled
        self.state.on_admin = self.admin_changed
        monitor.probe_and_scrape = self.leader
        if self.leader:
            monitor.prober.on_result = self._probed
            monitor.scraper.on_result = self._scraped

    # ------------------------------------------------------------ admin changes

    def admin_changed(self, change: AdminChange) -> None:
        """An admin change made in this process: stamp it, keep it, send it."""
        stamp = (self.wall_ns(), self.index)
        regs = self.registers.setdefault(change.name, Registers())
        if change.op in ("add", "remove"):
            regs.member_at, regs.present = stamp, change.op == "add"
            regs.worker = secret_dump(change.worker) if change.worker is not None else None
            if change.op == "add":
                regs.drain_at, regs.draining = stamp, False  # a worker added again starts undrained
                regs.role_at, regs.role = stamp, change.worker.role if change.worker is not None else None
        elif change.op == "role":
            regs.role_at, regs.role = stamp, change.role
        else:
            regs.drain_at, regs.draining = stamp, change.op == "drain"
        self._bound()
        self.channel.send(ADMIN, orjson.dumps([regs.wire(change.name)]))

    def publish(self) -> None:
        """Send every register and revoked session again (lost messages, restarted processes)."""
        for chunk in self._chunks():
            self.channel.send(ADMIN, orjson.dumps(chunk))
        revoked = list(self.state.revoked.items())
        for start in range(0, len(revoked), PER_MESSAGE):
            self.channel.send(SIGNED_OUT, orjson.dumps(revoked[start : start + PER_MESSAGE]))

    # ------------------------------------------------------------ dashboard sessions signed out

    def _signed_out(self, session_id: str, expiry: int) -> None:
        self.channel.send(SIGNED_OUT, orjson.dumps([[session_id, expiry]]))

    def _on_signed_out(self, payload: bytes) -> None:
        for session_id, expiry in orjson.loads(payload):
            self.state.revoked.apply(str(session_id), int(expiry))

    def _chunks(self) -> Iterator[list[dict[str, Any]]]:
        wires = [regs.wire(name) for name, regs in self.registers.items()]
        for start in range(0, len(wires), PER_MESSAGE):
            yield wires[start : start + PER_MESSAGE]

    def _on_admin(self, payload: bytes) -> None:
        for item in orjson.loads(payload):
            self._merge(item)

    def _merge(self, item: dict[str, Any]) -> None:
        name = item["n"]
        member_at, drain_at, role_at = stamp(item["m"]), stamp(item["d"]), stamp(item.get("ra", ZERO))
        regs = self.registers.get(name) or Registers()
        newer_member, newer_drain = member_at > regs.member_at, drain_at > regs.drain_at
        newer_role = role_at > regs.role_at and item.get("r") in ROLES
        if not (newer_member or newer_drain or newer_role):
            return
        self.registers[name] = regs
        if newer_member:
            regs.member_at, regs.present, regs.worker = (
                (member_at[0], member_at[1]),
                bool(item["p"]),
                item["w"],
            )
            self._apply_membership(name, regs)
        if newer_drain:
            regs.drain_at, regs.draining = drain_at, bool(item["dr"])
        if newer_role:
            regs.role_at, regs.role = role_at, next(r for r in ROLES if r == item["r"])
        worker = self.state.pool.get(name)
        if worker is not None and worker.draining != regs.draining and regs.drain_at != ZERO:
            self.state.pool.drain(name, regs.draining)
        if worker is not None and regs.role is not None and worker.role != regs.role:
            self.state.pool.set_role(name, regs.role)
        self._bound()

    def _apply_membership(self, name: str, regs: Registers) -> None:
        pool, here = self.state.pool, self.state.pool.get(name)
        if not regs.present and here is not None:
            pool.remove(name)
            self.state.metrics.forget_worker(name)
        elif regs.present and here is None and regs.worker is not None:
            try:
                worker = pool.add(WorkerSettings.model_validate(regs.worker))
            except (PoolError, pydantic.ValidationError) as exc:
                log.warning("admin change from another process not applied: %s", exc)
                return
            self._spawn(self.state.monitor.refresh(worker))

    def _bound(self) -> None:
        while len(self.registers) > MAX_NAMES:
            oldest = min(
                self.registers, key=lambda n: max(self.registers[n].member_at, self.registers[n].drain_at)
            )
            del self.registers[oldest]

    # ------------------------------------------------------------ probes and scrapes (process 0's)

    def _probed(self, worker: Worker, ok: bool, error: str | None) -> None:
        self._queue(PROBE, {"n": worker.name, "ok": ok, "e": error})

    def _scraped(self, worker: Worker, load: EngineLoad) -> None:
        self._queue(SCRAPE, {"n": worker.name, "l": dataclasses.asdict(load)})

    def _sampled(self, model: str, worker: str, nominal: int, reported: int, counts: Any) -> None:
        self._queue(UNITS, [model, worker, nominal, reported, counts])

    def _on_units(self, payload: bytes) -> None:
        """Another process's token-unit samples, learned here too (every process values matches alike)."""
        router = self.state.router
        for model, worker, nominal, reported, counts in orjson.loads(payload):
            router.learn_units(model, worker, int(nominal), int(reported), tuple(counts) if counts else None)

    def _queue(self, topic: bytes, item: Any) -> None:
        """One message per ``RELAY_DELAY_S`` (a probe round of hundreds of workers is one datagram, not
        hundreds: a process's receive queue holds only a few)."""
        pending = self._relay[topic]
        pending.append(item)
        if len(pending) >= RELAY_MAX:
            self.flush_relay()
        elif self._relay_timer is None:
            self._relay_timer = asyncio.get_running_loop().call_later(RELAY_DELAY_S, self.flush_relay)

    def flush_relay(self) -> None:
        if self._relay_timer is not None:
            self._relay_timer.cancel()
            self._relay_timer = None
        for topic, pending in self._relay.items():
            if pending:
                self.channel.send(topic, orjson.dumps(pending))
                pending.clear()

    def _on_probe(self, payload: bytes) -> None:
        for item in orjson.loads(payload):
            self._take_probe(item)

    def _take_probe(self, item: dict[str, Any]) -> None:
        worker = self.state.pool.get(item["n"])
        if worker is None:
            return
        ok, error = bool(item["ok"]), item["e"] if isinstance(item["e"], str) else None
        if ok and not worker.health.healthy and worker.name not in self._identifying:
            self._spawn(self._identify(worker))  # what it serves now, as process 0 looked before probing
        self.state.pool.report(worker, ok, error)  # at once, in the order process 0 sent them

    async def _identify(self, worker: Worker) -> None:
        self._identifying.add(worker.name)
        try:
            await self.state.monitor.identifier.identify(worker)
        finally:
            self._identifying.discard(worker.name)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_scrape(self, payload: bytes) -> None:
        for item in orjson.loads(payload):
            worker = self.state.pool.get(item["n"])
            if worker is not None:
                fields = {k: v for k, v in item["l"].items() if k in LOAD_FIELDS}
                self.state.monitor.scraper.apply(worker, EngineLoad(**fields))


def stamp(value: Any) -> Stamp:
    first, second = value
    return int(first), int(second)


def secret_dump(cfg: WorkerSettings) -> dict[str, Any]:
    """The config as JSON with its API key in clear (it is sent only between this router's processes)."""
    data = cfg.model_dump(mode="json")
    data["api_key"] = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    return data
