"""Per-worker time to first token, in seconds: a linear model of each engine, calibrated online.

A request sent to a worker waits for the prefill queued ahead of it and, when the engine's sequence slots
or KV cache are full, for admission behind the requests queued ahead; it computes its own uncached
prefill, and every step meanwhile also carries the worker's decoding requests. Per worker:

    first-token time = overhead + prefill_s x work + decode_s x decoding + queued_s x queued
    work     = the prefill work queued ahead (``backlog.PrefillBacklog``'s estimate) plus the request's own
               (token-equivalents, ``backlog.prefill_work``: attention growth included)
    decoding = the worker's requests past their first token (each adds to every step)
    queued   = the worker's requests ahead of it not past their first token (each waits for admission
               where the engine is full: ``queued_s`` is about what one request holds a slot, 0 where
               admission never waits; their prefill is in ``work`` already)

Calibration: at dispatch the router records the request's ``(work, decoding, queued)`` on its worker
(``dispatched``); its first token gives the observed time since dispatch, one sample (``observed``). A
worker keeps its last ``WINDOW`` samples. Every fit minimises the squared *relative* errors (each sample
weighted by 1 / (its time x its time as predicted before it was observed), each ``FLOOR_S`` at least):
what an operator reads a prediction by, and what keeps the typical request's time where a few long waits
would pull a plain least-squares line. The fleet's rates are the fit of every worker's samples pooled,
pulled towards the prior passed at read time (``rates``: the policy's knobs own it) with the weight of
``PRIOR_SAMPLES`` samples fading to ``RIDGE`` as a window fills; a worker's rates are the fit of its own
samples pulled towards the fleet's with the weight of ``PRIOR_SAMPLES`` samples (a worker
without samples has the fleet's rates, its prefill at the measured rate its peers are priced at: priced at
the prior instead, a worker not yet sampled looked 3x slower on an H100-like profile and every new prefix
went to the first worker sampled; one whose samples do not tell a rate apart, such as requests of one
size, keeps the fleet's for it; a fleet of one converges to its own). Every rate is at least 0, and a
worker's cost per decoding request at most ``CLIP`` x the fleet's: waits its features do not explain,
after a burst, were put on that rate, one worker's came out 25-80x its peers' in a simulated 8-engine
fleet, and its tenants were moved off a worker no slower than the others (SIMULATED, ``8 x cpu roomy
closed @16``, seed 2: 25 moves and 336 ms mean TTFT; bounded, 8 and 285 ms). Its other rates are not
bounded so: a full engine's admission wait per request queued is its own, not its peers'. The
fleet's fit follows every sample until there are ``FLEET_EVERY``, then every ``FLEET_EVERY``.
Robust to outliers: once a worker has ``CLIP_AFTER`` samples, a sample within the range of its window (no
more of any feature than some sample since its last recount, every WINDOW samples) has its time clipped
to within ``CLIP`` x its own fit's prediction (refitted every ``CLIP_AFTER`` samples); one beyond it is
kept as it is (a fit does not judge what it extrapolates). Aged: every ``FLEET_EVERY`` samples, every
worker's samples older than the fleet takes to renew a window (the median span, oldest to newest, of the
full windows) are dropped, a worker left with none has the fleet's rates: a worker whose fit came out
slow stops getting requests, and without ageing its window, hence its fit, would never renew (Mooncake
16-engine replay, simulated: 1 to 215 requests per worker per 1,000 rows, 82 % of the oracle's hits;
aged: 95 %). Bounded: ``WINDOW`` samples per worker, one
record per request in flight (a bounded table: the oldest gives way) (a router's model records nothing
before it is first read: ``active``). ``forget`` drops a worker's samples and records (its engine
restarted or left).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from prefix_router.routing.bounded import BoundedLRU

WINDOW = 64  # samples per worker: the fit follows the engine's last requests
PRIOR_SAMPLES = 2.0  # the prior weighs as much as this many samples of the window's typical size ...
RIDGE = 1e-3  # ... fading to this as the window fills
CLIP_AFTER = 8  # samples before a new sample is clipped to the fit's range
FLEET_EVERY = 16  # samples between two fits of the fleet's pooled rates (each worker refits after one)
CLIP = 4.0  # a sample's time is kept within [prediction / CLIP, prediction x CLIP], a worker's cost
# per decoding request within CLIP x the fleet's
ERRORS = 128  # the fleet's last prediction errors kept for ``uncertainty``

# (overhead s, prefill s per token-equivalent, s per decoding request, s per request queued ahead)
Rates = tuple[float, float, float, float]
Features = tuple[float, float, float]  # (work, decoding, queued)
# the prior the clipping's fit is pulled towards (after CLIP_AFTER samples the data outweigh it 4 to 1)
CLIP_PRIOR: Rates = (0.0, 1e-4, 1e-4, 0.0)
FLOOR_S = 1e-3  # a first-token time below this weighs as this much in the relative fit
_K = 4  # the fit's unknowns: the overhead and one rate per feature
# the normal equations' sums, each sample weighted as ``_accumulate`` says: x x^T (row-major), then x y; then
# the sample count, unweighted, at ``_COUNT`` (the prior's weight is counted in samples)
_COUNT = _K * _K + _K
_SUMS = _COUNT + 1


class _Samples:
    """One worker's last ``WINDOW`` samples (a ring) and their sums for the normal equations, with the
    last fit for the prior it was made with."""

    def __init__(self) -> None:
        self.features: list[Features] = []
        self.seconds: list[float] = []
        self.scales: list[float] = []  # each sample's time as predicted before it was observed (its weight)
        self.times: list[float] = []  # when each sample was observed
        self.next = 0  # the ring's oldest slot once it is full
        self.added = 0  # samples ever added (the sums are recomputed every WINDOW of them: no drift)
        self.sums = [0.0] * _SUMS
        self.fit: Rates | None = None
        self.fit_prior: Rates | None = None
        self.fit_prefill = 0.0  # the measured prefill rate the fit was made with (0: fitted)
        self.clip_fit: Rates | None = None  # the clipping's fit, refitted every CLIP_AFTER samples
        self.clip_at = 0  # ``added`` when it was made
        # the most of each feature of the samples since the window's last recount (a bound of the
        # window's: recounted with the sums every WINDOW samples)
        self.most: Features = (0.0, 0.0, 0.0)

    def add(self, x: Features, seconds: float, now: float = 0.0, scale: float | None = None) -> None:
        """One sample; ``scale``: its time as predicted before it was observed (``seconds`` if None)."""
        scale = seconds if scale is None else scale
        if len(self.features) < WINDOW:
            self.features.append(x)
            self.seconds.append(seconds)
            self.scales.append(scale)
            self.times.append(now)
        else:
            i = self.next
            _accumulate(self.sums, self.features[i], self.seconds[i], self.scales[i], -1.0)
            self.features[i], self.seconds[i], self.scales[i], self.times[i] = x, seconds, scale, now
            self.next = (i + 1) % WINDOW
        _accumulate(self.sums, x, seconds, scale, 1.0)
        self.most = _most(self.most, x)
        self.added += 1
        if self.added % WINDOW == 0:
            self._recount()
        self.fit = None

    def _recount(self) -> None:
        self.sums = [0.0] * _SUMS
        self.most = (0.0, 0.0, 0.0)
        for f, y, scale in zip(self.features, self.seconds, self.scales, strict=True):
            _accumulate(self.sums, f, y, scale, 1.0)
            self.most = _most(self.most, f)

    def span(self) -> float:
        """Seconds between the window's oldest and newest samples."""
        return max(self.times) - min(self.times) if self.times else 0.0

    def drop_before(self, oldest: float) -> None:
        """Drop the samples observed before ``oldest`` (the sums recounted)."""
        keep = [i for i in range(len(self.times)) if self.times[i] >= oldest]
        if len(keep) == len(self.times):
            return
        keep.sort(key=lambda i: self.times[i])
        self.features = [self.features[i] for i in keep]
        self.seconds = [self.seconds[i] for i in keep]
        self.scales = [self.scales[i] for i in keep]
        self.times = [self.times[i] for i in keep]
        self.next = 0
        self._recount()
        self.fit = None
        self.clip_fit = None

    def within(self, x: Features) -> bool:
        """Whether ``x`` is no more in any feature than some sample of the window."""
        most = self.most
        return x[0] <= most[0] and x[1] <= most[1] and x[2] <= most[2]

    def __len__(self) -> int:
        return len(self.features)


def _most(a: Features, b: Features) -> Features:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


def _accumulate(sums: list[float], f: Features, y: float, scale: float, sign: float) -> None:
    """Add (``sign`` 1) or remove (-1) one sample of time ``y``, predicted ``scale`` before it was
    observed, weighted by ``1 / (y x scale)`` (each at least ``FLOOR_S``): the fit minimises the squared
    *relative* error, what an operator reads a prediction by (plain least squares fitted the largest times
    and missed the typical one by a median 41-55 % in a simulated KV-bound fleet at 8 in flight, the
    relative fit 23 %, on the same features); relative to the observed time alone (``1 / y^2``) it
    under-predicted the long waits it could not explain, on real vLLM at 8 in flight by half (median),
    relative to the prediction alone it over-weighted them."""
    x = (1.0, f[0], f[1], f[2])
    w = sign / (max(y, FLOOR_S) * max(scale, FLOOR_S))
    for i in range(_K):
        xi = w * x[i]
        for j in range(_K):
            sums[i * _K + j] += xi * x[j]
        sums[_K * _K + i] += xi * y
    sums[_COUNT] += sign


def predict(rates: Rates, work: float, decoding: float, queued: float = 0.0) -> float:
    """The first-token time, in seconds, of ``rates`` for ``work`` token-equivalents, ``decoding``
    requests decoding and ``queued`` requests queued ahead."""
    return rates[0] + rates[1] * work + rates[2] * decoding + rates[3] * queued


def fading(n: float) -> float:
    """The weight, in samples, of a prior against ``n`` samples: ``PRIOR_SAMPLES`` fading to ``RIDGE`` as
    they fill a window (a full window is its own least-squares fit; RIDGE keeps the system solvable)."""
    return PRIOR_SAMPLES * max(0.0, 1.0 - n / WINDOW) + RIDGE


def fit(sums: list[float], prior: Rates, weight: float, prefill_s: float = 0.0) -> Rates:
    """The ridge least-squares rates, relative errors squared, of the samples summed in ``sums`` towards
    ``prior`` (each >= 0), the prior weighing as much as ``weight`` samples of the weighted mean square of
    each feature. ``prefill_s`` > 0: the prefill rate is that (measured apart), the others are fitted to
    what it leaves."""
    n = sums[_COUNT]
    if n < 0.5:
        return prior if prefill_s <= 0.0 else (prior[0], prefill_s, prior[2], prior[3])
    a = [[sums[i * _K + j] for j in range(_K)] for i in range(_K)]
    b = [sums[_K * _K + i] for i in range(_K)]
    if prefill_s > 0.0:
        b = [b[i] - prefill_s * a[i][1] for i in range(_K)]  # the residual of the measured prefill
    for i in range(_K):
        lam = weight * max(a[i][i] / n, 1e-12)
        a[i][i] += lam
        b[i] += lam * prior[i]
    free = [i for i in range(_K) if i != 1 or prefill_s <= 0.0]
    held = [0.0, prefill_s, 0.0, 0.0]
    x = held
    while free:
        sub = _solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
        x = list(held)
        for k, i in enumerate(free):
            x[i] = sub[k]
        worst = min(free, key=lambda i: x[i])
        if x[worst] >= 0.0:
            break
        free.remove(worst)  # a negative rate is held at 0 and the others refitted
        x[worst] = 0.0
    return (max(x[0], 0.0), max(x[1], 0.0), max(x[2], 0.0), max(x[3], 0.0))


def within_fleet(rates: Rates, fleet: Rates) -> Rates:
    """A worker's fitted ``rates`` with its cost per decoding request at most ``CLIP`` x the ``fleet``'s
    (where the fleet's is above 0)."""
    decode = min(rates[2], CLIP * fleet[2]) if fleet[2] > 0.0 else rates[2]
    return (rates[0], rates[1], decode, rates[3])


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

    def __init__(
        self, max_pending: int, active: bool = True, drain: Callable[[], float] | None = None
    ) -> None:
        self._workers: dict[str, _Samples] = {}
        self._pending: BoundedLRU[str, tuple[str, Features, float]] = BoundedLRU(max_pending)
        self._version = 0  # samples added (a forgotten worker: FLEET_EVERY); the fleet's rates follow it
        self._fleet: tuple[int, Rates, Rates] | None = None  # (version // FLEET_EVERY, prior, fleet's rates)
        # False: ``dispatched`` records nothing until the model is first read (``rates``), so a router whose
        # policies never read it pays nothing per request
        self.active = active
        # the fleet's measured prefill rate, work per second (0: unknown; ``PrefillBacklog.fleet_rate``)
        self.drain = drain
        self._prior: Rates | None = None  # the prior last read with (``rates``): the errors' fits use it
        self._errors: deque[float] = deque(maxlen=ERRORS)  # |predicted - observed| / observed
        self._uncertainty: tuple[int, float] = (-1, 1.0)  # (``_version`` when computed, the median)

    def rates(self, worker: str, prior: Rates) -> Rates:
        """``worker``'s fitted rates towards the fleet's (``fleet``); the fleet's before any sample."""
        self.active = True
        self._prior = prior
        prior = self.fleet(prior)
        samples = self._workers.get(worker)
        rate = self.drain() if self.drain is not None else 0.0
        prefill_s = 1.0 / rate if rate > 0.0 else 0.0
        if samples is None:  # the fleet's, with the measured prefill rate its peers are priced at
            return prior if prefill_s <= 0.0 else (prior[0], prefill_s, prior[2], prior[3])
        if samples.fit is None or samples.fit_prior != prior or samples.fit_prefill != prefill_s:
            samples.fit = within_fleet(fit(samples.sums, prior, PRIOR_SAMPLES, prefill_s), prior)
            samples.fit_prior, samples.fit_prefill = prior, prefill_s
        return samples.fit

    def fleet(self, prior: Rates) -> Rates:
        """The rates of every worker's samples pooled, fitted towards ``prior`` with a weight fading as a
        window fills (``prior`` before any sample); refitted at every sample until there are
        ``FLEET_EVERY``, then every ``FLEET_EVERY`` samples."""
        version = self._version
        epoch = version if version < FLEET_EVERY else FLEET_EVERY + version // FLEET_EVERY
        cached = self._fleet
        if cached is not None and cached[0] == epoch and cached[1] == prior:
            return cached[2]
        pooled = [0.0] * _SUMS
        for samples in self._workers.values():
            for i, value in enumerate(samples.sums):
                pooled[i] += value
        out = fit(pooled, prior, fading(pooled[_COUNT]))
        self._fleet = (epoch, prior, out)
        return out

    def uncertainty(self) -> float:
        """How far to trust a prediction: the median relative error (|predicted - observed| / observed)
        of the fleet's last ``ERRORS`` first tokens, each predicted by its worker's fit before it learned
        from it; 1.0 (no trust) before ``CLIP_AFTER`` of them. Recomputed once per sample."""
        version, value = self._uncertainty
        if version == self._version:
            return value
        errors = sorted(self._errors)
        value = errors[len(errors) // 2] if len(errors) >= CLIP_AFTER else 1.0
        self._uncertainty = (self._version, value)
        return value

    def samples(self, worker: str) -> int:
        """The samples ``worker``'s fit holds (at most ``WINDOW``)."""
        samples = self._workers.get(worker)
        return 0 if samples is None else len(samples)

    def pending(self) -> int:
        """Requests recorded at dispatch still waiting for their first token."""
        return len(self._pending)

    def dispatched(
        self, route_id: str, worker: str, work: float, decoding: int, now: float, queued: int = 0
    ) -> None:
        """``route_id`` was sent to ``worker`` at ``now`` with ``work`` token-equivalents of prefill ahead of
        and including its own, ``decoding`` requests decoding there and ``queued`` ahead of it not past
        their first token (nothing while not ``active``)."""
        if not self.active:
            return
        self._pending.set(route_id, (worker, (work, float(decoding), float(queued)), now))

    def sent(self, route_id: str, now: float) -> None:
        """``route_id``, recorded earlier, reaches its engine only at ``now`` (a decode stage reserved at
        the two-stage choice): its first-token time runs from here. Unknown ids are ignored."""
        record = self._pending.get(route_id)
        if record is not None:
            worker, parts, _ = record
            self._pending.set(route_id, (worker, parts, now))

    def observed(self, route_id: str, now: float) -> None:
        """``route_id``'s first token came at ``now``: one sample of its worker (clipped against the fit
        towards ``CLIP_PRIOR`` once the worker has ``CLIP_AFTER`` samples). Unknown ids are ignored."""
        record = self._pending.pop(route_id)
        if record is None:
            return
        worker, x, sent = record
        seconds = now - sent
        if not seconds >= 0.0:
            return
        predicted: float | None = None
        if self._prior is not None:  # how far the model's prediction was off, before it learns from it
            predicted = predict(self.rates(worker, self._prior), x[0], x[1], x[2])
            if seconds > 0.0:
                self._errors.append(abs(predicted - seconds) / seconds)
        samples = self._workers.setdefault(worker, _Samples())
        if len(samples) >= CLIP_AFTER and samples.within(x):
            if samples.clip_fit is None or samples.added - samples.clip_at >= CLIP_AFTER:
                samples.clip_fit = fit(samples.sums, CLIP_PRIOR, fading(len(samples)))
                samples.clip_at = samples.added
            expected = predict(samples.clip_fit, x[0], x[1], x[2])
            if expected > 0.0:
                seconds = min(max(seconds, expected / CLIP), expected * CLIP)
        samples.add(x, seconds, now, predicted)
        self._version += 1
        if self._version % FLEET_EVERY == 0:
            self._age(now)

    def _age(self, now: float) -> None:
        """Drop every worker's samples older than the fleet takes to renew a window (the median span of
        the full windows): a worker that stopped getting requests returns to the fleet's rates."""
        spans = sorted(s.span() for s in self._workers.values() if len(s) >= WINDOW)
        if not spans:
            return
        oldest = now - spans[len(spans) // 2]
        for name in list(self._workers):
            samples = self._workers[name]
            samples.drop_before(oldest)
            if not len(samples):
                del self._workers[name]

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
