"""Exercise 5 (crash-proof checkpoints): the solution resumes bit-identically after a stop and SIGKILLs
(fresh job, torchrun restarts, twice, another world size), and the mistakes (no data position,
no scheduler, no RNG, no pruning, writing in place, a step counter off by one, another rank's RNG,
model and optimizer not restored, a checkpoint collective on rank 0 only) are named, and only
what differs. "Not implemented yet" goes through the same code path as exercise 4's stub test
(grader.main.explain), and notebook 05's check cell grades this exercise's stub on every notebook run,
so no launch is spent on it here."""
from __future__ import annotations

import json
import os
import re

import pytest

from autograder.checks import ex05_checkpoint
from autograder.grader.diagnosis import translate
from distlab import checkpoint
from tests.exercises import independent
from tests.helpers import SOLUTIONS, failed, mutant


def test_commit_is_atomic_and_prune_keeps_the_last_k(tmp_path):
    for step in (1, 2, 3):
        staged = checkpoint.staging_path(tmp_path, step)
        staged.mkdir()
        with pytest.raises(FileNotFoundError):  # no .metadata: the write did not finish
            checkpoint.commit(tmp_path, step)
        (staged / checkpoint.METADATA).write_text("x")
        checkpoint.commit(tmp_path, step)
    checkpoint.staging_path(tmp_path, 4).mkdir()  # an interrupted write
    assert checkpoint.latest_complete(tmp_path)[0] == 3
    checkpoint.prune(tmp_path, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step_00000002", "step_00000003"]
    # a blind audit's prune before commit: the staging directory gone, said so (not "the write did not finish")
    with pytest.raises(FileNotFoundError, match="does not exist: nothing was staged for step 5, or it was removed "
                                                 r"before commit \(prune removes staging directories"):
        checkpoint.commit(tmp_path, 5)


# The data position as this rank's batch count (the habit of tutorials): right at 2 ranks, another stream at 1
PER_RANK_POSITION = {
    "        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n":
    "        for first in range(used * BATCH_SIZE, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n",
    "            used += world * BATCH_SIZE\n": "            used += 1\n"}

# The position derived from the step count (Hugging Face Trainer's resume): right at 2 ranks, another stream at 1
FROM_STEPS = {'    epoch, used = position["epoch"], position["samples"]\n':
              "    per_epoch = len(sampler) // BATCH_SIZE\n"
              "    epoch, used = step // per_epoch, step % per_epoch * world * BATCH_SIZE\n"}


@pytest.fixture(scope="module")
def solution_and_independent(tmp_path_factory):
    """The reference and the independent solution in every scenario, resharded to 1 rank here (cheapest;
    the CLI grades 2 -> 4): the independent one shares the reference and reshard launches (its restarts
    have a launch of their own), and so does a per-rank data position, in the reshard scenario only."""
    per_rank = mutant(tmp_path_factory.mktemp("per_rank"), "ex05_checkpoint.py", PER_RANK_POSITION)
    from_steps = mutant(tmp_path_factory.mktemp("from_steps"), "ex05_checkpoint.py", FROM_STEPS)
    # a blind audit's: each epoch's last full batch skipped (its reshard was charged with a per-rank position)
    last_skipped = mutant(tmp_path_factory.mktemp("last_skipped"), "ex05_checkpoint.py",
                          {"len(order) - BATCH_SIZE + 1, BATCH_SIZE)": "len(order) - BATCH_SIZE, BATCH_SIZE)"})
    return dict(zip(["solution", "independent", "per-rank position", "from steps", "last batch skipped"],
                    ex05_checkpoint.grade([SOLUTIONS / "ex05_checkpoint.py", independent.path(5), per_rank, from_steps,
                                           last_skipped], reshard_world=1,
                                          scenarios_of=[ex05_checkpoint.SCENARIOS] * 2 + [("reshard",)] * 3)))


@pytest.mark.slow
def test_solution_resumes_exactly_in_every_scenario(solution_and_independent):
    report = solution_and_independent["solution"]
    assert report.score == report.max_score, report.feedback
    assert "bit-identical to the uninterrupted run" in report.feedback
    assert "resumed from step 3" in report.feedback
    assert "every step's samples, learning rate, Adam step, RNG state and weights as the reference's" in \
        report.feedback


@pytest.mark.slow
def test_the_independent_solution_scores_full_marks(solution_and_independent):
    r = solution_and_independent["independent"]
    assert r.score == r.max_score, r.feedback


@pytest.mark.slow
def test_a_per_rank_data_position_is_named_at_another_world_size(solution_and_independent):
    f = failed(solution_and_independent["per-rank position"])
    assert list(f) == ["the data position means the same samples at world size 1"], f  # right at 2 ranks
    said = f["the data position means the same samples at world size 1"]
    assert said.startswith("the job at 1 rank began at sample 64 of epoch 1's stream, where the 2-rank run had "
                           "used 128"), said
    assert "the saved position counted this rank's own share" in said


@pytest.mark.slow
def test_an_epochs_last_batch_skipped_is_named_and_not_charged_to_the_reshard(solution_and_independent):
    f = failed(solution_and_independent["last batch skipped"])
    own = f["[W=2] the uninterrupted run matches a single-process reference"]
    assert "where step 5 is batch 4 of epoch 0, its last: the epoch's last full batch was skipped" in own, own
    assert f["the data position means the same samples at world size 1"].startswith(
        "not judged: the 2-rank run itself read samples "), f


@pytest.mark.slow
def test_a_position_from_the_step_count_is_named_at_another_world_size(solution_and_independent):
    f = failed(solution_and_independent["from steps"])
    assert list(f) == ["the data position means the same samples at world size 1"], f  # right at 2 ranks
    assert f["the data position means the same samples at world size 1"].startswith(
        "the job at 1 rank began at sample 144 of epoch 0's stream (rank 0 read "), f
    assert "where 9 steps at 1 rank would have left it, but the 2-rank run's 9 steps had used 128 samples of " \
        "epoch 1: the position was derived from the step count" in f["the data position means the same samples at " \
                                                                   "world size 1"]


MISSING_STATE = {
    # resume without the data position, the scheduler or the RNG state
    "        step, position = resumed\n": "        step, position = resumed[0], {\"epoch\": 0, \"samples\": 0}\n",
    "    scheduler.load_state_dict(state[\"scheduler\"])\n": "",
    "        torch.set_rng_state(rng[\"cpu\"])\n": "        pass\n",
    # keep every checkpoint
    "        prune(root, keep)\n": "",
    # write in place and trust the newest directory
    "    found = latest_complete(root)\n":
        "    found = max(((int(p.name[5:]), p) for p in Path(root).glob(\"step_*\")), default=None)\n",
    "    dcp.save(state, checkpoint_id=staged)\n":
        "    staged = final_path(root, step)\n    dcp.save(state, checkpoint_id=staged)\n",
    "        commit(root, step)  # atomic rename: a crash before this leaves only a .tmp- directory\n":
        "        pass\n",
}
# One mistake each, graded on the first scenarios only (the fresh job): they share its launches with
# MISSING_STATE's file. The last one fails the uninterrupted run, so it is last in the launch.
FRESH_ONLY = {
    "counter one ahead": {"        step, position = resumed\n":
                          "        step, position = resumed\n        step += 1  # the next step to run\n"},
    "rank 0's RNG on every rank": {"path / f\"rng-rank{dist.get_rank()}.pt\"": "path / \"rng-rank0.pt\"",
                                   # and a blind audit's (its feedback said "it was not restored"): seeded again
                                   # after the restore, on rank 0 only
                                   "    if resumed is not None:\n        step, position = resumed\n":
                                   "    if resumed is not None:\n        step, position = resumed\n"
                                   "        if dist.get_rank() == 0:\n"
                                   "            torch.manual_seed(seed + dist.get_rank())\n"},
    # a blind audit's (its feedback said the state "was not restored, or a seeding after the restore replaced it")
    "RNG saved on rank 0 only": {'    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")\n':
                                 '    if dist.get_rank() == 0:\n'
                                 '        torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")\n'},
    "rebuilt after loading": {
        "        step, position = resumed\n":
            "        step, position = resumed\n        model, optimizer, scheduler = build(steps, seed)\n"},
    # Three mistakes both of the learner's runs share (so every resume is exact), seen at step 1 against
    # the single-process reference: the scheduler stepped first, one seed for every rank, another shuffle.
    "shared by both runs": {
        "            optimizer.step()\n            scheduler.step()\n":
            "            scheduler.step()\n            optimizer.step()\n",
        "    torch.manual_seed(seed + dist.get_rank())\n": "    torch.manual_seed(seed)\n",
        "DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)":
            "DistributedSampler(dataset, shuffle=True, seed=seed + 1, drop_last=True)"},
    # A blind audit's legal-looking variant: a DataLoader over the rank's indices, without generator=, which draws
    # from the global RNG each time it is iterated (its feedback said the ranks were not seeded, and the RNG state
    # not restored: both were)
    "DataLoader without a generator": {
        "        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n": (
            "        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE,\n"
            "                                             sampler=order[used // world:], drop_last=True)\n"
            "        for x, y in loader:\n"),
        "            batch = [dataset[i] for i in order[first:first + BATCH_SIZE]]\n"
        "            x = torch.stack([s[0] for s in batch]).to(device)\n"
        "            y = torch.stack([s[1] for s in batch]).to(device)\n":
            "            x, y = x.to(device), y.to(device)\n"},
    # A blind audit's (its feedback said the scheduler was not restored: it was): set_state_dict left out
    "set_state_dict left out": {
        '    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])\n': ""},
    # A blind audit's (full marks before): on_step called before the step's save
    "on_step before the save": {
        "            if step % save_every == 0:\n": "            if on_step is not None:\n"
                                                    "                on_step(step, optimizer)\n"
                                                    "            if step % save_every == 0:\n",
        "keep)\n            if on_step is not None:\n                on_step(step, optimizer)\n": "keep)\n"},
    # A generated mutant (bench_feedback: a literal changed): the steps numbered from 2.
    "first step numbered 2": {"    step, position = 0, {": "    step, position = 1, {"},
    "dcp.save on rank 0 only": {"    dcp.save(state, checkpoint_id=staged)\n":
                                "    if dist.get_rank() == 0:\n        dcp.save(state, checkpoint_id=staged)\n"},
}
# Written in place, loaded through latest_complete(): the first kill (inside DCP's writes) cannot show it, only
# the second (after DCP's save, before rank 1's RNG file): the restart scenario alone.
IN_PLACE = {"    staged = staging_path(root, step)\n": "    staged = final_path(root, step)\n",
            "        commit(root, step)  # atomic rename: a crash before this leaves only a .tmp- directory\n": ""}
# A fresh job that crashes, with a restart scenario that is right: the fresh job's crash costs the fresh job only
# (the restart scenario runs again alone, its kills where they belong). Rank 0 removes the staging directory of the
# write a crash interrupted, which the fresh job (stopped between saves) never has.
FRESH_CRASH = {"from pathlib import Path\n": "import shutil\nfrom pathlib import Path\n",
               "        step, position = resumed\n":
               "        step, position = resumed\n        if dist.get_rank() == 0:  # drop the interrupted write\n"
               "            shutil.rmtree(staging_path(root, step + save_every))\n"}
# A blind audit's: the samples of a step counted after its checkpoint is saved (its feedback said the position
# "was not restored"; at 4 ranks, "continue from the saved position", which the code did)
POSITION_SAVED_FIRST = {"            used += world * BATCH_SIZE\n": "",
                        "keep)\n            if on_step":
                        "keep)\n            used += world * BATCH_SIZE\n            if on_step"}
# Issue 37's: the short tail of an epoch trained on. Right at 2 ranks (160 samples: 5 whole batches a rank); at 4
# the reshard resumes at index 32 of each rank's 40, past the last whole batch
SHORT_BATCH = {"len(order) - BATCH_SIZE + 1, BATCH_SIZE)": "len(order), BATCH_SIZE)"}
# A blind audit's (full marks before): each rank's RNG file saved into the committed directory, after the commit;
# and another's (its feedback said the position was not restored): set_epoch only where an epoch starts, which
# the second restart, mid-epoch 1, shows
RNG_AFTER_COMMIT = {
    '    torch.save(rng, staged / f"rng-rank{dist.get_rank()}.pt")\n': "",
    "        prune(root, keep)\n    dist.barrier()\n":
    "        prune(root, keep)\n    dist.barrier()\n"
    '    torch.save(rng, final_path(root, step) / f"rng-rank{dist.get_rank()}.pt")\n',
    "        sampler.set_epoch(epoch)\n": "        if used == 0:\n            sampler.set_epoch(epoch)\n"}
# A blind audit's (full marks before: the reshard resumed where its ranks had no whole batch left): the position
# rounded down to a whole step at the new world size; right at 2 ranks, seen at 4 from the mid-epoch checkpoint
BATCH_ALIGNED = {"        for first in range(used // world, len(order) - BATCH_SIZE + 1, BATCH_SIZE):\n":
                 "        for first in range(used // (world * BATCH_SIZE) * BATCH_SIZE, len(order) - BATCH_SIZE + 1, "
                 "BATCH_SIZE):\n"}
FRESH = "a fresh job resumes exactly"
REFERENCE = "[W=2] the uninterrupted run matches a single-process reference"


# Not marked slow although it takes ~50 s: exercise 5's launches in make test-fast (its cheapest): one
# reference launch for the five files, one resume launch (three process starts, for the restarts).
@pytest.fixture(scope="module")
def mutants(tmp_path_factory):
    changes = {"missing state": MISSING_STATE, "in place": IN_PLACE, "fresh crash": FRESH_CRASH,
               "position saved first": POSITION_SAVED_FIRST, "short batch": SHORT_BATCH,
               "RNG after the commit": RNG_AFTER_COMMIT, "batch aligned": BATCH_ALIGNED, **FRESH_ONLY}
    paths = [mutant(tmp_path_factory.mktemp(f"m{i}"), "ex05_checkpoint.py", c) for i, c in enumerate(changes.values())]
    scenarios = [("fresh", "restart"), ("restart",), ("fresh", "restart", "reshard"), ("fresh", "reshard"),
                 ("reshard",), ("restart",), ("fresh", "reshard")] + [("fresh",)] * len(FRESH_ONLY)
    reports = ex05_checkpoint.grade(paths, scenarios_of=scenarios)
    return dict(zip(changes, reports))


def test_missing_state_pruning_and_in_place_writes_are_named(mutants):
    report = mutants["missing state"]
    fails = failed(report)
    assert "holds ['step_00000003', 'step_00000006', 'step_00000009', 'step_00000012']" in \
        fails["keeps only the last K checkpoints"]
    fresh = fails[FRESH]
    # Each was saved but not restored: the message says where it was saved, and advises no save.
    assert "at step 4 rank 0 read samples" in fresh and "your checkpoint holds 'data' (dcp.save at " \
        "ex05_checkpoint.py:92), but it was not restored: continue from the epoch and samples used" in fresh
    assert "(the samples of step 1)" in fresh  # the epoch started over
    assert "the learning rate it set for step 5 was" in fresh and "your checkpoint holds 'scheduler' (dcp.save at " \
        "ex05_checkpoint.py:92), but it was not restored: scheduler.load_state_dict()" in fresh
    assert "not the one saved with the checkpoint, which holds it in 'cpu' (torch.save at ex05_checkpoint.py:96): " \
        "it was not restored, or a seeding after the restore replaced it" in fresh, fresh
    assert "save the data position" not in fresh and "save scheduler" not in fresh and "save each" not in fresh
    assert "weights" not in fresh and "Adam" not in fresh and "step counter" not in fresh  # those were restored
    write = fails["an interrupted write is never loaded"]
    assert "killed while writing step 6's checkpoint" in write and "should resume from step 3" in write
    assert ".metadata" in write  # the restarted job tripped on the half-written checkpoint
    assert fails["two crashes, still exact"] == "not checked: needs 'torchrun --max-restarts resumes exactly' first"
    assert REFERENCE not in fails  # its uninterrupted run is the contract's: what it loses is in resuming


def test_a_checkpoint_that_looks_complete_before_every_ranks_files_are_in_it_is_named(mutants):
    fails = failed(mutants["in place"])
    write = fails["an interrupted write is never loaded"]
    assert re.search(r"rank 1 was killed inside step 9's save_checkpoint, after dcp\.save had returned and before its "
                     r"torch\.save at ex05_checkpoint\.py:\d+; step 9's checkpoint already looked complete to "
                     r"latest_complete\(\) then .*the restarted job resumed from it \(its first step was 10\)", write)
    assert "commit() on rank 0" not in write  # advice of a step it took elsewhere: none (it never commits here)
    assert "torchrun --max-restarts resumes exactly" not in fails  # steps 4-8, before the kill, were exact
    # what the second restart restored was not all saved: not "restore the RNG state", which the file does (audit Q)
    assert re.fullmatch(r"not judged: the job restarted after the second kill resumed from step 9's checkpoint, to "
                        r"which rank 1 had not yet written its torch\.save \(ex05_checkpoint\.py:\d+\): what it "
                        r"restored was not all saved \(see 'an interrupted write is never loaded'\)",
                        fails["two crashes, still exact"]), fails["two crashes, still exact"]


def test_a_commit_before_a_ranks_own_files_is_named_from_the_directory(tmp_path):
    """No launch: what the ranks left (rank 0's committed step 3; rank 1's error writing into its staging
    directory) is named as the early commit, and, without the committed directory, not."""
    from distlab import RankFailure

    run = ex05_checkpoint.Run(tmp_path, 4)
    err = RankFailure(1, "RuntimeError", f"Parent directory {tmp_path}/A/.tmp-step_00000003 does not exist.", "")
    assert ex05_checkpoint.commit_causes.committed_under_a_rank(run, err) is None  # nothing committed: not this cause
    (checkpoint.final_path(tmp_path / "A", 3)).mkdir(parents=True)
    (checkpoint.final_path(tmp_path / "A", 3) / ".metadata").touch()
    assert ex05_checkpoint.commit_causes.committed_under_a_rank(run, err).startswith(
        "rank 1 wrote into step 3's staging directory (A/.tmp-step_00000003) after rank 0 had committed it "
        "(renamed it to step_00000003)")


def test_a_commit_on_every_rank_is_named_from_the_directory(tmp_path):
    """No launch: a blind audit's commit on every rank (0 of 10, said as the FileNotFoundError of the rename)."""
    from distlab import RankFailure

    run = ex05_checkpoint.Run(tmp_path, 4)
    staged, final = checkpoint.staging_path(tmp_path / "A", 3), checkpoint.final_path(tmp_path / "A", 3)
    err = RankFailure(1, "FileNotFoundError", f"[Errno 2] No such file or directory: '{staged}' -> '{final}'", "")
    assert ex05_checkpoint.commit_causes.committed_twice(run, err) is None  # nothing committed: not this cause
    final.mkdir(parents=True)
    assert ex05_checkpoint.commit_causes.committed_twice(run, err).startswith(
        "commit ran on more than one rank: rank 1's found no .tmp-step_00000003 to rename, another rank's had "
        "already renamed it to step_00000003")


def test_a_rank_that_died_before_a_collective_did_not_skip_it(tmp_path):
    """No launch: a blind audit's rank 1 that aborted (or left by os._exit) on entering save_checkpoint was told
    "get_state_dict ran on rank 0 ... but not on rank 1: ... do not put it under `if rank == 0:`"; a rank that
    skipped the call and raised later still gets that sentence."""
    import json

    from distlab import RankFailure
    from distlab.runtime.failures import RankExited, RankKilled

    run = ex05_checkpoint.Run(tmp_path, 2)
    call = {"call": "get_state_dict", "attempt": 0, "tag": "first"}
    (tmp_path / "A-calls-rank0.jsonl").write_text("\n".join(json.dumps({**call, "after_step": s}) for s in (0, 3)))
    (tmp_path / "A-calls-rank1.jsonl").write_text(json.dumps({**call, "after_step": 0}))
    one_sided = ex05_checkpoint.causes.one_sided_collective
    for died in (RankKilled(1, 6), RankExited(1, 3)):
        assert one_sided(run, "A", world=2, err=died) is None, died
    for other in (None, RankFailure(1, "RuntimeError", "Parent directory does not exist", ""), RankKilled(0, 6)):
        assert one_sided(run, "A", world=2, err=other).startswith(
            "get_state_dict ran on rank 0 (at step 4) but not on rank 1: it is a collective"), other


def test_a_sampler_without_drop_last_is_named(tmp_path):
    """No launch: a blind audit's DistributedSampler without drop_last=True (full marks before: 160 samples divide
    among 2 and 4 ranks, so its shards were the contract's); the rank-side spy logs such a sampler's line."""
    import json

    from autograder.checks.ex05_checkpoint.reshard import sampler_keeps_tail

    run = ex05_checkpoint.Run(tmp_path, 4)
    assert sampler_keeps_tail(run) is None
    (tmp_path / "A-calls-rank0.jsonl").write_text(json.dumps(
        {"call": "DistributedSampler", "after_step": 0, "attempt": 0, "tag": "first", "file": "ex05_checkpoint.py",
         "line": 169}))
    assert sampler_keeps_tail(run).startswith(
        "train built its DistributedSampler without drop_last=True (ex05_checkpoint.py:169), where the contract's has "
        "it: 160 samples divide among 2 and 4 ranks")


def test_a_new_rank_with_another_ranks_rng_state_is_named(tmp_path):
    """No launch: a blind audit's load_checkpoint that falls back to rng-rank0.pt where a rank's own file is missing
    (full marks before): after the 2-rank checkpoint, ranks 2 and 3 drew rank 0's dropout masks."""
    import json

    from autograder.checks.ex05_checkpoint.reshard import shared_rng

    run = ex05_checkpoint.Run(tmp_path, 4)

    def write(states: list[str]) -> None:
        for r, rng in enumerate(states):
            pre = {"fp": 0.0, "adam_step": 9.0, "moments": 0.0, "lr": 0.1, "rng": rng}
            (tmp_path / f"R-rank{r}.jsonl").write_text(json.dumps(
                {"attempt": 0, "tag": "reshard", "step": 10, "data": [], "fp": 0.0, "lr": 0.1, "pre": pre}))

    write(["a", "b", "c", "d"])
    assert shared_rng(run) is None
    write(["a", "b", "a", "b"])
    assert shared_rng(run) == (
        "at step 10 of the job at 4 ranks, rank 2's RNG state was rank 0's, so the two drew the same dropout masks: "
        "the 2-rank checkpoint has no rng-rank2.pt, and a rank without its file keeps its own seed's (seed + rank), "
        "not another rank's")


def test_a_rank_that_returns_before_rank_0_commits_is_named_by_the_order_of_events(tmp_path):
    """No launch: rank 0's commit held until rank 1 waits in a barrier rank 0 has not passed (the contract's second
    barrier) or has returned from save_checkpoint (a blind audit's save without it got full marks)."""
    from autograder.checks.ex05_checkpoint.commit_order import CommitOrder

    phase = {"name": "A", "tag": "ref"}
    rank0, rank1 = CommitOrder(phase, 0, tmp_path), CommitOrder(phase, 1, tmp_path)
    rank1.barrier(entering=True)  # the first barrier, which both pass
    rank0.barrier(entering=True)
    rank0.barrier(entering=False)
    rank1.barrier(entering=True)  # rank 1 waits in the second
    rank0.before_commit(3)
    run = ex05_checkpoint.Run(tmp_path, 4)
    assert ex05_checkpoint.commit_causes.ran_ahead(run) is None
    rank1.barrier(entering=True)  # the next save's first barrier, and none after its commit
    rank0.barrier(entering=False)
    rank0.barrier(entering=False)
    rank1.returned(6)
    rank0.before_commit(6)
    assert ex05_checkpoint.commit_causes.ran_ahead(run).startswith(
        "rank 1 returned from step 6's save_checkpoint while rank 0 had not yet committed it")


def test_a_fresh_job_that_crashes_costs_the_fresh_job_only(mutants):
    # it crashes at another world size too (its reshard scenario resumes between saves): those two criteria go,
    # and the restart scenario in between is graded as it would be alone
    fails = failed(mutants["fresh crash"])
    reshard = "resumes at world size 4 from a 2-rank checkpoint"
    assert set(fails) == {FRESH, reshard, "the data position means the same samples at world size 4"}, fails
    assert re.search(r"the fresh job failed: attempt 0, rank 0 raised FileNotFoundError: .*\.tmp-step_00000006.*, at "
                     r"ex05_checkpoint\.py line \d+ in train: shutil\.rmtree", fails[FRESH]), fails[FRESH]
    assert "raised FileNotFoundError" in fails[reshard] and "shutil.rmtree" in fails[reshard]
    assert "DCP reshards" not in fails[reshard]  # the load is not in question: the failure's line is another call


def test_the_checkpoint_a_restart_read_is_judged_from_its_loads(tmp_path):
    # The first restart read step 3's checkpoint, the last committed before the killed write, and then failed
    # before training a step: the write was not loaded, whatever failed after. Read from a staging directory, it was.
    from autograder.checks.ex05_checkpoint.commit_causes import interrupted_write_loaded
    from autograder.checks.ex05_checkpoint.observations import CallRecord, Run

    run = Run(tmp_path, 4)
    for name, verdict in (("step_00000003", None), (".tmp-step_00000006", "it read the staging directory "
                                                    ".tmp-step_00000006, whose write had not finished, and never "
                                                    "trained again. Load only")):
        for r in range(2):
            (tmp_path / f"B-began-rank{r}").write_text("0")
            record = CallRecord(call="dcp.load", after_step=0, attempt=1, tag="restart", checkpoint=name)
            (tmp_path / f"B-calls-rank{r}.jsonl").write_text(json.dumps(record.to_wire()) + "\n")
        said = interrupted_write_loaded(run)
        assert said is None if verdict is None else verdict in said, said


def test_a_file_written_into_the_checkpoint_after_its_commit_is_named(mutants):
    f = failed(mutants["RNG after the commit"])
    assert list(f) == ["an interrupted write is never loaded", "two crashes, still exact"], f
    assert re.match(r"rank 0's torch\.save \(ex05_checkpoint\.py:\d+\) wrote into step_00000003, the committed "
                    r"checkpoint, after its commit \(its dcp\.save went to \.tmp-step_00000003\)",
                    f["an interrupted write is never loaded"]), f


def test_set_epoch_skipped_on_a_mid_epoch_resume_is_named(mutants):
    said = failed(mutants["RNG after the commit"])["two crashes, still exact"]
    assert re.search(r"rank [01] read samples \[[\d, ]+\]\.\.\., batch 1 of epoch 0's shuffle, where step 7 is batch 1 "
                     r"of epoch 1: the position within the epoch was restored, but the sampler still dealt epoch 0's "
                     r"order", said), said
    assert "not restored" not in said


def test_a_position_rounded_to_a_whole_batch_is_named_from_the_mid_epoch_resume(mutants):
    f = failed(mutants["batch aligned"])
    assert list(f) == ["the data position means the same samples at world size 4"], f  # right at 2 ranks
    assert f["the data position means the same samples at world size 4"].startswith(
        "the job at 4 ranks began at sample 64 of epoch 0's stream, the start of the 4 ranks' batch that sample 96 "
        "falls in, where the 2-rank run had used 96"), f


def test_a_short_last_batch_is_named_where_an_epoch_has_one(mutants):
    f = failed(mutants["short batch"])
    assert list(f) == ["the data position means the same samples at world size 4"], f  # right at 2 ranks
    assert f["the data position means the same samples at world size 4"].startswith(
        "at 4 ranks rank 0 trained step 10 on the last 8 indices of its share of epoch 1 (40 indices, 2 whole "
        "batches of 16), a batch shorter than BATCH_SIZE"), f


def test_a_step_counter_off_by_one_is_named_alone(mutants):
    fresh = failed(mutants["counter one ahead"])[FRESH]
    assert "the first step after resuming was numbered 5, but it trained exactly what the uninterrupted run " \
        "trained at step 4" in fresh
    assert "the checkpoint was written after step 3, so the step counter is 1 ahead" in fresh
    for other in ("data position", "scheduler", "get_rng_state", "set_state_dict"):
        assert other not in fresh  # data, schedule, RNG, model and optimizer were all restored


def test_another_ranks_rng_state_is_named(mutants):
    fresh = failed(mutants["rank 0's RNG on every rank"])[FRESH]
    assert "at step 4 rank 1's RNG state is rank 0's, so dropout drew rank 0's masks: each rank restores its own " \
        "rng-rank{R}.pt (the RNG state differs per rank)" in fresh, fresh
    assert "rank 0's RNG state, the first step after the resume, is the one the run's seeding makes before step 1 " \
        "(torch.manual_seed(seed + rank)), not the one saved with the checkpoint" in fresh, fresh
    assert "a seeding after the restore replaced it" in fresh


def test_a_position_saved_before_the_steps_samples_are_counted_is_named_at_both_world_sizes(mutants):
    f = failed(mutants["position saved first"])
    assert set(f) == {FRESH, "the data position means the same samples at world size 4"}, f
    assert "those of step 3 again, the step whose checkpoint it resumed from: the data position it resumed with is " \
        "where step 3 began, not where it ended" in f[FRESH], f[FRESH]
    assert "not restored" not in f[FRESH], f[FRESH]
    assert f["the data position means the same samples at world size 4"].startswith(
        "the job at 4 ranks began where the 2-rank run's step 9 began (rank 0 read ["), f


def test_model_optimizer_and_scheduler_not_restored_are_named_not_the_rest(mutants):
    fresh = failed(mutants["rebuilt after loading"])[FRESH]
    assert "at step 4 rank 0 resumed with other weights than the uninterrupted run had before step 4" in fresh
    assert "the freshly built model's: train the model the checkpoint was loaded into" in fresh
    assert "Adam's step count was 0 where the uninterrupted run's was 3" in fresh
    assert "the learning rate was" in fresh
    assert "samples" not in fresh and "RNG" not in fresh and "step counter" not in fresh


def test_mistakes_both_runs_share_are_named_against_the_reference(mutants):
    fails = failed(mutants["shared by both runs"])
    assert list(fails) == [REFERENCE]  # it resumes exactly: from its own uninterrupted run nothing differs
    msg = fails[REFERENCE]
    assert msg.startswith("step 1 trained with a learning rate of 0.00294889, the schedule's value for step 2, "
                          "where the reference's is 0.003: scheduler.step() ran before optimizer.step()"), msg
    assert "Call optimizer.step(), then scheduler.step()" in msg
    assert "rank 1's RNG state at step 1 is not torch.manual_seed(seed + 1)'s (every rank's is the " \
           "same: each was seeded alike)" in msg
    assert "rank 0 read samples" in msg
    assert "use DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)" in msg
    assert "set_epoch" not in msg  # it was called


def test_a_dataloader_without_a_generator_is_named_not_the_seeding_or_the_restore(mutants):
    f = failed(mutants["DataLoader without a generator"])
    assert set(f) == {REFERENCE, FRESH}, f
    assert re.search(r"rank [01]'s RNG state at step 1 is not the reference's, so dropout drew other masks: your "
                     r"DataLoader, iterated at ex05_checkpoint\.py:\d+, has no generator=", f[REFERENCE]), f[REFERENCE]
    assert "the resumed job iterated its DataLoader (at ex05_checkpoint.py:" in f[FRESH], f[FRESH]
    assert "manual_seed" not in f[REFERENCE] + f[FRESH] and "not restored" not in f[FRESH], f


def test_an_rng_state_saved_on_rank_0_only_is_named(mutants):
    f = failed(mutants["RNG saved on rank 0 only"])
    assert set(f) == {FRESH}, f
    assert "rank 1 never saved its RNG state. In the uninterrupted run only rank(s) [0] saved one, 'cpu' (torch.save " \
        "at ex05_checkpoint.py:" in f[FRESH], f[FRESH]
    assert "not restored" not in f[FRESH], f[FRESH]


def test_param_groups_not_set_back_after_dcp_load_are_named(mutants):
    f = failed(mutants["set_state_dict left out"])
    assert set(f) == {FRESH}, f
    assert "the resumed job called dcp.load but neither set_state_dict nor set_optimizer_state_dict" in f[FRESH]
    assert "scheduler.load_state_dict" not in f[FRESH] and "started over" not in f[FRESH], f[FRESH]


def test_on_step_before_the_save_is_named(mutants):
    f = failed(mutants["on_step before the save"])
    assert set(f) == {REFERENCE}, f
    assert f[REFERENCE].startswith("on_step(3) ran before step 3's save_checkpoint (its dcp.save began after the "
                                   "report)"), f[REFERENCE]


def test_steps_numbered_from_2_are_named(mutants):
    msg = failed(mutants["first step numbered 2"])[REFERENCE]
    assert msg.startswith("the first step the uninterrupted run reported to on_step was step 2, not 1: start from "
                          "step = 0"), msg


def test_a_checkpoint_collective_on_rank_0_only_is_named(mutants):
    report = mutants["dcp.save on rank 0 only"]
    assert not report.ran and report.score == 0
    assert "dcp.save ran on rank 0 (at step 3) but not on rank 1: it is a collective" in report.feedback
    # What the job did comes after the cause, and it is a race: rank 1 fails at once when rank 0 has not
    # yet made the staging folder (a rank raised), else both wait in mismatched collectives until the hang
    # detector ends the job (each rank's line is named). Either way the evidence follows the cause.
    assert re.search(r"\(rank \d raised \w+|\(the job hung: no rank advanced .* rank \d waits in \w+ at "
                     r"ex05_checkpoint\.py:\d+", report.feedback), report.feedback


@pytest.mark.parametrize("raised, name", [
    ("RuntimeError: Parent directory /tmp/x/A/.tmp-step_00000003 does not exist.",
     "a checkpoint written on some ranks only"),
    ("CheckpointException: ... RuntimeError: Missing key in checkpoint state_dict: rng.",
     "dcp.load of a key the checkpoint lacks"),
])
def test_errors_of_known_mistakes_are_translated(raised, name):
    assert translate(raised, ex05_checkpoint.KNOWN_ERRORS).startswith(name)


@pytest.mark.parametrize("imported", ["before the spies", "under the spies"])
def test_the_checkpoint_spies_see_every_import_style(tmp_path, imported):
    """No launch (one gloo rank in this process): DCP's save by attribute, through an alias of its module
    and by name from ``state_dict_saver``, and get_state_dict by name, are each logged."""
    import io
    import json

    import torch
    import torch.distributed as dist

    from autograder.checks.ex05_checkpoint import probes
    from autograder.rank import watched
    from distlab.runtime.importing import import_path

    (tmp_path / "styles.py").write_text(
        "import torch.distributed.checkpoint\nimport torch.distributed.checkpoint as DCP\n"
        "from torch.distributed.checkpoint.state_dict import get_state_dict\n"
        "from torch.distributed.checkpoint.state_dict_saver import save\n\n\n"
        "def every_style(model, optimizer, root):\n    model_sd, _ = get_state_dict(model, optimizer)\n"
        "    torch.distributed.checkpoint.save(model_sd, checkpoint_id=root / 'a')\n"
        "    DCP.save(model_sd, checkpoint_id=root / 'b')\n    save(model_sd, checkpoint_id=root / 'c')\n")
    load = lambda: watched(import_path(tmp_path / "styles.py", name=f"learner_dcp_{imported[0]}"))  # noqa: E731
    model = torch.nn.Linear(3, 2)
    log = io.StringIO()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        learner = load() if imported == "before the spies" else None
        with probes._collective_spies():
            learner = learner or load()
            probes._now.update(log=log, tag="styles", step=0)
            learner.every_style(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path)
    finally:
        probes._now["log"] = None
        dist.destroy_process_group()
    assert [json.loads(ln)["call"] for ln in log.getvalue().splitlines()] == ["get_state_dict"] + ["dcp.save"] * 3
