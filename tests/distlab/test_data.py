"""The course's data: the digits sklearn ships, read without importing sklearn in every rank."""
import torch

from distlab.data import DIGITS_SIZE, RecordingDataset, digits


def test_digits_are_exactly_what_sklearn_load_digits_gives():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x, y = digits(len(bunch.target)).tensors
    torch.testing.assert_close(x, torch.tensor(bunch.data, dtype=torch.float32) / 16.0, rtol=0, atol=0)
    assert torch.equal(y, torch.tensor(bunch.target))


def test_default_size_divides_by_every_world_size_the_course_uses():
    assert len(digits()) == DIGITS_SIZE and all(DIGITS_SIZE % w == 0 for w in (1, 2, 4, 8))
    assert [w for w in range(1, 9) if DIGITS_SIZE % w] == [3, 5, 6]  # 1792 = 2^8 * 7, as distlab.data says


def test_recording_dataset_logs_reads_in_order():
    data = RecordingDataset(digits(16))
    _ = data[3], data[0], data[3]
    assert data.accessed == [3, 0, 3] and len(data) == 16
