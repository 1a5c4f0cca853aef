"""The typed rank -> grader contract (autograder.rank.observation): a record survives the trip a rank's result
takes (torch.save, then torch.load(weights_only=True)) as the same typed object, and a record that does not
match its class is refused by name."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import pytest
import torch

from autograder.rank.observation import Observation, ObservationError


@dataclass
class Call(Observation):
    op: str
    numel: int
    line: int | None = None


@dataclass
class Rank(Observation):
    rank: int
    grad: torch.Tensor | None = None
    calls: list[Call] = field(default_factory=list)
    by_stage: dict[str, Call] = field(default_factory=dict)
    first: Call | None = None
    pair: tuple[Call, int] | None = None
    errors: dict[str, str] = field(default_factory=dict)


def _over_the_wire(wire: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(wire, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_record_crosses_weights_only_loading_and_comes_back_typed():
    sent = Rank(rank=1, grad=torch.arange(3.0), calls=[Call("all_reduce", 8, 42), Call("broadcast", 2)],
                by_stage={"dispatch": Call("all_to_all", 4)}, first=Call("barrier", 0), pair=(Call("send", 1), 3),
                errors={"combine": "ValueError: x"})
    got = Rank.from_wire(_over_the_wire(sent.to_wire()))
    assert isinstance(got.calls[0], Call) and isinstance(got.by_stage["dispatch"], Call)
    assert isinstance(got.first, Call) and isinstance(got.pair[0], Call) and got.pair[1] == 3
    assert torch.equal(got.grad, sent.grad) and got.calls == sent.calls and got.errors == sent.errors
    assert Rank.from_wire(_over_the_wire(Rank(rank=0).to_wire())) == Rank(rank=0)  # defaults and None


def test_a_key_the_class_does_not_declare_or_lacks_is_refused_by_name():
    with pytest.raises(ObservationError, match=r"Rank: the rank's record has \['rnak'\] .* lacks \['rank'\]"):
        Rank.from_wire({"rnak": 0})
    with pytest.raises(ObservationError, match=r"Call: .* lacks \['numel'\]"):
        Rank.from_wire({"rank": 0, "calls": [{"op": "send"}]})  # inside a list too
    with pytest.raises(ObservationError, match="a rank sent list, not a record"):
        Rank.from_wire([])
