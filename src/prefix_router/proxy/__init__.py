"""The OpenAI HTTP data plane: ``prefix-router serve``, an OpenAI-compatible reverse proxy in front of the
node (``prefix_router.node``: its state, configuration, life, control plane and request steps).

Subpackages by concern: ``edge`` (a request over HTTP: the handlers, the exchange with the engines and its
retries, the relay of the answer, the request as both connection handlers see it) and ``run`` (the app,
the ``serve`` command, the lean connection handler, several processes and their KV event fan-out).
Other packages import only the names below.
"""

from __future__ import annotations

from prefix_router.node import Running, start
from prefix_router.proxy.run.app import create_app
from prefix_router.proxy.run.processes import parent_death_signal

__all__ = ["Running", "create_app", "parent_death_signal", "start"]
