"""The instruments the grader places around a learner's code inside each rank.

* :mod:`.loading`: the learner's file imported, its prints captured, its process group given a store;
* :mod:`.replace`: :class:`Replace`, a library function replaced wherever the learner's code reaches it;
* :mod:`.spies`: the spies made of it (``torch.save``, DDP, collectives, point-to-point) and the hooks;
* :mod:`.errors`: what the learner's code raised and where (:func:`attempt`, :func:`learner_frame`);
* :mod:`.trace`: every rank_main's events, at the learner's lines (``grading.launch_files`` runs it), for
  ``autograder.grader.divergence``'s first difference from the reference (:mod:`.events`: what its events hold).

They observe; they never decide. Each rank returns what they saw (plain tensors, lists, strings) and
the verdict is computed in the grading process.
"""
from .errors import Frame, attempt, frames, learner_frame, raised, raised_at
from .loading import CapturedPrints, echo, every_rank_says, every_rank_tells, grader_group, load_learner, own_rendezvous
from .replace import Replace, transparent, watched
from .spies import DDPSpy, LineRecorder, P2PSpy, SaveSpy, Watched, grad_norm, on_backward_start

__all__ = ["CapturedPrints", "DDPSpy", "Frame", "LineRecorder", "P2PSpy", "Replace", "SaveSpy", "Watched", "attempt",
           "echo", "every_rank_says", "every_rank_tells", "frames", "grad_norm", "grader_group", "learner_frame",
           "load_learner", "on_backward_start", "own_rendezvous", "raised", "raised_at", "transparent", "watched"]
