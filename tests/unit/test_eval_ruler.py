"""`lenext eval ruler`'s refusals and guards (lenext_dist/eval/ruler_tasks.py, ruler.py) on lm-eval's
real RULER generators and the sample tokenizer, without a model: a download-needing task is refused
by name in one line; vt and cwe lengths their generators cannot fill are refused (vt's sample loop
would never end, cwe's answers would be empty); samples without answers are refused; the tokenizer
lm-eval sizes prompts with encodes as SentencePiece. The run itself: tests/e2e/test_ruler_cli.py."""
import random

import pytest

pytest.importorskip("wonderwords", reason="lm_eval[ruler] extras (make setup installs them)")

from lenext_dist.cli import main  # noqa: E402
from lenext_dist.eval.jobs import EvalError, RulerJob  # noqa: E402
from lenext_dist.eval.ruler_tasks import OFFLINE, RULER, check_samples, quiet_import, too_short  # noqa: E402
from tiny_models import SAMPLE_TOKENIZER  # noqa: E402


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    from lenext_dist.eval.ruler import hf_tokenizer

    return get_tokenizer(hf_tokenizer(SAMPLE_TOKENIZER, str(tmp_path_factory.mktemp("tok"))))


def test_a_download_needing_task_is_refused_by_name_in_one_line(capsys):
    with pytest.raises(EvalError) as e:
        RulerJob(model="m", lengths=[1024], tasks="niah_single_1,niah_single_2")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("lenext eval ruler: argument --tasks: niah_single_2 needs a "
                                              "download (the essay haystack downloads Paul Graham's essays")
    assert msg.endswith("offline RULER tasks: " + ", ".join(OFFLINE))
    with pytest.raises(SystemExit) as e:
        main(["eval", "ruler", "--model", "m", "--lengths", "1024", "--tasks", "ruler_qa_squad"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == ("lenext eval ruler: error: argument --tasks: qa_squad needs a "
                                         "download (it downloads SQuAD v2 (rajpurkar.github.io)); offline "
                                         "RULER tasks: " + ", ".join(OFFLINE) +
                                         " (see lenext eval ruler --help)\n")


def test_task_names_default_aliases_and_sample_bound():
    assert RulerJob(model="m", lengths=[1024]).tasks == list(OFFLINE)
    assert set(OFFLINE) == {"niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"}
    job = RulerJob(model="m", lengths="1024,2048", tasks="ruler_vt,niah_single_1,vt", samples=3)
    assert job.tasks == ["vt", "niah_single_1"] and job.lengths == [1024, 2048]
    assert job.result_path.name == "ruler.json"
    assert RulerJob(model="m", lengths=[1024], scale_c=1.5).result_path.name == "ruler_c1.5.json"
    with pytest.raises(EvalError, match="expected RULER tasks from niah_single_1.*got 'passkey'"):
        RulerJob(model="m", lengths=[1024], tasks="passkey")
    with pytest.raises(EvalError, match=r"--samples: lm-eval makes 500 per \(task, length\), got 501"):
        RulerJob(model="m", lengths=[1024], samples=501)
    with pytest.raises(EvalError, match="required: --lengths"):
        RulerJob(model="m")


def test_the_tokenizer_handed_to_lm_eval_encodes_as_sentencepiece(hf_tok):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=SAMPLE_TOKENIZER)
    assert len(hf_tok) == sp.get_piece_size()  # not the 3 pieces of a LlamaTokenizer folder
    with quiet_import():
        from lm_eval.tasks.ruler import vt_utils
    text, _ = vt_utils.generate_input_output(10, 1, 4)
    assert hf_tok(text).input_ids == sp.encode(text)


def test_lengths_a_generator_cannot_fill_are_refused(hf_tok):
    random.seed(0)
    state = random.getstate()
    with quiet_import():
        short = too_short(hf_tok, ["vt", "cwe", "niah_single_1", "fwe"], [512, 1024, 2048])
    assert random.getstate() == state  # measuring leaves lm-eval's seeded draws as they were
    names = [s.split(" (")[0] for s in short]
    # a 4K-piece tokenizer: vt's 500-token in-context example + 10 noise sentences pass 512;
    # cwe's example + 10 words x 6 + 120 answer tokens pass 1024
    assert names == ["vt at 512", "cwe at 512", "cwe at 1024"]
    need = int(short[0].split(">= ")[1].split()[0])
    assert 512 < need <= 1024


def test_empty_answer_sets_are_refused(hf_tok):
    """lm-eval's own cwe generator at a length it cannot fill: answers come out empty (its size
    search ends at 0 words; unseeded, in some calls only: its random words vary in length),
    which check_samples refuses instead of a division by zero."""
    random.seed(0)
    with quiet_import():
        from lm_eval.tasks.ruler import cwe_utils
    docs = cwe_utils.sys_word_pair_random(num_samples=2, max_seq_length=1024, tokenizer=hf_tok)
    assert all(d["outputs"] == [] for d in docs)
    with pytest.raises(ValueError, match=r"^cwe at 1024: lm-eval made 2 samples without answers and 0 "):
        check_samples("cwe", 1024, docs)
    ok = {"input": "the key is 1234567.", "outputs": ["1234567"]}
    check_samples("niah_single_1", 1024, [ok])
    with pytest.raises(ValueError, match="0 samples without answers and 1 whose answers are not in"):
        check_samples("niah_single_1", 1024, [ok, {**ok, "outputs": ["7654321"]}])


def test_a_cell_has_the_same_samples_whatever_the_lists_around_it(tmp_path):
    """Each (task, length) is made alone, seeded by the cell: niah_single_1 at 1024 holds the same
    samples with or without fwe before it (one seeded stream across the lists gave it others),
    cwe at 2048 with or without 1536 before it, and another --seed gives other samples."""
    from lenext_dist.eval.ruler import hf_tokenizer, load_tasks

    tok = hf_tokenizer(SAMPLE_TOKENIZER, str(tmp_path))

    def inputs(names, lengths=(1024,), seed=0, task="niah_single_1"):
        tasks = load_tasks(names, list(lengths), tok, seed, progress=False)
        return [d["input"] for d in list(tasks[task, lengths[-1]].test_docs())[:3]]

    alone = inputs(["niah_single_1"])
    assert inputs(["fwe", "niah_single_1"]) == alone
    assert inputs(["niah_single_1"], seed=1) != alone
    # cwe shuffles with its module's own RNG (the module lm-eval executes for the YAML, not the
    # imported one): the same at 2048 with or without 1536 before it
    assert inputs(["cwe"], (1536, 2048), task="cwe") == inputs(["cwe"], (2048,), task="cwe")


def test_every_task_has_an_lm_eval_config():
    from lm_eval.tasks import TaskManager

    known = set(TaskManager().all_tasks)
    assert {t.lm_eval_name for t in RULER.values()} <= known


def test_answers_are_the_same_batched_or_one_by_one():
    """--batch-size batches prompts of equal length (no padding): each row's greedy answer is the
    one it gets alone, cut at EOS."""
    import numpy as np

    from lenext_dist.eval.ruler import generate
    from tiny_models import one_thread, tiny_lenext

    model = tiny_lenext(train_length=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 4096, n).tolist() for n in (40, 40, 40, 33)]
    with one_thread():
        alone = [generate(model, [p], 6)[0] for p in prompts]
        batched = generate(model, prompts, 6, batch_size=2)
        assert batched == alone and all(len(a) == 6 for a in alone)
        eos = alone[0][2]
        cut = generate(model, prompts[:1], 6, eos=eos)[0]
        assert cut == alone[0][:alone[0].index(eos)]
