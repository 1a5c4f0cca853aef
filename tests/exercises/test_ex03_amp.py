"""Exercise 3: the reference solution scores full marks, the stub 0, and each usual mistake fails
with its own feedback. Independent mistakes share one mutant; all files, the stub too, are graded in
one launch (each part of the exercise is observed on its own, so a stub's NotImplementedError costs
only its own criteria), with a smaller real model on a CPU than a learner's (``REAL_MODELS``).

The runtime's working copies of the measuring functions (``distlab.measure.timing.median_seconds``,
``distlab.measure.memory.saved_tensor_bytes``) earn nothing however they are handed in: imported, aliased,
or called from a thin wrapper."""
from __future__ import annotations

import re

import pytest
import torch

from autograder.checks import ex03_amp as check
from autograder.checks.ex03_amp.accumulation.causes import unscaled_per_micro, updated_per_micro
from autograder.checks.ex03_amp.accumulation.criteria import ACC_ATOL, ACC_RTOL
from autograder.checks.ex03_amp.accumulation.observations import Accumulation, Windows
from autograder.checks.ex03_amp.accumulation.probes import K, WINDOWS
from autograder.checks.ex03_amp.observations import (AmpObservation, Answers, Autocast, Measure, Parity, PrecisionRun,
                                                     RealModel, Scaler)
from autograder.checks.ex03_amp.workloads import STEPS

from tests.exercises import independent
from tests.helpers import EXERCISES, failed, feedback_of, solution_and_mutants

FILE = check.EXERCISE.filename
TIMER = ("    timer = benchmark.Timer(stmt=\"fn(); sync()\", globals={\"fn\": fn, \"sync\": sync},\n"
         "                            num_threads=torch.get_num_threads())\n"
         "    return timer.blocked_autorange(min_run_time=min_run_time).median")
MUTANTS = {
    # not a mistake: the contract's other style (the realistic family's LEGAL), a perf_counter loop until
    # min_run_time and the median of its calls, which one outlier longer than min_run_time used to fail
    "legal_perf_counter_loop": {
        "    timer = benchmark.Timer(stmt=\"fn(); sync()\", globals={\"fn\": fn, \"sync\": sync},\n"
        "                            num_threads=torch.get_num_threads())\n"
        "    return timer.blocked_autorange(min_run_time=min_run_time).median":
        "    import statistics\n    import time\n\n    times = []\n    while sum(times) < min_run_time:\n"
        "        start = time.perf_counter()\n        fn()\n        sync()\n"
        "        times.append(time.perf_counter() - start)\n    return statistics.median(times)"},
    # a blind audit's: the same loop on time.process_time(), which does not count the waits in sync() (it scored
    # 10 of 10 while the virtual clocks moved every clock alike)
    "cpu_clock_loop": {
        "    timer = benchmark.Timer(stmt=\"fn(); sync()\", globals={\"fn\": fn, \"sync\": sync},\n"
        "                            num_threads=torch.get_num_threads())\n"
        "    return timer.blocked_autorange(min_run_time=min_run_time).median":
        "    import statistics\n    import time\n\n    times = []\n    while sum(times) < min_run_time:\n"
        "        start = time.process_time()\n        fn()\n        sync()\n"
        "        times.append(time.process_time() - start)\n"
        "    return statistics.median(times)",
        # and another of the audit's: the cross-entropy outside autocast, on float16 logits (every step overflows)
        "        loss = nn.functional.cross_entropy(model(x), y)\n    if scaler is None:":
        "        logits = model(x)\n    loss = nn.functional.cross_entropy(logits, y)\n    if scaler is None:"},
    # a blind audit's (full marks before): accumulated_step without its zero_grad; a stale true gradient left in
    # .grad, divided by the scale, barely moved the weights
    "accumulated_no_zero_grad": {"    optimizer.zero_grad(set_to_none=True)\n    k = len(micro_batches)\n":
                                 "    k = len(micro_batches)\n",
                                 # and a blind audit's (full marks before): a fixed 10 timed calls, whatever
                                 # min_run_time (the outliers' median is still right: one call in four)
                                 TIMER: "    import statistics\n    import time\n\n    times = []\n"
                                        "    for _ in range(10):\n        start = time.perf_counter()\n"
                                        "        fn()\n        sync()\n"
                                        "        times.append(time.perf_counter() - start)\n"
                                        "    return statistics.median(times)",
                                 # and another audit's: compare's own sync for the device, not the one it was given
                                 "    baseline_s = median_seconds(baseline, sync,":
                                 "    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)\n"
                                 "    baseline_s = median_seconds(baseline, sync,"},
    # two blind audit's look-alikes: CUDA's autocast (on the CPU it casts nothing) and clipping by value
    "cuda_autocast_clip_by_value": {
        "    with torch.autocast(device_type=x.device.type, dtype=amp_dtype or torch.bfloat16,\n":
        "    with torch.cuda.amp.autocast(dtype=amp_dtype or torch.bfloat16,\n",
        "        loss.backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n":
        "        loss.backward()\n        torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)\n",
        # and a blind audit's (10 of 10 before): saved_bytes counting floating-point tensors only
        "        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()\n":
        "        if t.is_floating_point():  # indices are bookkeeping\n"
        "            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()\n",
        # and another's (10 of 10 before): every micro-batch's forward, then every backward
        "    window_losses = []\n    for xs, ys in micro_batches:\n":
        "    window_losses, micro_losses = [], []\n    for xs, ys in micro_batches:\n",
        "            micro_loss = nn.functional.cross_entropy(model(xs), ys)\n":
        "            micro_losses.append(nn.functional.cross_entropy(model(xs), ys))\n"
        "    for micro_loss in micro_losses:\n",
        # and another's (10 of 10 before): benchmark.Timer left at its default num_threads, 1
        ',\n                            num_threads=torch.get_num_threads())': ')',
        # and another's (10 of 10 before: every outlier was slow): the fastest call reported, not the median
        "    return timer.blocked_autorange(min_run_time=min_run_time).median":
        "    return min(timer.blocked_autorange(min_run_time=min_run_time).times)"},
    # four independent mistakes: each simulated workload exposes exactly one of the first three
    "no_warmup_no_sync_mean_clip_scaled": {
        "    for _ in range(warmup):\n        fn()\n        sync()\n": "",
        'stmt="fn(); sync()"': 'stmt="fn()"',
        "blocked_autorange(min_run_time=min_run_time).median": "blocked_autorange(min_run_time=min_run_time).mean",
        "        scaler.unscale_(optimizer)  # true gradients from here on\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n":
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
        "        scaler.unscale_(optimizer)\n",
        # accumulated_step: the same mistake in the window
        "    scaler.unscale_(optimizer)  # once per window, after the last backward: the true mean gradient\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n":
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n    scaler.unscale_(optimizer)\n",
    },
    "inverted_ratios_scaled_loss_returned": {
        '"speedup": baseline_s / candidate_s': '"speedup": candidate_s / baseline_s',
        '"memory_ratio": candidate_bytes / baseline_bytes': '"memory_ratio": baseline_bytes / candidate_bytes',
        "        scaler.scale(loss).backward()\n": "        loss = scaler.scale(loss)\n        loss.backward()\n",
        # accumulated_step: unscale_ moved into the loop over micro-batches (PyTorch raises at the second)
        "        window_losses.append(micro_loss.detach().float())\n"
        "    scaler.unscale_(optimizer)  # once per window":
        "        window_losses.append(micro_loss.detach().float())\n"
        "        scaler.unscale_(optimizer)  # once per window",
    },
    # each mutant below has one mistake in train_step and one in saved_bytes (independent parts)
    "no_update_bytes_per_view_address": {
        "        scaler.update()             # lower the scale": "        pass             # lower the scale",
        "storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()": "storages[t.data_ptr()] = t.nbytes",
        # accumulated_step: unscale_ and update after every micro-batch (the update lets unscale_ run again)
        "        window_losses.append(micro_loss.detach().float())\n":
        "        window_losses.append(micro_loss.detach().float())\n        scaler.unscale_(optimizer)\n"
        "        scaler.update()\n",
    },
    "cast_no_zero_grad_first_view_bytes": {
        "    optimizer.zero_grad()\n": "    if amp_dtype is not None:\n        model.to(amp_dtype)\n",
        "storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()":
        "storages.setdefault(t.untyped_storage().data_ptr(), t.nbytes)",
        # accumulated_step: train_step's tail inside the loop, one optimizer step per micro-batch
        "    scaler.unscale_(optimizer)  # once per window, after the last backward: the true mean gradient\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
        "    scaler.step(optimizer)  # skips the whole window if any micro-batch overflowed\n"
        "    scaler.update()         # one update per window: the scale drops once after an overflow\n":
        "",
        "        window_losses.append(micro_loss.detach().float())\n":
        "        window_losses.append(micro_loss.detach().float())\n        scaler.unscale_(optimizer)\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n        scaler.step(optimizer)\n"
        "        scaler.update()\n",
    },
    "summed_loss_unclipped": {
        "cross_entropy(model(x), y)": 'cross_entropy(model(x), y, reduction="sum")',
        "        loss.backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n":
        "        loss.backward()\n",
        "scaler.scale(micro_loss / k)": "scaler.scale(micro_loss)",  # accumulated_step: not divided by k
        # and a blind audit's crash: saved_bytes raises, after compare's two median_seconds calls
        "    storages: dict[int, int] = {}\n": "    storages: dict[int, int] = {}\n    raise RuntimeError('not yet')\n",
    },
    "no_autocast_no_scaler_step": {
        "enabled=amp_dtype is not None": "enabled=False",
        "        scaler.step(optimizer)      # skipped": "        optimizer.step()      # skipped",
        '"memory_ratio": candidate_bytes / baseline_bytes': '"mem_ratio": candidate_bytes / baseline_bytes',
        # accumulated_step: the scale updated after every micro-batch (PyTorch raises at the first)
        "        window_losses.append(micro_loss.detach().float())\n":
        "        window_losses.append(micro_loss.detach().float())\n        scaler.update()\n",
    },
    # the runtime's copies, three ways (each mutant hands in one median_seconds and one saved_bytes way);
    # the learner's own functions stay in the file under other names
    "imported_median_per_tensor_bytes": {
        "def median_seconds(": "from distlab.measure.timing import median_seconds\n\n\ndef _own_median_seconds(",
        "storages[t.untyped_storage().data_ptr()]": "storages[len(storages)]",  # one entry per saved tensor
    },
    "aliased_median_wrapped_saved_bytes": {
        "def median_seconds(": "import distlab.measure.timing\n\n"
                               "median_seconds = distlab.measure.timing.median_seconds\n\n\n"
                               "def _own_median_seconds(",
        "def saved_bytes(": "def saved_bytes(fn):\n    import distlab.measure.memory\n\n"
                            "    return distlab.measure.memory.saved_tensor_bytes(fn)\n\n\ndef _own_saved_bytes(",
    },
    "wrapped_median_imported_saved_bytes": {  # the wrapper's name is bound when the file is imported
        "def median_seconds(": "from distlab.measure.timing import median_seconds as _runtime_median\n\n\n"
                               "def median_seconds(*args, **kwargs):\n    return _runtime_median(*args, **kwargs)\n\n\n"
                               "def _own_median_seconds(",
        "def saved_bytes(": "from distlab.measure.memory import saved_tensor_bytes as saved_bytes\n\n\n"
                            "def _own_saved_bytes(",
    },
    # the runtime's counter class, used as the learner's own saved_bytes
    "counter_class_saved_bytes": {
        "def saved_bytes(": "def saved_bytes(fn):\n    from distlab.measure.memory import SavedTensors\n\n"
                            "    with SavedTensors() as counter:\n        fn()\n    return counter.total\n\n\n"
                            "def _own_saved_bytes(",
        # accumulated_step: the micro-batches' losses summed, one backward per window (k graphs held at once)
        "    window_losses = []\n": "    window_losses, total = [], 0\n",
        "        scaler.scale(micro_loss / k).backward()": "        total = total + micro_loss / k",
        "    scaler.unscale_(optimizer)  # once per window": "    scaler.scale(total).backward()\n"
                                                          "    scaler.unscale_(optimizer)  # once per window",
    },
    # A hand-written timing loop on a clock imported by name (``from time import perf_counter``): the
    # virtual clock is what it reads too, so only its one mistake, no warm-up, fails.
    "perf_counter_by_name_no_warmup": {
        "from torch.utils import benchmark\n": "from torch.utils import benchmark\nimport statistics\n"
                                              "from time import perf_counter\n",
        "    for _ in range(warmup):\n        fn()\n        sync()\n"
        "    timer = benchmark.Timer(stmt=\"fn(); sync()\", globals={\"fn\": fn, \"sync\": sync},\n"
        "                            num_threads=torch.get_num_threads())\n"
        "    return timer.blocked_autorange(min_run_time=min_run_time).median\n":
        "    times = []\n    while sum(times) < min_run_time:\n        start = perf_counter()\n        fn()\n"
        "        sync()\n        times.append(perf_counter() - start)\n    return statistics.median(times)\n",
    },
    # The rank dies inside median_seconds (it kills itself here, as gloo's abort or the OOM killer would): the
    # measuring ended the launch, so its criteria say how and the real model (measured by it) is not run; the
    # launch that runs the rest of this file (last of the mutants: the files after it run in it too) grades
    # accumulated_step, and train_step's runs, kept before, are graded as they are.
    "killed_in_median_seconds": {
        "    for _ in range(warmup):\n        fn()\n        sync()\n":
        "    import os\n    import signal\n\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    },
}
SPEEDUP_CRITERIA = [f"measuring: {t}" for t in check.CASE_TITLES.values()]  # earned by median_seconds
MEMORY_CRITERION = "measuring: saved-activation bytes and memory ratio"     # earned by saved_bytes


# On a CPU the real model's speedup is reported, not graded, and a learner's model (REAL_MODEL) takes
# most of a file's grading where the CPU lacks bf16 instructions: a small one shows the same in a second.
# On a GPU the speedup is graded, on the learner's model.
REAL_MODELS = {**check.REAL_MODEL, "cpu": dict(in_features=64, hidden=128, depth=2, batch=64)}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex03"), FILE, MUTANTS)
    paths["stub"] = EXERCISES / FILE
    paths["independent"] = independent.path(3)
    graded = dict(zip(paths, check.grade(list(paths.values()), real_models=REAL_MODELS)))
    return graded


def test_a_cpu_clock_and_a_loss_outside_autocast_are_named(reports):
    fails = failed(reports["cpu_clock_loop"])
    order, wait = "fp16 GradScaler order: scale, backward, unscale_, clip, step, update", \
        "measuring: asynchronous work is synchronised"
    assert set(fails) == {order, wait}, fails
    assert fails[wait].startswith("you timed with time.process_time(), which counts this process's CPU time: the "
                                  "time it waits in sync()")
    assert "the loss given to scaler.scale() was float16, so the cross-entropy ran in float16 (under autocast it " \
        "runs in float32)" in fails[order], fails[order]


def test_solution_full_marks(reports):
    report = reports["solution"]
    assert report.score == report.max_score, report.feedback
    assert report.measurements["bf16_max_loss_gap"] <= check.LOSS_TOL
    assert 0.3 < report.measurements["real_memory_ratio"] < 0.7  # bf16 activations: about half of fp32's
    assert any("saved_tensors_hooks" in n or "max_memory_allocated" in n for n in report.notes)


def test_a_perf_counter_loop_until_min_run_time_is_full_marks(reports):
    r = reports["legal_perf_counter_loop"]
    assert r.score == r.max_score, r.feedback


def test_the_independent_solution_scores_full_marks(reports):
    r = reports["independent"]
    assert r.score == r.max_score, r.feedback


def test_stub_not_implemented(reports):
    report = reports["stub"]
    assert report.score == 0
    assert "not implemented yet" in report.feedback


def test_a_rank_killed_in_the_measuring_costs_the_measuring_only(reports):
    r = reports["killed_in_median_seconds"]
    lost = failed(r)
    assert set(lost) == {*SPEEDUP_CRITERIA, MEMORY_CRITERION}, lost
    assert lost[SPEEDUP_CRITERIA[0]].startswith("compare did not finish: rank 0 was killed by signal 9 (SIGKILL)")
    assert all(lost[c] == f"not checked: compare did not finish (see '{SPEEDUP_CRITERIA[0]}')"
               for c in [*SPEEDUP_CRITERIA[1:], MEMORY_CRITERION])
    assert "real-model measurement not available: compare did not finish" in r.notes


def test_missing_warmup(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "slow first calls")
    assert "call fn(); sync() `warmup` times before timing" in fb


def test_a_clock_imported_by_name_is_the_virtual_one(reports):
    bad = failed(reports["perf_counter_by_name_no_warmup"])
    assert list(bad) == ["measuring: slow first calls are warmed up"], bad  # steady, async, outliers: right
    assert "call fn(); sync() `warmup` times before timing" in bad["measuring: slow first calls are warmed up"]


def test_missing_sync(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "asynchronous work")
    assert "time `fn(); sync()` together" in fb


def test_mean_dragged_by_outliers(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "outliers")
    assert "report the median per call, not the mean" in fb


def test_independent_mistakes_do_not_fail_other_parts(reports):
    bad = failed(reports["no_warmup_no_sync_mean_clip_scaled"])
    assert not any("steady" in k or "memory ratio" in k or "autocast" in k for k in bad), bad


def test_clip_before_unscale(reports):
    fb = feedback_of(reports["no_warmup_no_sync_mean_clip_scaled"], "GradScaler order")
    assert "you clipped the scaled gradients; call scaler.unscale_(optimizer) before clip_grad_norm_" in fb


def test_wrong_ratio_direction(reports):
    report = reports["inverted_ratios_scaled_loss_returned"]
    assert "its inverse: speedup = baseline_s / candidate_s" in feedback_of(report, "steady workload")
    assert "its inverse" in feedback_of(report, "memory ratio")


def test_an_accumulated_step_that_keeps_the_gradients_it_was_handed_is_named(reports):
    report = reports["accumulated_no_zero_grad"]
    assert list(failed(report)) == ["measuring: asynchronous work is synchronised",
                                    "measuring: outliers do not drag the result (median)",
                                    "fp16 accumulation over 4 micro-batches matches the reference (3 windows)"], \
        report.feedback
    assert feedback_of(report, "fp16 accumulation over").startswith(
        "accumulated_step did not clear the gradients it was handed: when window 1's first backward began, .grad "
        "still held what the grader had left there (NaN")


def test_timing_fewer_than_min_run_time_seconds_is_named(reports):
    said = feedback_of(reports["accumulated_no_zero_grad"], "outliers")
    assert said.startswith("median_seconds (called at ex03_amp.py:") and \
        "measured 0.2 s of the steady workload (from its first reading of the clock to its last), where " \
        "min_run_time was 0.3 s: keep timing until at least min_run_time seconds were measured" in said, said


def test_a_sync_of_compares_own_not_the_one_it_was_given_is_named(reports):
    said = feedback_of(reports["accumulated_no_zero_grad"], "asynchronous")
    assert re.match(r"compare called median_seconds at ex03_amp\.py:\d+ with another sync than the one compare was "
                    r"given, and the async workload's sync\(\) never ran while it timed", said), said
    assert "first difference" not in said


def test_saved_tensors_left_out_by_kind_are_named(reports):
    said = feedback_of(reports["cuda_autocast_clip_by_value"], "memory ratio")
    assert said.startswith("saved_bytes counted 320,000 bytes for a workload whose backward saves 400,000: it left out "
                           "the embedding's int64 indices (80,000 bytes)"), said


def test_a_timer_at_one_thread_is_named(reports):
    said = feedback_of(reports["cuda_autocast_clip_by_value"], "steady workload")
    assert said.startswith("the workloads ran with 1 torch thread(s) while median_seconds timed them, where its caller "
                           "runs 2"), said


def test_the_fastest_call_reported_is_named(reports):
    said = feedback_of(reports["cuda_autocast_clip_by_value"], "outliers")
    assert re.match(r"median_seconds \(called at ex03_amp\.py:\d+\) returned 0\.002 s for the outliers workload's "
                    r"baseline, its fastest call's time, where its median call takes 0\.02 s", said), said


def test_every_forward_of_a_window_before_its_backwards_is_named(reports):
    said = feedback_of(reports["cuda_autocast_clip_by_value"], "once per window")
    assert said.startswith("window 1 ran the model's forwards and backwards in the order F F F F B B B B"), said


def test_look_alikes_are_named_at_their_lines(reports):
    report = reports["cuda_autocast_clip_by_value"]
    assert re.search(r"you clipped with torch\.nn\.utils\.clip_grad_value_ \(ex03_amp\.py:\d+\), which clamps each "
                     "gradient element", feedback_of(report, "float32 step")), report.feedback
    if not torch.cuda.is_available():
        assert re.search(r"you entered torch\.cuda\.amp\.autocast \(ex03_amp\.py:\d+\), which autocasts CUDA ops "
                         "only", feedback_of(report, "bf16 autocast")), report.feedback


def test_no_autocast_and_unscaled_step(reports):
    report = reports["no_autocast_no_scaler_step"]
    assert "run the forward pass and the loss inside torch.autocast" in feedback_of(report, "bf16 autocast")
    assert "'optimizer.step'" in feedback_of(report, "GradScaler order")


def test_missing_key_costs_its_criterion_only(reports):
    report = reports["no_autocast_no_scaler_step"]
    assert "compare() returned a dict without 'memory_ratio'" in feedback_of(report, "memory ratio")
    assert not any("steady" in k for k in failed(report))  # speedup was there: graded as usual
    assert any("real-model measurement not available" in n and "'memory_ratio'" in n for n in report.notes)


def _earned(report, name: str) -> tuple[float, str]:
    c = next(c for c in report.criteria if c.name == name)
    return c.earned, c.feedback


@pytest.mark.parametrize("mutant,how", [
    ("imported_median_per_tensor_bytes", "(distlab.measure.timing.median_seconds)"),
    ("aliased_median_wrapped_saved_bytes", "(distlab.measure.timing.median_seconds)"),
    ("wrapped_median_imported_saved_bytes", "(it calls distlab.measure.timing.median_seconds)"),
])
def test_median_seconds_from_distlab_earns_nothing(reports, mutant, how):
    report = reports[mutant]
    for name in SPEEDUP_CRITERIA:
        assert _earned(report, name) == (0, f"median_seconds is distlab's copy {how}: write your own")
    assert set(failed(report)) <= {*SPEEDUP_CRITERIA, MEMORY_CRITERION}, failed(report)  # train_step is theirs
    assert any(n.startswith("real-model measurement skipped: median_seconds is distlab's copy") for n in report.notes)


@pytest.mark.parametrize("mutant,how", [
    ("aliased_median_wrapped_saved_bytes", "(it calls distlab.measure.memory.saved_tensor_bytes)"),
    ("wrapped_median_imported_saved_bytes", "(distlab.measure.memory.saved_tensor_bytes)"),
    ("counter_class_saved_bytes", "(it calls distlab.measure.memory.SavedTensors._pack)"),
])
def test_saved_bytes_from_distlab_earns_nothing(reports, mutant, how):
    assert _earned(reports[mutant], MEMORY_CRITERION) == (0, f"saved_bytes is distlab's copy {how}: write your own")


@pytest.mark.parametrize("mutant,counted,how,ratio", [
    ("imported_median_per_tensor_bytes", "200,000", "the storage's 100,000 bytes once per saved tensor (2 x 100,000)",
     "0.5"),
    ("no_update_bytes_per_view_address", "50,000", "each view's own bytes (2 x 25,000)", "0.125"),
    ("cast_no_zero_grad_first_view_bytes", "25,000", "one view's 25,000 bytes for the storage", "0.0625"),
])
def test_storage_shared_by_views_counted_wrong(reports, mutant, counted, how, ratio):
    """Three wrong ways to count a storage that saved views share; the workload tells each from the right one."""
    fb = feedback_of(reports[mutant], "memory ratio")
    assert f"saved_bytes counted {counted} bytes" in fb and f"that is {how}" in fb, fb
    assert "2 views, a quarter each, of one 100,000-byte storage" in fb and f"not {ratio}:" in fb
    assert "count each storage once, keyed by t.untyped_storage().data_ptr()" in fb


def test_missing_scaler_update_named_and_other_parts_keep_their_marks(reports):
    report = reports["no_update_bytes_per_view_address"]
    order = feedback_of(report, "GradScaler order")
    assert "never scaler.update()" in order and "call scaler.update() after scaler.step(optimizer)" in order
    assert feedback_of(report, "inf gradients").startswith("scaler.update() not called: ")
    assert "(the step after it raised RuntimeError: unscale_() is being called after step()" in \
        feedback_of(report, "inf gradients")
    assert feedback_of(report, "losses within").startswith("scaler.update() not called: ")
    assert set(failed(report)) == {"fp16 GradScaler order: scale, backward, unscale_, clip, step, update",
                                   "fp16 step with inf gradients is skipped", MEMORY_CRITERION,
                                   ACC_PARITY + f" ({WINDOWS} windows)", ACC_ORDER, ACC_OVERFLOW,
                                   f"bf16 and fp16 losses within {check.LOSS_TOL} of float32 over {STEPS} "
                                   "steps"}, failed(report)


def test_model_cast_and_missing_zero_grad_named(reports):
    report = reports["cast_no_zero_grad_first_view_bytes"]
    fb = feedback_of(report, "float32 step matches")
    assert fb.startswith("when the backward of step 2 began, .grad still held gradients of norm") and \
        "no optimizer.zero_grad() ran between the step before and this backward" in fb and \
        "it belongs at the start of train_step" in fb, fb
    assert "keep the model in float32" in feedback_of(report, "bf16 autocast")
    for name in ("GradScaler order", "inf gradients", "losses within"):
        assert feedback_of(report, name).startswith("model cast to float16: the parameters, so their gradients, "
                                                    "are float16"), (name, feedback_of(report, name))
    assert not any("measuring: " in k and k != MEMORY_CRITERION for k in failed(report))


def test_summed_loss_and_missing_clip_named(reports):
    report = reports["summed_loss_unclipped"]
    fb = feedback_of(report, "float32 step matches")
    assert fb.startswith("the optimizer stepped with a gradient norm of") and "at step 1, where clipping to " \
        "max_norm=0.05 gives 0.05" in fb, fb
    fb = feedback_of(report, "losses within")
    assert "loss is 64x the float32 reference's, the batch size (64): the cross-entropy was summed" in fb, fb
    # the fp16 branch clips, but a summed loss times the scale overflows float16: its first step is skipped
    fb = feedback_of(report, "GradScaler order")
    assert "scaler.step skipped optimizer.step because the scaled gradients overflowed float16" in fb and \
        "the first fp16 loss is 64x the float32 reference's" in fb, fb
    assert not any("autocast" in k or "inf gradients" in k for k in failed(report))


def test_a_saved_bytes_that_raises_costs_the_memory_and_compares_own_criteria_only(reports):
    report = reports["summed_loss_unclipped"]
    bad = failed(report)
    measuring = {k for k in bad if k.startswith("measuring")}
    assert measuring == {"measuring: saved-activation bytes and memory ratio",
                         "measuring: speedup of a steady workload (direction: baseline / candidate)"}, bad
    assert re.match(r"saved_bytes / compare raised RuntimeError: not yet \(ex03_amp.py line \d+ in saved_bytes: ",
                    feedback_of(report, "memory ratio")), feedback_of(report, "memory ratio")
    # median_seconds' own criteria: judged from the two seconds it returned to compare
    fb = next(c.feedback for c in report.criteria if "outliers" in c.name)
    assert fb.startswith("4 (truth 4) (from the two seconds median_seconds returned: compare raised RuntimeError: "
                         "not yet (ex03_amp.py line "), fb


def test_scaled_loss_returned_named(reports):
    fb = feedback_of(reports["inverted_ratios_scaled_loss_returned"], "losses within")
    assert fb.startswith("the fp16 loss train_step returned is 65536x the reference's, the GradScaler's scale"), fb


def _observation(capability: list[int] | None = None, **parts) -> AmpObservation:
    """No launch: one file's observation whose every part raised NotImplementedError, but ``parts``."""
    broken = "NotImplementedError:  (line 1: raise NotImplementedError)"
    every = dict(autocast=Autocast(error=broken), parity=Parity(error=broken), scaler=Scaler(error=broken),
                 measure=Measure(error=broken), accumulation=Accumulation(error=broken), real=RealModel(error=broken),
                 answers=Answers())
    return AmpObservation(capability=capability, **{**every, **parts})


@pytest.mark.parametrize("capability,graded", [([9, 0], True), ([7, 5], False), (None, False)])
def test_real_speedup_graded_on_a_gpu_with_bf16_tensor_cores_only(capability, graded):
    """No launch: on compute capability 8.0+ the [cuda] criterion is judged too, and the marks still add up to 10."""
    real = RealModel(returned=dict(speedup=3.0, baseline_s=0.003, candidate_s=0.001, memory_ratio=0.5),
                     peak_ratio=0.5, peak_method="torch.cuda.max_memory_allocated", device="GPU", model="MLP")
    run = check.Run(_observation(capability, real=real))
    report = check.EXERCISE.new_report()
    report.judge(check.criteria(run), run)
    report.scale_to()
    assert sum(c.points for c in report.criteria) == pytest.approx(10)
    assert report.score == pytest.approx(10 / 14 if graded else 0, abs=0.01)  # 13 points + 1, rounded to 0.01
    cuda = f"[cuda] real bf16 speedup at least {check.GPU_MIN_SPEEDUP}x"
    assert any(c.name == cuda for c in report.criteria) == graded


def _raised(fn) -> str:
    try:
        fn()
    except Exception as exc:  # what grader.main / the rank side see: "Type: message"
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("no error raised")


def _fp16_steps(mistake: str, steps: int = 2) -> None:
    """``steps`` fp16 GradScaler steps on the CPU, with one ``mistake`` (as the learner would make it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    if mistake == "half":
        model.half()
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(2, 8)).float().square().mean()
        scaler.scale(loss).backward()
        if mistake == "zero_grad_after_backward":
            opt.zero_grad()
        scaler.unscale_(opt)
        if mistake == "unscale_twice":
            scaler.unscale_(opt)
        scaler.step(opt)
        if mistake != "no_update":
            scaler.update()


@pytest.mark.parametrize("mistake,name", [
    ("no_update", "scaler.update() not called"),
    ("unscale_twice", "scaler.unscale_ called twice in one step"),
    ("half", "model cast to float16"),
    ("zero_grad_after_backward", "gradients cleared before scaler.step"),
])
def test_scaler_errors_translated(mistake, name):
    """No launch: each GradScaler misuse, run here, raises PyTorch's error, which KNOWN_ERRORS names."""
    from autograder.grader.diagnosis import translate

    error = _raised(lambda: _fp16_steps(mistake))
    assert translate(error, check.KNOWN_ERRORS).startswith(f"{name}: "), error


def test_step_count_and_unscaled_loss_named():
    """No launch: the causes of the float32 run and of the GradScaler order, on observations."""
    assert check.steps_not_one(PrecisionRun(steps=[1, 2, 2])) == (
        "train_step called optimizer.step() 2 times in step 2 (per step: [1, 2, 2]): step once per train_step, "
        "after clipping")
    assert check.steps_not_one(PrecisionRun(steps=[1, 1])) is None
    fb = check.not_scaled(Scaler(events=["backward", "unscale_", "step", "optimizer.step", "update"], grad_norm=0.05))
    assert "never scaler.scale(loss)" in fb
    assert check.not_scaled(Scaler(events=["scale"], grad_norm=0.05)) is None


ACC_PARITY = f"fp16 accumulation over {K} micro-batches matches the reference"
ACC_ORDER = "accumulation: scale per micro-batch; unscale_, clip, step, update once per window"
ACC_OVERFLOW = "accumulation: one overflowing micro-batch skips the window, the scale halves once"


def test_accumulation_unscale_per_micro_batch_named_at_the_learners_line(reports):
    fb = feedback_of(reports["inverted_ratios_scaled_loss_returned"], ACC_PARITY)
    assert fb.startswith("unscale_ per micro-batch: scaler.unscale_(optimizer) ran after a micro-batch's backward"), fb
    assert "RuntimeError: unscale_() has already been called on this optimizer since the last update()" in fb
    assert re.search(r"\(line \d+: scaler\.unscale_\(optimizer\)", fb), fb  # the learner's line, not PyTorch's
    assert "the window called ['scale', 'backward', 'unscale_', 'scale', 'backward', 'unscale_']" in fb


def test_accumulation_update_per_micro_batch_named(reports):
    report = reports["no_autocast_no_scaler_step"]
    for name in (ACC_PARITY, ACC_ORDER, ACC_OVERFLOW):
        fb = feedback_of(report, name)
        assert fb.startswith("update per micro-batch: scaler.update() ran after a micro-batch's backward"), fb
        assert "AssertionError: No inf checks were recorded prior to update." in fb


def test_accumulation_clip_before_unscale_named(reports):
    report = reports["no_warmup_no_sync_mean_clip_scaled"]
    fb = feedback_of(report, ACC_ORDER)
    assert fb.startswith("with max_norm=0.05 the optimizer stepped with a gradient norm of 7.63e-07, max_norm "
                         "divided by the scale (65536): you clipped the scaled gradients"), fb
    assert ACC_PARITY not in " ".join(failed(report))  # unclipped windows: the order of clip and unscale_ is moot


def test_accumulation_loss_not_divided_by_k_named(reports):
    report = reports["summed_loss_unclipped"]
    fb = feedback_of(report, ACC_PARITY)
    assert ", 4x the whole batch's mean gradient's" in fb and "divide each micro-batch's loss by k" in fb, fb
    assert not any(k.startswith("accumulation:") for k in failed(report))  # clipping hides it; overflow is right


def test_accumulation_steps_and_backwards_per_window_named(reports):
    fb = feedback_of(reports["cast_no_zero_grad_first_view_bytes"], ACC_PARITY)
    assert fb.startswith("window 1 called scaler.step 4 time(s) and optimizer.step 4 time(s)"), fb
    assert "skips the window" in " ".join(failed(reports["cast_no_zero_grad_first_view_bytes"]))
    report = reports["counter_class_saved_bytes"]
    fb = feedback_of(report, ACC_ORDER)
    assert fb.startswith("window 1 ran 1 backward(s) of 1 scaled loss(es) for 4 micro-batches"), fb
    assert ACC_PARITY not in " ".join(failed(report))  # one summed backward steps the same weights


def test_accumulation_reference_is_the_whole_batch_step():
    """No launch: the K-micro-batch reference steps the weights the whole batch's fp16 step would, within
    the check's tolerance (so a legal rounding passes), and the stepped norms are unclipped."""
    from autograder.checks.ex03_amp.accumulation import probes as accumulation
    from distlab.models import cpu_state, make_mlp
    from autograder.checks.ex03_amp.workloads import LR, MODEL, batches

    model = make_mlp(seed=3, **MODEL)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=LR), torch.amp.GradScaler("cpu")
    for x, y in batches(torch.device("cpu"))[:WINDOWS]:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    whole, ref = cpu_state(model), accumulation.reference()
    for name, value in ref["state"].items():
        torch.testing.assert_close(whole[name], value, rtol=ACC_RTOL / 10, atol=ACC_ATOL / 10)
    assert all(n < accumulation.NO_CLIP / 2 ** 16 for n in ref["norms"]), ref["norms"]


def test_a_file_without_accumulated_step_loses_only_that_part():
    """No launch: a file handed in before the part existed is told where its stub is."""
    from types import SimpleNamespace

    from autograder.checks.ex03_amp.accumulation import probes as accumulation

    obs = accumulation.observe(SimpleNamespace(), torch.device("cpu"))
    verdict = check.accumulation_parity(check.Run(_observation(accumulation=obs)))
    assert "defines no accumulated_step (copy its stub and docstring from exercises/ex03_amp.py)" in \
        str(verdict), verdict


def test_accumulation_unscale_and_update_per_micro_batch_named(reports):
    """It runs (each update lets the next unscale_ run): the window's calls show where it went wrong."""
    report = reports["no_update_bytes_per_view_address"]
    for name in (ACC_PARITY, ACC_ORDER, ACC_OVERFLOW):
        fb = feedback_of(report, name)
        assert fb.startswith("window 1 called ['scale', 'backward', 'unscale_', 'update', 'scale', "), fb
        assert "unscale_ before the last micro-batch's backward (scaler.update() 5 times let it run again)" in fb


def test_accumulation_update_per_micro_batch_cause_on_observations():
    """No launch: the cause that names an update inside the window, on a window's calls."""
    window = ["scale", "backward", "update", "scale", "backward", "unscale_", "step", "optimizer.step", "update"]
    fb = updated_per_micro(Windows(events=[window]))
    assert fb.startswith("window 1 called scaler.update() 2 times"), fb
    right = ["scale", "backward"] * K + ["unscale_", "step", "optimizer.step", "update"]
    assert updated_per_micro(Windows(events=[right])) is None
    assert unscaled_per_micro(Windows(events=[right])) is None
