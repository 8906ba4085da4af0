from collections import OrderedDict
from collections.abc import Sequence

def chain(data: bytes, block_size: int, seed: int, end: int, /) -> tuple[int, ...]: ...
def touch_chain(
    lru: OrderedDict[int, float],
    holders: dict[int, int],
    value: int,
    blocks: Sequence[int],
    held: int,
    now: float,
    /,
) -> int: ...
def count_classes(data: bytes, /) -> tuple[int, int, int, int]: ...
