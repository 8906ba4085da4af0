"""A reload (SIGHUP) reads and parses the configuration off the event loop (``node.reload_config``): a large
file does not stall the requests being served meanwhile."""

from __future__ import annotations

import threading
from typing import Any

from prefix_router.node import reload_config


async def test_the_configuration_is_loaded_in_another_thread(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("w"))
    loaded_in: list[int] = []

    def load() -> Any:
        loaded_in.append(threading.get_ident())
        return router.state.config

    plan = await reload_config(router.state, load, "test")
    assert plan is not None and plan.changes() == "none"
    assert loaded_in and loaded_in[0] != threading.get_ident()
