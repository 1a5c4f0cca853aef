"""The parity helper every check uses: verdict, size and place of the largest difference."""
import torch

from autograder.grader.parity import parity


def test_identical_dicts_pass_with_zero_difference():
    a = {"w": torch.ones(3), "b": torch.zeros(2)}
    p = parity(a, {k: v.clone() for k, v in a.items()}, rtol=0, atol=0)
    assert p.ok and p.max_abs_diff == 0.0


def test_the_worst_key_and_its_difference_are_named():
    p = parity({"w": torch.tensor([1.0, 2.5]), "b": torch.tensor([0.0])},
               {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.1])}, rtol=1e-4, atol=1e-5)
    assert not p.ok and p.worst == "w" and abs(p.max_abs_diff - 0.5) < 1e-12


def test_mismatched_keys_and_shapes_fail_with_a_reason():
    assert parity({"a": torch.ones(1)}, {"b": torch.ones(1)}).worst == "keys differ (e.g. 'b')"
    p = parity(torch.ones(2), torch.ones(3))
    assert not p and p.worst == "'tensor' has shape (2,), expected (3,)"


def test_within_tolerance_passes_but_reports_the_difference():
    p = parity(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7]))
    assert p.ok and 0 < p.max_abs_diff < 1e-6
