"""Rank-side instruments of the exercise 11 check: run the learner's four functions inside the MoE layer
the grader assembles (as ``moe_forward`` does), one part at a time, and record what happened.

Every rank builds the same MoE (``distlab.lab.expert_parallel.seeded_moe``, one expert per rank, top-1 (Switch),
capacity factor 1.25:
rank 0 drops 2 slots, and the two ranks send each other different counts) and the same
``W * T`` tokens, and takes its own ``T``.
Each learner function's result is recorded, then checked against what it must be: where it is
wrong (or raised), the right value is used from there on, so that one mistake costs its own marks
only (llmsys_hw5's "one part at a time") and no rank is left waiting in an all-to-all of sizes the
others do not agree with. Every collective is recorded by ``distlab.measure.comm.CollectiveRecorder``,
tagged with the stage (the learner function) and the phase (forward or backward) it ran in.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

import distlab
from distlab.measure.comm import CollectiveRecorder

from ...rank import CapturedPrints, attempt, echo, learner_frame, load_learner, raised, raised_at
from ...rank.parts import Parts
from .answers import ANSWERS  # the runtime's copy, resolved now: before any learner file is loaded
from .edges import observe_edges, as_ints, valid_perm
from .observations import Answers, Collective, MoEStep, StageError
from .reference import HIDDEN, T, data, moe, reference


class CommSpy(CollectiveRecorder):
    """The one recorder, each op tagged with the learner function (stage) running and the phase."""

    def __init__(self):
        super().__init__()
        self.stage, self.phase = None, "forward"

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        ptrs = [t.untyped_storage().data_ptr() for t in tensors[:2]]
        aliased = len(ptrs) == 2 and ptrs[0] == ptrs[1]
        return {"stage": self.stage, "phase": self.phase, "aliased": aliased}

    @property
    def calls(self) -> list[Collective]:
        return [Collective(kind=op.kind, shape=list(op.shape), **op.tags) for op in self.ops]


@contextmanager
def fresh_memory_nan() -> Iterator[None]:
    """torch.empty and new_empty leave whatever bytes the allocator had, often zeros: a combine that leaves the
    dropped slots' rows unwritten would pass by luck. In deterministic mode torch fills fresh memory with NaN (an
    integer dtype's largest value), so every read of a row never written shows, in every run alike."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only: no op of the learner's raises for it
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` on every rank: the backward runs the all-to-alls' backward on all of them, or none
    (one rank whose combine raised would leave the others waiting in it)."""
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def rank_main(paths: list[str], outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank: observe each learner file in turn (the tests grade several per launch), in parts
    kept as they return (``rank.parts``: one that ends the launch costs its own marks only): ``"sort"``,
    ``"exchange"``, ``"dispatch"``, ``"combine"`` (each its function), ``"backward"`` (through them),
    ``"dtype"`` (dispatch and combine again, on float64 rows).
    Each kept :class:`MoEStep` holds everything observed until then; the backward runs only after a forward."""
    distlab.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        out = []
        for i, path in enumerate(paths):
            kept = Parts(outdir, i, skip)
            _observe(path, rank, world, kept)
            kept.finished()
            out.append(kept.ran)
        return out
    finally:
        distlab.shutdown()


def _observe(path: str, rank: int, world: int, kept: Parts) -> None:
    obs = MoEStep(rank=rank, world=world)
    layer, (x_all, grad_all) = moe(world), data(world)
    x = x_all[rank * T:(rank + 1) * T].clone().requires_grad_()
    _, slots = layer.route(x)
    truth = reference(world)
    send_true = truth.ranks[rank].send
    recv_true = [truth.ranks[j].send[rank] for j in range(world)]
    learner, spy = load_learner(path), CommSpy()
    identified, watch = ANSWERS.identify(learner), ANSWERS.watch(learner)

    def stage(name, fn, *args):
        spy.stage = name
        with spy, watch, fresh_memory_nan():   # the learner's calls only: the runtime's copy run from them is seen
            out, exc = attempt(fn, *args)
        spy.stage = None
        if isinstance(exc, NotImplementedError):
            obs.not_implemented = obs.not_implemented or str(learner_frame(exc, path) or exc)
        elif exc is not None:
            obs.errors[name] = StageError(error=raised(exc), where=str(learner_frame(exc, path) or ""))
        elif out is None:
            obs.returned_none.append(name)
        return out

    def keep(part: str) -> None:  # everything observed so far
        obs.comm = spy.calls
        obs.answers = Answers(identified=identified, calls=[(d, chain) for d, chain in watch.calls])
        kept.keep(part, obs.to_wire())

    with CapturedPrints() as printed:
        # sort_by_expert and exchange_split_sizes each kept as it returns: an exchange that ends the launch
        # (a rank that dies in its all-to-all) costs the exchange's criterion, not the sort's
        if kept.starts("sort"):
            perm, send = _sort(obs, stage, learner, slots, world, send_true)
            obs.edges = observe_edges(learner, world)  # no communication: each rank alone
            keep("sort")
        else:  # kept or ended in an earlier launch: the grader's own goes on (that part's record says how it went)
            perm, send = _sorted(slots), send_true
        if kept.starts("exchange"):
            recv = _exchange(obs, stage, learner, send, recv_true)
            keep("exchange")
        else:
            recv = recv_true
        dispatching = kept.starts("dispatch")
        if dispatching:
            received = _dispatched(obs, stage, learner, x[slots.token], perm, send, recv)
            keep("dispatch")
        if kept.starts("combine"):  # apart from dispatch: an abort in one costs the other nothing
            if not dispatching:  # dispatch ended an earlier launch (else combine would not run now): the grader's rows
                received = _grader_dispatch(x[slots.token][perm], send, recv)
                obs.substituted.append("dispatch")
                obs.unfinished.append("dispatch")
            rows = _combined(obs, stage, learner, layer.experts[rank](received), perm, len(slots.token), send, recv)
            y = torch.zeros_like(x).index_add(0, slots.token, slots.gate[:, None] * rows)
            obs.y = y.detach().cpu().clone()
            keep("combine")
            if kept.starts("backward"):
                _backward(obs, y, layer, x, grad_all[rank * T:(rank + 1) * T], spy, path)
                keep("backward")
        if kept.starts("dtype"):  # on its own: a launch that ended in the backward runs it again without the forward
            _widened(obs, learner, x[slots.token], perm, len(slots.token), send, recv, path)
            keep("dtype")
    echo(printed.lines)


def _sorted(slots) -> torch.Tensor:
    """The kept slots, sorted by expert: the grader's own permutation."""
    kept = slots.keep.nonzero().squeeze(1)
    return kept[torch.argsort(slots.expert[kept], stable=True)]


def _sort(obs: MoEStep, stage, learner, slots, world: int, send_true: list[int]) -> tuple:
    """sort_by_expert, observed into ``obs``; the perm and input_split_sizes the rest runs on (the grader's own
    where the learner's are wrong, said in ``obs.substituted``)."""
    got = stage("sort", learner.sort_by_expert, slots.expert, slots.keep, world)
    perm, send = got if isinstance(got, tuple) and len(got) == 2 else (None, None)
    obs.returned.perm = perm.detach().cpu().clone() if isinstance(perm, torch.Tensor) else repr(perm)[:80]
    obs.returned.send = as_ints(send) if as_ints(send) is not None else repr(send)[:80]
    if not valid_perm(perm, slots.expert, slots.keep) or as_ints(send) != send_true:
        obs.substituted.append("sort")
        perm, send = _sorted(slots), send_true
    return perm, send


def _exchange(obs: MoEStep, stage, learner, send: list[int], recv_true: list[int]) -> list[int]:
    """exchange_split_sizes, observed into ``obs``; the output_split_sizes the rest runs on."""
    recv = stage("exchange", learner.exchange_split_sizes, list(send))
    obs.returned.recv = as_ints(recv) if as_ints(recv) is not None else repr(recv)[:80]
    if as_ints(recv) != recv_true:
        obs.substituted.append("exchange")
        recv = recv_true
    return recv


def _fits(value, rows: int) -> bool:
    return isinstance(value, torch.Tensor) and tuple(value.shape) == (rows, HIDDEN)


def _matches(obs: MoEStep, name: str, got, want: torch.Tensor, rows: int, exact: bool) -> bool:
    """Whether ``got`` (what the learner's ``name`` returned) is ``want``: exactly (an all-to-all copies), or
    within float32's rounding. A functional collective's error surfaces where its result is first read (here,
    for a result the learner's code did not read): it is the stage's own."""
    if not _fits(got, rows):
        return False
    try:
        same = torch.equal(got.detach(), want) if exact else torch.allclose(got.detach(), want, rtol=1e-5, atol=1e-6)
    except Exception as exc:  # noqa: BLE001 - the learner's collective failed: its error is feedback
        obs.errors.setdefault(name, StageError(error=raised(exc), where=""))
        return False
    return bool(same)


def _judged(obs: MoEStep, name: str, got, want: torch.Tensor, rows: int, exact: bool) -> tuple:
    """What goes on from the learner's ``name``: its result where it is ``want`` on every rank, else ``want``
    (``obs.substituted``); with what was observed of the result: a copy and whether it has a grad_fn where it
    has the contract's shape, else its shape (or repr)."""
    right = _matches(obs, name, got, want.detach(), rows, exact)
    fits = _fits(got, rows) and name not in obs.errors
    seen = ((got.detach().cpu().clone(), got.grad_fn is not None, None) if fits
            else (None, None, list(getattr(got, "shape", [])) or repr(got)[:80]))
    if _everywhere(right):
        return (got, *seen)
    obs.substituted.append(name)
    return (want, *seen)


def _grader_dispatch(rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    """The grader's own dispatch of ``rows`` (sorted by expert): an autograd-aware all-to-all."""
    out = all_to_all_single_autograd(rows, list(recv), list(send), dist.group.WORLD)
    return out.wait() if hasattr(out, "wait") else out


def _dispatched(obs: MoEStep, stage, learner, x_slots: torch.Tensor, perm: torch.Tensor, send: list[int],
                recv: list[int]) -> torch.Tensor:
    """The learner's dispatch, and what it must return: the grader's own autograd-aware all-to-all of the same
    rows (run on every rank after it). Where the learner's differs on some rank, the grader's goes on to the
    expert and combine (``obs.substituted``), so that combine is graded on the right rows."""
    got = stage("dispatch", learner.dispatch, x_slots, perm, list(send), list(recv))
    want = _grader_dispatch(x_slots[perm], send, recv)
    obs.dispatch_want = want.detach().cpu().clone()
    received, obs.returned.dispatched, obs.received_grad_fn, obs.returned.dispatch_shape = _judged(
        obs, "dispatch", got, want, sum(recv), exact=True)
    return received


def _combined(obs: MoEStep, stage, learner, y_recv: torch.Tensor, perm: torch.Tensor, n_slots: int,
              send: list[int], recv: list[int]) -> torch.Tensor:
    """The learner's combine, and what it must return: the grader's own all-to-all back, then row ``k`` into slot
    ``perm[k]``. Where the learner's differs on some rank, the grader's makes the layer's output
    (``obs.substituted``)."""
    got = stage("combine", learner.combine, y_recv, perm, n_slots, list(send), list(recv))
    back = all_to_all_single_autograd(y_recv, list(send), list(recv), dist.group.WORLD)
    back = back.wait() if hasattr(back, "wait") else back
    want = back.new_zeros(n_slots, HIDDEN).index_copy(0, perm, back)
    obs.y_slots_want = want.detach().cpu().clone()
    rows, obs.y_slots, obs.combined_grad_fn, obs.returned.combine_shape = _judged(
        obs, "combine", got, want, n_slots, exact=False)
    return rows


def _widened(obs: MoEStep, learner, x_slots: torch.Tensor, perm: torch.Tensor, n_slots: int, send: list[int],
             recv: list[int], path: str) -> None:
    """dispatch and combine on float64 rows, outside the recorder (their all-to-alls are not the step's): the
    dtype each returns, into ``obs.wide``. Not one that was wrong on some rank in this launch's forward (every
    rank knows it alike), so that every rank makes the same calls; combine's rows are zeros of the shape the
    expert's output has (their values are not judged here)."""
    rows = torch.zeros(sum(recv), x_slots.shape[1], dtype=torch.float64)
    calls = {"dispatch": (learner.dispatch, x_slots.detach().double(), perm, list(send), list(recv)),
             "combine": (learner.combine, rows, perm, n_slots, list(send), list(recv))}
    for name, (fn, *args) in calls.items():
        if name in obs.substituted:
            continue
        with torch.no_grad():
            got, exc = attempt(fn, *args)
        obs.wide[name] = (f"raised {raised_at(exc, path)}" if exc is not None else
                          str(getattr(got, "dtype", type(got).__name__)).removeprefix("torch."))


def _backward(obs: MoEStep, y: torch.Tensor | None, layer, x: torch.Tensor, grad: torch.Tensor, spy: CommSpy,
              path: str) -> None:
    """The backward through the layer's output (where there is one), and the gradients it left."""
    if y is not None:
        spy.stage, spy.phase = "backward", "backward"
        with spy:
            _, exc = attempt(y.backward, grad)
        if exc is not None:
            obs.errors["backward"] = StageError(error=raised(exc), where=str(learner_frame(exc, path) or ""))
    obs.x_grad = None if x.grad is None else x.grad.detach().clone()
    router = layer.router.gate.weight.grad
    obs.router_grad = None if router is None else router.detach().clone()
    obs.expert_grads = {n: (None if p.grad is None else p.grad.detach().clone())
                        for n, p in layer.experts[obs.rank].named_parameters()}
