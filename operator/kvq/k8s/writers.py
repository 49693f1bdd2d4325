"""The threads that send kvq's writes: the most urgent pass's first, within one client-side
rate limit (client-go's QPS and burst).

Beyond the standard loop, kept for bench figures (README, "The path of one pass"): writes
are sent in their pass's priority order, not as they come (arrival order left the fallback
p95 at 37.4 s: a crashed engine's writes waited behind a fleet's routine ones), a crashing
service's writes already waiting are moved up (`promote`; without it 14.5 s), and at most
WRITERS are in flight, an engine's workload first within a priority. Writes the API server
serves one at a time have writers of their own (`SERIAL_KINDS`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvq.metrics import WRITE_WAIT_SECONDS

R = TypeVar("R")

DEFAULT_QPS = 1000.0
DEFAULT_BURST = 2000
# Writes in flight at once, whatever the workers. The API server serves what it is sent in
# its own order (priority and fairness queues by flow, not by kvq's urgency), so more in
# flight only moves the wait there, where a crash's write cannot pass a routine one (make
# bench, 1,000 services: one writer per worker, 256, fallback p95 42.1 s and each write
# seconds long; 32, see the README).
WRITERS = 32

# The API server allocates a Service's ClusterIP under one lock, held across the create of
# its IPAddress object (MetaAllocator.AllocateNextService, Kubernetes 1.33 and later): Service
# creates are served one at a time, however many are sent. Sent by the shared writers, a
# burst's Service applies held them: in `make bench` 1,000 of them took 2.5 s each on average
# (2,516 of the 32 writers' 3,840 seconds) while every other write of kvq waited. So they
# have writers of their own (with 4 or 16 in flight the lock served about 9 a second), and
# no pass waits for them (k8s.executor.Detached).
SERIAL_KINDS = frozenset({"Service"})
SERIAL_WRITERS = 16
SHARED, SERIAL = 0, 1
"""The lanes: the shared writers, and the writers of SERIAL_KINDS."""

# Within one priority: an engine's workload first (the cluster's controllers start on it
# while the rest is sent), then other objects and status in the order they come, then
# Events (no pass waits for them).
FIRST, IN_ORDER, LAST = 0, 1, 2


class RateLimit:
    """A token bucket: at most `burst` writes at once, refilled at `qps` a second. A caller
    over the limit reserves its token and sleeps until it is due (golang.org/x/time/rate)."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit: qps {qps} and burst {burst} must be positive")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """One token, waiting for it if need be; the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


@dataclass(eq=False)
class _Write:
    work: Callable[[], Any]
    done: Future[Any]
    key: Hashable | None
    urgency: int
    rank: int
    lane: int
    queued: float = field(default_factory=time.monotonic)


class Writers:
    """Threads that send API writes, the lowest urgency first, then the lowest rank, then in
    the order they came, in two lanes (SHARED, and SERIAL with `serial_threads` of its own)
    under one rate limit. A waiting write can be moved up (`promote`)."""

    def __init__(
        self,
        threads: int = WRITERS,
        limit: RateLimit | None = None,
        serial_threads: int = SERIAL_WRITERS,
    ) -> None:
        self._threads = {SHARED: threads, SERIAL: serial_threads}
        self._limit = limit or RateLimit()
        self._heaps: dict[int, list[tuple[int, int, int, _Write]]] = {SHARED: [], SERIAL: []}
        self._order = itertools.count()
        self._pending: dict[Hashable, set[_Write]] = {}
        self._floor: dict[Hashable, int] = {}
        """The urgency a key's writes have been moved up to, for writes still to come."""
        self._lock = threading.Lock()
        self._ready = {lane: threading.Condition(self._lock) for lane in self._heaps}
        self._started = False

    def configure(self, threads: int, limit: RateLimit) -> None:
        """Size and limit (`kvq run`'s --qps and --burst), before the first write."""
        with self._lock:
            if self._started:
                raise RuntimeError("writers: configure() after the first write")
            self._threads[SHARED], self._limit = threads, limit

    def submit(
        self,
        urgency: int,
        work: Callable[[], R],
        key: Hashable | None = None,
        rank: int = IN_ORDER,
        lane: int = SHARED,
    ) -> Future[R]:
        """`work` (one write) queued in `lane`; its result when sent."""
        if not self._started:
            self._start()
        with self._lock:
            if key is not None:
                urgency = min(urgency, self._floor.get(key, urgency))
            write = _Write(work, Future(), key, urgency, rank, lane)
            if key is not None:
                self._pending.setdefault(key, set()).add(write)
            self._put(write)
        return write.done

    def promote(self, key: Hashable, urgency: int) -> None:
        """`key`'s waiting writes, and those it sends until `settle`, go with `urgency`
        if that is more urgent. (A moved write is queued a second time; whichever entry is
        taken first runs, the other is skipped.)"""
        with self._lock:
            self._floor[key] = min(urgency, self._floor.get(key, urgency))
            for write in self._pending.get(key, ()):
                if urgency < write.urgency:
                    write.urgency = urgency
                    self._put(write)

    def settle(self, key: Hashable) -> None:
        """`key`'s pass is over: its next one sends with its own urgency."""
        with self._lock:
            self._floor.pop(key, None)

    def _put(self, write: _Write) -> None:
        entry = (write.urgency, write.rank, next(self._order), write)
        heapq.heappush(self._heaps[write.lane], entry)
        self._ready[write.lane].notify()

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            for lane, threads in self._threads.items():
                for index in range(threads):
                    threading.Thread(
                        target=self._serve, args=(lane,), name=f"kvq-write-{lane}-{index}",
                        daemon=True,
                    ).start()  # fmt: skip
            self._started = True

    def _take(self, lane: int) -> _Write:
        """The lane's most urgent write not yet taken (lock held; waits for one)."""
        heap = self._heaps[lane]
        while True:
            while not heap:
                self._ready[lane].wait()
            write = heapq.heappop(heap)[3]
            if not (write.done.running() or write.done.done()):
                return write  # else taken already by its other entry

    def _serve(self, lane: int) -> None:
        while True:
            with self._lock:
                write = self._take(lane)
                sending = write.done.set_running_or_notify_cancel()  # False: cancelled
                if write.key is not None:
                    waiting = self._pending.get(write.key)
                    if waiting is not None:
                        waiting.discard(write)
                        if not waiting:
                            del self._pending[write.key]
            if not sending:
                continue
            self._limit.take()
            WRITE_WAIT_SECONDS.labels(urgency=str(write.urgency)).observe(
                time.monotonic() - write.queued
            )
            try:
                write.done.set_result(write.work())
            except BaseException as error:  # handed to the waiting pass, which raises it
                write.done.set_exception(error)


WRITES = Writers()
