"""The probe task registry; importing this package registers every task."""

from vitreg.probe.tasks import (
    attention_seg,
    classification,
    dense,
    discovery,
    local_info,
    ov_seg,
    token_type,
    zero_shot,
)
from vitreg.probe.tasks.base import TASKS, Score, Task, TaskResult, get_task, register_task

__all__ = [
    "TASKS",
    "Score",
    "Task",
    "TaskResult",
    "attention_seg",
    "classification",
    "dense",
    "discovery",
    "get_task",
    "local_info",
    "ov_seg",
    "register_task",
    "token_type",
    "zero_shot",
]
