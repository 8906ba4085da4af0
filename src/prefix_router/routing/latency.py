"""Per-worker time to first token, in seconds: a linear model of each engine, calibrated online.

A request sent to a worker waits for the prefill queued ahead of it, computes its own uncached prefill, and
every step meanwhile also carries the worker's decoding requests. Per worker:

    first-token time = overhead + prefill_s x work + decode_s x decoding
    work     = the prefill work queued ahead (``backlog.PrefillBacklog``'s estimate) plus the request's own
               (token-equivalents, ``backlog.prefill_work``: attention growth included)
    decoding = the worker's requests past their first token (each adds to every step)

Calibration: at dispatch the router records the request's ``(work, decoding)`` on its worker
(``dispatched``); its first token gives the observed time since dispatch, one sample (``observed``). A
worker keeps its last ``WINDOW`` samples. The fleet's rates are the least-squares fit of every worker's
samples pooled, pulled towards the prior passed at read time (``rates``: the policy's knobs own it) with
the weight of ``PRIOR_SAMPLES`` samples fading to ``RIDGE`` as a window fills; a worker's rates are the
fit of its own samples pulled towards the fleet's with the weight of ``PRIOR_SAMPLES`` samples (a worker
without samples has the fleet's rates, one whose samples do not tell a rate apart, such as requests of
one size, keeps the fleet's for it; a fleet of one converges to its own). Every rate is at least 0.
Robust to outliers: once a worker has ``CLIP_AFTER`` samples, a sample within the range of its window (no
more work nor decoding requests than some sample since its last recount, every WINDOW samples) has its
time clipped to within ``CLIP`` x its own fit's prediction (refitted every ``CLIP_AFTER`` samples); one
beyond it is kept as it is (a fit does not judge what it extrapolates). Bounded: ``WINDOW`` samples per
worker, one record per request in flight (a bounded table: the oldest gives way) (a router's model
records nothing before it is first read: ``active``). ``forget`` drops a worker's samples and records
(its engine restarted or left).
"""

from __future__ import annotations

from prefix_router.routing.bounded import BoundedLRU

WINDOW = 64  # samples per worker: the fit follows the engine's last requests
PRIOR_SAMPLES = 2.0  # the prior weighs as much as this many samples of the window's typical size ...
RIDGE = 1e-3  # ... fading to this as the window fills
CLIP_AFTER = 8  # samples before a new sample is clipped to the fit's range
FLEET_EVERY = 16  # samples between two fits of the fleet's pooled rates (each worker refits after one)
CLIP = 4.0  # a sample's time is kept within [prediction / CLIP, prediction x CLIP]

Rates = tuple[float, float, float]  # (overhead s, prefill s per token-equivalent, s per decoding request)
# the prior the clipping's fit is pulled towards (after CLIP_AFTER samples the data outweigh it 4 to 1)
CLIP_PRIOR: Rates = (0.0, 1e-4, 1e-4)


class _Samples:
    """One worker's last ``WINDOW`` samples (a ring) and their sums for the normal equations, with the
    last fit for the prior it was made with."""

    def __init__(self) -> None:
        self.work: list[float] = []
        self.decoding: list[float] = []
        self.seconds: list[float] = []
        self.next = 0  # the ring's oldest slot once it is full
        self.added = 0  # samples ever added (the sums are recomputed every WINDOW of them: no drift)
        self.sums = [0.0] * 9  # n, w, d, ww, wd, dd, y, wy, dy
        self.fit: Rates | None = None
        self.fit_prior: Rates | None = None
        self.clip_fit: Rates | None = None  # the clipping's fit, refitted every CLIP_AFTER samples
        self.clip_at = 0  # ``added`` when it was made
        # the most work and decoding requests of the samples since the window's last recount (a bound of
        # the window's: recounted with the sums every WINDOW samples)
        self.max_work = 0.0
        self.max_decoding = 0.0

    def add(self, work: float, decoding: float, seconds: float) -> None:
        if len(self.work) < WINDOW:
            self.work.append(work)
            self.decoding.append(decoding)
            self.seconds.append(seconds)
            _accumulate(self.sums, work, decoding, seconds, 1.0)
        else:
            i = self.next
            _accumulate(self.sums, self.work[i], self.decoding[i], self.seconds[i], -1.0)
            self.work[i], self.decoding[i], self.seconds[i] = work, decoding, seconds
            self.next = (i + 1) % WINDOW
            _accumulate(self.sums, work, decoding, seconds, 1.0)
        self.max_work, self.max_decoding = max(self.max_work, work), max(self.max_decoding, decoding)
        self.added += 1
        if self.added % WINDOW == 0:
            self.sums = [0.0] * 9
            for w, d, y in zip(self.work, self.decoding, self.seconds, strict=True):
                _accumulate(self.sums, w, d, y, 1.0)
            self.max_work, self.max_decoding = max(self.work), max(self.decoding)
        self.fit = None

    def __len__(self) -> int:
        return len(self.work)


def _accumulate(sums: list[float], w: float, d: float, y: float, sign: float) -> None:
    sums[0] += sign
    sums[1] += sign * w
    sums[2] += sign * d
    sums[3] += sign * w * w
    sums[4] += sign * w * d
    sums[5] += sign * d * d
    sums[6] += sign * y
    sums[7] += sign * w * y
    sums[8] += sign * d * y


def predict(rates: Rates, work: float, decoding: float) -> float:
    """The first-token time, in seconds, of ``rates`` for ``work`` token-equivalents and ``decoding``."""
    return rates[0] + rates[1] * work + rates[2] * decoding


def fading(n: float) -> float:
    """The weight, in samples, of a prior against ``n`` samples: ``PRIOR_SAMPLES`` fading to ``RIDGE`` as
    they fill a window (a full window is its own least-squares fit; RIDGE keeps the system solvable)."""
    return PRIOR_SAMPLES * max(0.0, 1.0 - n / WINDOW) + RIDGE


def fit(sums: list[float], prior: Rates, weight: float) -> Rates:
    """The ridge least-squares rates of the samples summed in ``sums`` towards ``prior`` (each >= 0), the
    prior weighing as much as ``weight`` samples of the mean square of each feature."""
    n, sw, sd, sww, swd, sdd, sy, swy, sdy = sums
    if n < 0.5:
        return prior
    lam = [weight, weight * max(sww / n, 1e-12), weight * max(sdd / n, 1e-12)]
    a = [[n + lam[0], sw, sd], [sw, sww + lam[1], swd], [sd, swd, sdd + lam[2]]]
    b = [sy + lam[0] * prior[0], swy + lam[1] * prior[1], sdy + lam[2] * prior[2]]
    free = [0, 1, 2]
    x = [0.0, 0.0, 0.0]
    while free:
        sub = _solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
        x = [0.0, 0.0, 0.0]
        for k, i in enumerate(free):
            x[i] = sub[k]
        worst = min(free, key=lambda i: x[i])
        if x[worst] >= 0.0:
            break
        free.remove(worst)  # a negative rate is held at 0 and the others refitted
        x[worst] = 0.0
    return (max(x[0], 0.0), max(x[1], 0.0), max(x[2], 0.0))


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (``a`` symmetric positive definite)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        head = m[col][col]
        if head == 0.0:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / head
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        acc = m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))
        x[r] = acc / m[r][r] if m[r][r] != 0.0 else 0.0
    return x


class LatencyModel:
    """The workers' first-token models (see the module doc). ``max_pending``: requests recorded at
    dispatch and not yet past their first token (the oldest gives way). ``active`` False: nothing is
    recorded until the model is first read."""

    def __init__(self, max_pending: int, active: bool = True) -> None:
        self._workers: dict[str, _Samples] = {}
        self._pending: BoundedLRU[str, tuple[str, float, float, float]] = BoundedLRU(max_pending)
        self._version = 0  # samples added (a forgotten worker: FLEET_EVERY); the fleet's rates follow it
        self._fleet: tuple[int, Rates, Rates] | None = None  # (version // FLEET_EVERY, prior, fleet's rates)
        # False: ``dispatched`` records nothing until the model is first read (``rates``), so a router whose
        # policies never read it pays nothing per request
        self.active = active

    def rates(self, worker: str, prior: Rates) -> Rates:
        """``worker``'s fitted rates towards the fleet's (``fleet``); the fleet's before any sample."""
        self.active = True
        prior = self.fleet(prior)
        samples = self._workers.get(worker)
        if samples is None:
            return prior
        if samples.fit is None or samples.fit_prior != prior:
            samples.fit, samples.fit_prior = fit(samples.sums, prior, PRIOR_SAMPLES), prior
        return samples.fit

    def fleet(self, prior: Rates) -> Rates:
        """The rates of every worker's samples pooled, fitted towards ``prior`` with a weight fading as a
        window fills (``prior`` before any sample); refitted every ``FLEET_EVERY`` samples."""
        epoch = self._version // FLEET_EVERY
        cached = self._fleet
        if cached is not None and cached[0] == epoch and cached[1] == prior:
            return cached[2]
        pooled = [0.0] * 9
        for samples in self._workers.values():
            for i, value in enumerate(samples.sums):
                pooled[i] += value
        out = fit(pooled, prior, fading(pooled[0]))
        self._fleet = (epoch, prior, out)
        return out

    def samples(self, worker: str) -> int:
        """The samples ``worker``'s fit holds (at most ``WINDOW``)."""
        samples = self._workers.get(worker)
        return 0 if samples is None else len(samples)

    def pending(self) -> int:
        """Requests recorded at dispatch still waiting for their first token."""
        return len(self._pending)

    def dispatched(self, route_id: str, worker: str, work: float, decoding: int, now: float) -> None:
        """``route_id`` was sent to ``worker`` at ``now`` with ``work`` token-equivalents of prefill ahead of
        and including its own, and ``decoding`` requests decoding there (nothing while not ``active``)."""
        if not self.active:
            return
        self._pending.set(route_id, (worker, work, float(decoding), now))

    def sent(self, route_id: str, now: float) -> None:
        """``route_id``, recorded earlier, reaches its engine only at ``now`` (a decode stage reserved at
        the two-stage choice): its first-token time runs from here. Unknown ids are ignored."""
        record = self._pending.get(route_id)
        if record is not None:
            worker, work, decoding, _ = record
            self._pending.set(route_id, (worker, work, decoding, now))

    def observed(self, route_id: str, now: float) -> None:
        """``route_id``'s first token came at ``now``: one sample of its worker (clipped against the fit
        towards ``CLIP_PRIOR`` once the worker has ``CLIP_AFTER`` samples). Unknown ids are ignored."""
        record = self._pending.pop(route_id)
        if record is None:
            return
        worker, work, decoding, sent = record
        seconds = now - sent
        if not seconds >= 0.0:
            return
        samples = self._workers.setdefault(worker, _Samples())
        if len(samples) >= CLIP_AFTER and work <= samples.max_work and decoding <= samples.max_decoding:
            if samples.clip_fit is None or samples.added - samples.clip_at >= CLIP_AFTER:
                samples.clip_fit = fit(samples.sums, CLIP_PRIOR, fading(len(samples)))
                samples.clip_at = samples.added
            expected = predict(samples.clip_fit, work, decoding)
            if expected > 0.0:
                seconds = min(max(seconds, expected / CLIP), expected * CLIP)
        samples.add(work, decoding, seconds)
        self._version += 1

    def discard(self, route_id: str) -> None:
        """``route_id`` left without a first token: no sample."""
        self._pending.pop(route_id)

    def forget(self, worker: str) -> None:
        """Drop ``worker``'s samples and its requests' records (its engine restarted, or it left)."""
        if self._workers.pop(worker, None) is not None:
            self._version += FLEET_EVERY - self._version % FLEET_EVERY  # the fleet's rates are refitted
        for route_id, record in self._pending.items():
            if record[0] == worker:
                self._pending.pop(route_id)
