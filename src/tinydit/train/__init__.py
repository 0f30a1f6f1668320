"""Training: the loop, its optimizer, EMA and schedule, checkpoint writing and exact resumption."""

from tinydit.train.trainer import Trainer, TrainResult

__all__ = ["Trainer", "TrainResult"]
