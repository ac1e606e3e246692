"""The probe task registry; importing this package registers every task."""

from vitreg.probe.tasks import classification, dense, discovery, local_info, token_type
from vitreg.probe.tasks.base import TASKS, Score, Task, TaskResult, get_task, register_task

__all__ = [
    "TASKS",
    "Score",
    "Task",
    "TaskResult",
    "classification",
    "dense",
    "discovery",
    "get_task",
    "local_info",
    "register_task",
    "token_type",
]
