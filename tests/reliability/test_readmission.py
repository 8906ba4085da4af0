"""An engine process restarted with another model: the worker is re-admitted with the model list it has
now (looked up before the probe that re-admits it), so the new model is served at once instead of
answering the router's 404 until the next periodic model refresh (``health.models_interval_s``)."""

from __future__ import annotations

from typing import Any

import orjson

SETTINGS = {
    "health.interval_s": 0.1,
    "health.timeout_s": 0.5,
    "health.fail_threshold": 2,
    "health.success_threshold": 2,
    "health.models_interval_s": 3600,  # the periodic refresh never comes within the test
}


async def test_a_worker_is_readmitted_with_its_new_models(
    sim_process: Any, start_router: Any, kit: Any
) -> None:
    engine = await sim_process(model="old-model")
    router = await start_router({"url": engine.url, "name": "sim"}, settings=SETTINGS)
    worker = router.state.pool.require("sim")
    assert worker.model_ids() == ["old-model"]
    await engine.kill()
    await kit.wait_until(lambda: not worker.health.healthy)

    await sim_process(port=engine.port, model="new-model")  # the same address, another model
    await kit.wait_until(lambda: worker.health.healthy, timeout_s=10)
    status, _, body = await kit.post(router.url, body={**kit.CHAT, "model": "new-model"})
    assert status == 200, body
    assert orjson.loads(body)["model"] == "new-model"
    status, _, body = await kit.post(router.url, body={**kit.CHAT, "model": "old-model"})
    assert status == 404 and orjson.loads(body)["error"]["code"] == "model_not_found"
