"""Rank side of exercise 3's look-alikes: functions that look like the contract's and do something else
(:class:`~.observations.LookAlikes`), so that the feedback names the call, not only its effect.
"""
from __future__ import annotations

import torch

TARGETS = [(torch.nn.utils, "clip_grad_value_", "clip_grad_value_"),
           (torch.nn.utils.clip_grad, "clip_grad_value_", "clip_grad_value_"),
           (torch.cuda.amp, "autocast", "torch.cuda.amp.autocast")]
