"""Head pruning: a pruned model computes what the model with those heads masked computes."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig, Transformer
from aiayn.analysis.pruning import (
    heads_by_fraction,
    kv_heads_read,
    prune_heads,
    random_heads,
    read_head_scores,
)
from aiayn.cli import app
from aiayn.inference.frozen import freeze
from aiayn.inference.search import beam_search, greedy_search
from aiayn.io.checkpoint import load_model, read_config, save_model
from aiayn.models.encoder_decoder import attention_sublayers
from infer_helpers import make_run

D_MODEL, HEAD_SIZE, VOCAB = 32, 8, 40  # 4 heads of 8


def tiny(n_kv_heads: int | None = None, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.tiny(VOCAB, d_model=D_MODEL, d_ff=64, dropout=0.0, n_kv_heads=n_kv_heads)
    return Transformer(cfg).eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (3, 9), generator=generator)
    src[0, 6:] = 0  # some padding
    tgt_in = torch.randint(3, VOCAB, (3, 7), generator=generator)
    return src, tgt_in


def masked_logits(model: Transformer, heads: Mapping[str, Sequence[int]]) -> torch.Tensor:
    """The reference: the unpruned model with `heads` silenced by head masks."""
    model = copy.deepcopy(model)
    sublayers = attention_sublayers(model)
    for name, indices in heads.items():
        mask = torch.ones(sublayers[name].n_heads)
        mask[list(indices)] = 0.0
        sublayers[name].head_mask = mask
    with torch.no_grad():
        return model(*batch())


def logits(model: Transformer) -> torch.Tensor:
    with torch.no_grad():
        return model(*batch())


@pytest.mark.parametrize(
    "heads",
    [
        {"encoder.1.self": [0, 2]},
        {"decoder.0.self": [3]},
        {"decoder.1.cross": [1, 2]},
        {"encoder.0.self": [1], "decoder.1.self": [0, 3], "decoder.0.cross": [2]},
    ],
)
def test_pruning_heads_computes_what_masking_them_does(heads: dict[str, list[int]]) -> None:
    model = tiny()
    pruned = prune_heads(model, heads)
    torch.testing.assert_close(logits(pruned), masked_logits(model, heads), atol=1e-5, rtol=0)
    for name, module in attention_sublayers(pruned).items():
        assert module.n_heads == 4 - len(heads.get(name, []))
        assert module.q_proj.weight.shape == (module.n_heads * HEAD_SIZE, D_MODEL)
        assert module.out_proj.weight.shape == (D_MODEL, module.n_heads * HEAD_SIZE)


def test_the_model_pruned_is_left_as_it_was() -> None:
    model = tiny()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = model.cfg
    prune_heads(model, {"encoder.0.self": [1], "decoder.0.cross": [0, 1]})
    assert model.cfg == cfg
    after = model.state_dict()
    assert state.keys() == after.keys()
    assert all(torch.equal(state[k], after[k]) for k in state)


def test_grouped_query_attention_keeps_a_kv_head_until_its_whole_group_goes() -> None:
    model = tiny(n_kv_heads=2)  # query heads 0, 1 read kv head 0; 2, 3 read kv head 1
    one = prune_heads(model, {"encoder.0.self": [1]})
    module = attention_sublayers(one)["encoder.0.self"]
    assert (module.n_heads, module.n_kv_heads) == (3, 2)
    assert module.k_proj.weight.shape == (2 * HEAD_SIZE, D_MODEL)
    assert kv_heads_read(module) == (0, 1, 1)
    assert one.cfg.heads_of("encoder.0.self") == (0, 1, 1)
    expected = masked_logits(model, {"encoder.0.self": [1]})
    torch.testing.assert_close(logits(one), expected, atol=1e-5, rtol=0)

    both = {"encoder.0.self": [0, 1], "decoder.1.cross": [2, 3], "decoder.0.self": [1, 2]}
    pruned = prune_heads(model, both)
    sublayers = attention_sublayers(pruned)
    for name, kv_heads in (("encoder.0.self", 1), ("decoder.1.cross", 1), ("decoder.0.self", 2)):
        assert (sublayers[name].n_heads, sublayers[name].n_kv_heads) == (2, kv_heads)
        assert sublayers[name].k_proj.weight.shape == (kv_heads * HEAD_SIZE, D_MODEL)
        assert sublayers[name].v_proj.bias.shape == (kv_heads * HEAD_SIZE,)
    torch.testing.assert_close(logits(pruned), masked_logits(model, both), atol=1e-5, rtol=0)


def test_every_head_but_one_may_go_but_not_all() -> None:
    model = tiny()
    heads = {"encoder.0.self": [0, 1, 3], "decoder.1.cross": [1, 2, 3]}
    pruned = prune_heads(model, heads)
    assert attention_sublayers(pruned)["encoder.0.self"].n_heads == 1
    torch.testing.assert_close(logits(pruned), masked_logits(model, heads), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"all 4 heads of decoder\.0\.self: at least one"):
        prune_heads(model, {"decoder.0.self": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match=r"all 1 heads of encoder\.0\.self"):
        prune_heads(pruned, {"encoder.0.self": [0]})


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ({"encoder.7.self": [0]}, r"'encoder\.7\.self'.*no such attention sub-layer"),
        ({"encoder.0.cross": [0]}, r"'encoder\.0\.cross'"),
        ({"decoder.0.self": [4]}, r"decoder\.0\.self has 4 heads.*no head 4"),
        ({"decoder.0.self": [-1]}, r"no head -1"),
        ({"decoder.0.cross": [1, 1]}, r"head 1 of decoder\.0\.cross is named twice"),
        ({"decoder.0.cross": ["1"]}, r"'1' of decoder\.0\.cross is not an integer"),
    ],
)
def test_bad_heads_are_refused_by_name(heads: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prune_heads(tiny(), heads)


def test_a_frozen_model_is_refused() -> None:
    with pytest.raises(ValueError, match="prune the literal model, then freeze it"):
        prune_heads(freeze(tiny()), {})


def test_the_parameter_count_drops_by_the_rows_and_columns_removed() -> None:
    d, dk = D_MODEL, HEAD_SIZE
    query_head = (d * dk + dk) + d * dk  # its rows of W^Q (with bias), its columns of W^O
    kv_head = 2 * (d * dk + dk)  # its rows of W^K and W^V, with biases

    model = tiny()  # plain MHA: every query head has a key/value head of its own
    pruned = prune_heads(model, {"encoder.0.self": [0, 1], "decoder.1.cross": [3]})
    assert model.num_parameters() - pruned.num_parameters() == 3 * (query_head + kv_head)

    model = tiny(n_kv_heads=2)
    pruned = prune_heads(model, {"encoder.0.self": [0, 1], "decoder.1.self": [0, 2, 3]})
    removed = 5 * query_head + 2 * kv_head  # kv heads: encoder.0's first, decoder.1's second
    assert model.num_parameters() - pruned.num_parameters() == removed


def test_a_pruned_model_saves_reloads_and_freezes(tmp_path: Path) -> None:
    model = tiny(n_kv_heads=2)
    pruned = prune_heads(
        model, {"encoder.1.self": [2], "decoder.0.self": [0, 1], "decoder.1.cross": [3]}
    )
    path = save_model(pruned, tmp_path / "model.safetensors")
    reloaded = load_model(path).eval()
    assert reloaded.cfg == pruned.cfg
    torch.testing.assert_close(logits(reloaded), logits(pruned), atol=0, rtol=0)

    src, _ = batch()
    frozen = freeze(pruned)
    with torch.no_grad():
        for search in (
            lambda m: greedy_search(m, src, extra_len=6),
            lambda m: beam_search(m, src, beam=3, extra_len=6),
        ):
            literal, fast = search(pruned), search(frozen)
            assert [h[0].tokens for h in fast] == [h[0].tokens for h in literal]


def test_pruning_twice_is_pruning_the_union_once() -> None:
    for n_kv_heads in (None, 2):
        model = tiny(n_kv_heads=n_kv_heads)
        first = prune_heads(model, {"encoder.0.self": [0], "decoder.1.cross": [1]})
        # numbered as `first` numbers them: encoder.0.self's head 0 is the original head 1
        twice = prune_heads(first, {"encoder.0.self": [0], "decoder.0.self": [3]})
        once = prune_heads(
            model, {"encoder.0.self": [0, 1], "decoder.1.cross": [1], "decoder.0.self": [3]}
        )
        assert twice.cfg == once.cfg
        assert twice.state_dict().keys() == once.state_dict().keys()
        for key, tensor in once.state_dict().items():
            assert torch.equal(twice.state_dict()[key], tensor), key


# ----- choosing heads ----------------------------------------------------------------


SCORES = {
    "encoder.0.self": [0.5, 0.1, 0.9, 0.3],
    "decoder.0.self": [0.01, 0.02, 0.03, 0.04],  # the four lowest: one must stay
    "decoder.0.cross": [0.2, 0.8, 0.7, 0.6],
}


def test_the_lowest_scores_go_first_but_never_a_sub_layers_last_head() -> None:
    assert heads_by_fraction(SCORES, 0.25) == {"decoder.0.self": [0, 1, 2]}  # 3 of 12
    assert heads_by_fraction(SCORES, 0.5) == {  # 6: decoder.0.self's head 3 stays
        "encoder.0.self": [1, 3],
        "decoder.0.self": [0, 1, 2],
        "decoder.0.cross": [0],
    }
    assert heads_by_fraction(SCORES, 0.0) == {}
    chosen = heads_by_fraction(SCORES, 0.99)  # 11 of 12, but 3 must stay
    assert {name: len(heads) for name, heads in chosen.items()} == dict.fromkeys(SCORES, 3)
    assert heads_by_fraction(SCORES, 0.5, kinds=["encoder.self", "decoder.cross"]) == {
        "encoder.0.self": [0, 1, 3],  # 0.1, 0.3, 0.5
        "decoder.0.cross": [0],  # 0.2
    }


def test_ties_go_to_the_earlier_sub_layer_then_the_lower_head() -> None:
    scores = {"decoder.1.cross": [1.0, 1.0], "encoder.1.self": [1.0, 1.0, 1.0]}
    assert heads_by_fraction(scores, 0.4) == {"encoder.1.self": [0, 1]}
    assert heads_by_fraction(dict(reversed(scores.items())), 0.4) == {"encoder.1.self": [0, 1]}


@pytest.mark.parametrize("fraction", [1.0, -0.1, 1.5])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match=rf"\[0, 1\).*got {fraction}"):
        heads_by_fraction(SCORES, fraction)
    with pytest.raises(ValueError, match=rf"got {fraction}"):
        random_heads(tiny(), fraction, seed=0)


def test_bad_kinds_and_scores_are_refused() -> None:
    with pytest.raises(ValueError, match=r"encoder\.cross"):
        heads_by_fraction(SCORES, 0.5, kinds=["encoder.cross"])
    with pytest.raises(ValueError, match=r"head 1 of encoder\.0\.self has a score of nan"):
        heads_by_fraction({"encoder.0.self": [0.0, float("nan")]}, 0.5)


def test_random_heads_follow_the_seed_and_the_same_rules() -> None:
    model = tiny()  # 6 sub-layers of 4 heads
    chosen = random_heads(model, 0.5, seed=3)
    assert chosen == random_heads(model, 0.5, seed=3)
    assert chosen != random_heads(model, 0.5, seed=4)
    assert sum(map(len, chosen.values())) == 12
    assert all(len(heads) < 4 for heads in random_heads(model, 0.9, seed=0).values())
    only = random_heads(model, 0.5, seed=0, kinds=["decoder.cross"])
    assert set(only) <= {"decoder.0.cross", "decoder.1.cross"} and sum(map(len, only.values())) == 4
    prune_heads(model, random_heads(model, 0.9, seed=5))  # always prunable


def write_heads_json(
    path: Path, scores: Mapping[str, Sequence[float]], full_kinds: bool = False
) -> Path:
    """heads.json as `aiayn heads` writes it: one record per head, its kind "encoder",
    "decoder" or "cross" (or, with `full_kinds`, "encoder.self" and so on)."""
    kinds = {"encoder.self": "encoder", "decoder.self": "decoder", "decoder.cross": "cross"}
    records = []
    for name, values in scores.items():
        stack, layer, kind = name.split(".")
        for head, value in enumerate(values):
            records.append(
                {
                    "kind": f"{stack}.{kind}" if full_kinds else kinds[f"{stack}.{kind}"],
                    "layer": int(layer),
                    "head": head,
                    "ablation": value,
                    "gradient": -value,
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sentences": 1, "heads": records}), encoding="utf-8")
    return path


def test_heads_json_is_read_back_per_sub_layer(tmp_path: Path) -> None:
    path = write_heads_json(tmp_path / "heads.json", SCORES)
    assert read_head_scores(path) == SCORES
    assert read_head_scores(write_heads_json(path, SCORES, full_kinds=True)) == SCORES
    assert read_head_scores(path, "gradient")["encoder.0.self"] == [-0.5, -0.1, -0.9, -0.3]
    path.write_text(json.dumps([{"kind": "encoder.self", "layer": 0, "head": 0}]))
    with pytest.raises(ValueError, match="no 'ablation' number"):
        read_head_scores(path)
    with pytest.raises(FileNotFoundError, match="aiayn heads RUN"):
        read_head_scores(tmp_path / "missing.json")


# ----- the command ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = make_run(tmp_path_factory.mktemp("prune"))
    (run / "config.yaml").write_text("data: {corpus: /nowhere}\n")  # copied, not read
    return run


def test_aiayn_prune_writes_a_run_that_translates(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "pruned"
    result = CliRunner().invoke(
        app, ["prune", str(run), "--out", str(out), "--heads", "encoder.0.self:1"]
    )
    assert result.exit_code == 0, result.output
    assert "pruned 1 of 24 heads (encoder.self 1, decoder.self 0, decoder.cross 0)" in result.stdout
    assert read_config(out / "model.safetensors").heads_of("encoder.0.self") == (0, 1, 2)
    assert json.loads((out / "pruning.json").read_text())["removed"] == {"encoder.0.self": [1]}
    for name in ("spm.model", "config.yaml"):
        assert (out / name).read_bytes() == (run / name).read_bytes()

    translated = CliRunner().invoke(app, ["translate", str(out), "--beam", "2"], input="house.\n")
    assert translated.exit_code == 0, translated.output
    assert len(translated.stdout.splitlines()) == 1


def test_aiayn_prune_by_importance_and_at_random(run: Path, tmp_path: Path) -> None:
    model = load_model(run / "checkpoints" / "step-00000001" / "model.safetensors")
    scores = {name: [0.5, 0.4, 0.3, 0.2] for name in attention_sublayers(model)}
    scores["decoder.1.cross"] = [0.0, 0.1, 0.9, 0.9]
    heads_json = write_heads_json(tmp_path / "heads.json", scores)
    out = tmp_path / "by-importance"
    args = ["prune", str(run), "--out", str(out), "--fraction", "0.1", "--scores", str(heads_json)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "pruning.json").read_text())["removed"] == {"decoder.1.cross": [0, 1]}

    out = tmp_path / "random"
    weights = run / "checkpoints" / "step-00000001" / "model.safetensors"  # a file will do
    args = ["prune", str(weights), "--out", str(out), "--fraction", "0.25", "--by", "random"]
    result = CliRunner().invoke(app, [*args, "--kinds", "decoder.self"])
    assert result.exit_code == 0, result.output
    assert "pruned 2 of 24 heads (encoder.self 0, decoder.self 2, decoder.cross 0)" in result.stdout
    assert (out / "spm.model").read_bytes() == (run / "spm.model").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "encoder.0.self:9"], "encoder.0.self has 4 heads"),
        (["--heads", "encoder.0.self"], "expected SUBLAYER:HEAD"),
        (["--heads", "encoder.0.self:0,1,2,3"], "at least one must remain"),
        (["--fraction", "1.5"], "got 1.5"),
        (["--fraction", "0.5", "--by", "importance"], "run `aiayn heads RUN` first"),
        (["--fraction", "0.5", "--by", "size"], "--by must be one of importance, random"),
        (["--heads", "encoder.0.self:1", "--fraction", "0.5"], "either --heads"),
    ],
)
def test_aiayn_prune_fails_in_one_line_and_writes_nothing(
    run: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "pruned"
    result = CliRunner().invoke(app, ["prune", str(run), "--out", str(out), *args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary directory left either
