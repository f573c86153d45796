"""``auto``: speculate only as much as this hardware pays for — and not at all when it does not.

``planner`` (``AutoPlanner``: calibration → policy → tree builder, per step), ``calibration``
(learned cost factors, the draft's profile), ``acceptance`` (the chance a draft guess is right, by its
probability), ``copies`` (the copies' r_c and when copies alone pay), ``policy`` (plain, copies or a
tree, from the forecast), ``guard`` (delivered tokens/s against plain decoding within an answer:
stops what loses), ``trees`` (level trees through ``growth``, one-pass trees); ``tuning`` (the tuned
constants they read, each once: ``TUNING``).
"""

from ..costmodel import CostModel
from .planner import AutoPlanner
from .policy import Mode

PLAIN, SPECULATE, PROBE, COPY, PARALLEL = Mode  # the modes by their names (``Mode``'s members)

__all__ = ["COPY", "PARALLEL", "PLAIN", "PROBE", "SPECULATE", "AutoPlanner", "CostModel", "Mode"]
