"""The endpoint picker (``prefix-router epp``): the routing core behind an Envoy-based gateway's ext_proc
filter (Gateway API Inference Extension, endpoint picker protocol v1), beside the HTTP proxy's edge."""

from prefix_router.epp.picker import Edge, PickerStream, address_of
from prefix_router.epp.server import RunningEpp, create_control_app, serve_epp, start_epp
from prefix_router.epp.settings import EXT_PROC_SERVICE, EppSettings

__all__ = [
    "EXT_PROC_SERVICE",
    "Edge",
    "EppSettings",
    "PickerStream",
    "RunningEpp",
    "address_of",
    "create_control_app",
    "serve_epp",
    "start_epp",
]
