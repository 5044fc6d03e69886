import pytest
import torch

from aiayn.nn.masks import causal_mask, key_mask, padding_mask


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert padding_mask(ids, pad_id=0).tolist() == [[True, True, False], [True, False, False]]
    assert key_mask(padding_mask(ids, 0)).shape == (2, 1, 1, 3)


def test_causal_mask_is_lower_triangular_when_square():
    assert torch.equal(causal_mask(4, 4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_aligns_to_the_end_after_a_cache():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(1, 3).tolist() == [[True, True, True]]


def test_causal_mask_refuses_more_queries_than_keys():
    with pytest.raises(ValueError, match="q_len"):
        causal_mask(3, 2)
