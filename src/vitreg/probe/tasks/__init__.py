"""The probe task registry; importing this package registers every task."""

from vitreg.core.renamed import renamed
from vitreg.probe.tasks import (
    attention_seg,
    classification,
    dense,
    discovery,
    local_info,
    ov_seg,
    pruning,
    token_type,
    zero_shot,
)
from vitreg.probe.tasks.base import (
    TASKS,
    Task,
    TaskResult,
    get_task,
    register_task,
    score_over_seeds,
)
from vitreg.results.probe import ProbeScore

__all__ = [
    "TASKS",
    "ProbeScore",
    "Task",
    "TaskResult",
    "attention_seg",
    "classification",
    "dense",
    "discovery",
    "get_task",
    "local_info",
    "ov_seg",
    "pruning",
    "register_task",
    "score_over_seeds",
    "token_type",
    "zero_shot",
]

__getattr__ = renamed(__name__, {"Score": "ProbeScore"}, globals())
