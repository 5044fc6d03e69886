import math

import pytest
import torch

from aiayn.positional import LearnedPositions, SinusoidalPositions, sinusoidal_table


def test_sinusoids_at_hand_checked_positions():
    table = sinusoidal_table(n_positions=3, d_model=4)
    # pos 0: sin 0 = 0 on even dims, cos 0 = 1 on odd dims
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # pos 1: angles 1 / 10000^(0/4) = 1 and 1 / 10000^(2/4) = 0.01
    expected_1 = [0.8414709848, 0.5403023059, 0.0099998333, 0.9999500004]
    assert table[1].tolist() == pytest.approx(expected_1, abs=1e-7)
    # pos 2: angles 2 and 0.02
    expected_2 = [0.9092974268, -0.4161468365, 0.0199986667, 0.9998000067]
    assert table[2].tolist() == pytest.approx(expected_2, abs=1e-7)


def test_sinusoids_follow_the_formula_for_the_base_width():
    d_model = 512
    table = sinusoidal_table(n_positions=100, d_model=d_model)
    for pos, i in [(7, 0), (13, 5), (99, 100), (50, 255)]:
        angle = pos / 10000 ** (2 * i / d_model)
        assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_odd_width_keeps_the_last_sine():
    table = sinusoidal_table(n_positions=5, d_model=5)
    assert table.shape == (5, 5)
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-6)


def test_offset_continues_the_sequence():
    positions = SinusoidalPositions(max_len=20, d_model=8)
    torch.testing.assert_close(positions(3, offset=5), sinusoidal_table(20, 8)[5:8])
    assert "table" not in positions.state_dict()  # a buffer derived from the formula


def test_learned_positions_are_parameters():
    positions = LearnedPositions(max_len=10, d_model=4)
    assert positions(2, offset=3).shape == (2, 4)
    assert [n for n, _ in positions.named_parameters()] == ["weight"]


def test_halves_layout_puts_all_sines_first():
    interleaved = sinusoidal_table(n_positions=6, d_model=6)
    halves = sinusoidal_table(n_positions=6, d_model=6, halves=True)
    torch.testing.assert_close(halves[:, :3], interleaved[:, 0::2])
    torch.testing.assert_close(halves[:, 3:], interleaved[:, 1::2])
    assert halves[2, 1].item() == pytest.approx(math.sin(2 / 10000 ** (2 / 6)), abs=1e-6)
    assert halves[2, 4].item() == pytest.approx(math.cos(2 / 10000 ** (2 / 6)), abs=1e-6)
