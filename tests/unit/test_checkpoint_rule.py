"""The pre-registered checkpoint rule: the first checkpoint over the gate, in training order (not
the best, not the last, not in name order), and no choice when none reaches it."""
from lenext_dist.checkpoint.layout import COMPLETE
from lenext_dist.eval.checkpoint_rule import checkpoint_tags, first_over_gate


def test_the_first_checkpoint_over_the_gate_is_chosen():
    scores = {"step_250": 0.2, "step_500": 0.91, "step_750": 0.99, "step_1000": 0.95}
    asked = []

    def score(tag):
        asked.append(tag)
        return scores[tag]

    tag, seen = first_over_gate(list(scores), score, 0.9)
    assert tag == "step_500" and asked == ["step_250", "step_500"]  # not the best (750)
    assert seen == [{"tag": "step_250", "score": 0.2}, {"tag": "step_500", "score": 0.91}]
    assert first_over_gate(list(scores), scores.get, 0.995) == (None, [
        {"tag": t, "score": s} for t, s in scores.items()])
    assert first_over_gate(["a"], lambda t: 0.9, 0.9)[0] == "a"  # the gate is inclusive


def _save(folder, n: int, complete: bool = True):
    (folder / f"step_{n:07d}").mkdir()
    if complete:
        (folder / f"step_{n:07d}" / COMPLETE).write_text(f"{n}\n")


def test_tags_are_in_training_order(tmp_path):
    for n in (1000, 250, 500, 2750):
        _save(tmp_path, n)
    (tmp_path / "latest").write_text("step_0002750")
    (tmp_path / "step_0000100.tmp").mkdir()  # an unfinished save is not a checkpoint
    assert checkpoint_tags(tmp_path) == ["step_0000250", "step_0000500", "step_0001000",
                                         "step_0002750"]
    _save(tmp_path, 1715)  # saved on a stop signal, off the interval
    assert "step_0001715" in checkpoint_tags(tmp_path)  # without an interval: every checkpoint
    assert checkpoint_tags(tmp_path, every=250) == ["step_0000250", "step_0000500", "step_0001000",
                                                    "step_0002750"]
    assert checkpoint_tags(tmp_path, every=250, upto=1000) == ["step_0000250", "step_0000500",
                                                               "step_0001000"]


def test_a_partial_save_is_not_a_checkpoint(tmp_path):
    """A run killed mid-save leaves a step folder without its COMPLETE marker: not scored, not
    exported."""
    _save(tmp_path, 250)
    _save(tmp_path, 500, complete=False)
    (tmp_path / "step_0000750").write_text("")  # a file, not a folder
    assert checkpoint_tags(tmp_path) == ["step_0000250"]
