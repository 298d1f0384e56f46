"""The key-blind copy's diagnosis (experiments/kv_regime/features.py) on a random lenext export:
every probe reads its token at the right place (the control finds the value itself in the
embeddings; the key two back is not in them), and a bad folder is one error line."""
import pytest

from experiments.kv_regime import data, features, grids


def test_the_probes_read_their_tokens_where_they_are(tmp_path):
    from tiny_models import save_tiny_lenext

    model = save_tiny_lenext(str(tmp_path / "m"), tokenizer=str(data.kv_data() / "tokenizer.model"),
                             position="nope", vocab_size=128, train_length=grids.L)
    r = features.run(model, docs=120, seed=3)
    assert set(r["probes"]) == set(features.PROBES) and not r["bos"]
    p = r["probes"]
    assert all(len(v["by_layer"]) == 3 for v in p.values())  # embeddings + 2 layers
    assert p["key@v1"]["n"] == p["key@is"]["n"] == p["tok@v1"]["n"] >= 2 * 120  # 1-3 distractors
    assert p["key@is first"]["n"] == 120  # one first needle a document, the rest later
    assert p["key@is first"]["n"] + p["key@is later"]["n"] == p["key@is"]["n"]
    assert p["v1@v2 first"]["n"] + p["v1@v2 later"]["n"] == p["v1@v2"]["n"]
    # the value itself is its embedding; the key two back is nowhere in it
    assert p["tok@v1"]["by_layer"][0] >= 0.9
    assert p["key@v1"]["by_layer"][0] <= p["key@v1"]["chance"] + 0.1
    assert 0.0 <= r["first_answer_token"] <= 1.0


def test_a_folder_without_a_model_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --model .*: no config.json"):
        features.main(["--model", str(tmp_path)])


def test_carries_key_needs_the_key_at_the_first_value_after_a_layer():
    def rec(v1, at_is=(0.03, 0.9, 0.9)):
        return {"probes": {"key@v1": {"by_layer": list(v1)}, "key@is": {"by_layer": list(at_is)}}}
    assert not features.carries_key(rec([0.03, 0.04, 0.49]))  # key@is alone is not the match's input
    assert features.carries_key(rec([0.03, 0.04, 0.5]))
    assert features.carries_key(rec([0.03, 0.7, 0.2]))  # any layer
    assert not features.carries_key(rec([0.9, 0.04, 0.04]))  # the embeddings do not count
    assert features.CARRIED == 0.5
