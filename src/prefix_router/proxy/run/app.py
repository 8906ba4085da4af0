"""``create_app(config)``: the router as an aiohttp application: the node (``node.life.build``) with the
OpenAI surface, the node's control routes and admin API, and the proxy's own connection handler in
front (``lean``, for ``http_server: lean``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from aiohttp import web

from prefix_router.node import FRONT, Config, Upstream, add_admin_routes, add_catch_all, build_app
from prefix_router.pool import Fetcher
from prefix_router.proxy.edge import handlers
from prefix_router.proxy.run import lean


def create_app(
    config: Config,
    *,
    upstream: Upstream | None = None,
    fetcher: Fetcher | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> web.Application:
    """Build the router app. ``upstream`` and ``fetcher`` replace the network (tests); ``rng`` the random
    source seeded by ``config.seed`` (the OS when that is None).

    Serve it with ``handler_cancellation=True`` (see ``prefix_router.node.life.server``) so that a client
    disconnect cancels the upstream request at once.
    """
    app = build_app(config, upstream, fetcher, clock, rng or random.Random(config.seed))
    handlers.add_routes(app)
    add_admin_routes(app)
    add_catch_all(app)  # last: what no route above takes
    app[FRONT] = lean.front_door
    return app
