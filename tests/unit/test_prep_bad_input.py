"""Every bad-input case through the whole shard step: a clear error by default, and
skipped-and-counted (never silently dropped) under --skip-bad."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_helpers import load_docs, shard, write_zst
from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.manifest import parts_dir

GOOD = [json.dumps({"text": f"Good document {i}.", "meta": {"redpajama_set_name": "RedPajamaBook"}}
                   ).encode() for i in range(3)]


def _jsonl_case(bad_line):
    def make(d):
        return "slimpajama", write_zst(os.path.join(d, "c", "a.jsonl.zst"), [GOOD[0], bad_line, *GOOD[1:]])
    return make


def _truncated(d):
    lines = [json.dumps({"text": f"doc {i} " + "word " * 50}).encode() for i in range(2000)]
    p = write_zst(os.path.join(d, "c", "a.jsonl.zst"), lines)
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) * 2 // 3])
    return "jsonl", p


def _no_column(d):
    p = os.path.join(d, "python", "a.parquet")
    os.makedirs(os.path.dirname(p))
    pq.write_table(pa.table({"text": ["x = 1", "y = 2"]}), p)
    return "starcoder", p


def _corrupt_page(d):
    """3 row groups of 1000 rows; the data page of the middle one overwritten with garbage."""
    p = os.path.join(d, "python", "a.parquet")
    os.makedirs(os.path.dirname(p))
    rows = [f"def f{i}():\n    return {i}  # " + "x" * 50 for i in range(3000)]
    pq.write_table(pa.table({"content": rows}), p, compression="zstd", row_group_size=1000,
                   use_dictionary=False)
    col = pq.ParquetFile(p).metadata.row_group(1).column(0)
    data = bytearray(open(p, "rb").read())
    a, n = col.data_page_offset, col.total_compressed_size
    data[a + 40 : a + n - 8] = b"\xab" * (n - 48)
    open(p, "wb").write(bytes(data))
    return "starcoder", p


CASES = {
    "bad_json": (_jsonl_case(b'{"text": "unterminated'), "line 2", 1),
    "missing_text": (_jsonl_case(b'{"content": "wrong key"}'), "line 2", 1),
    "text_not_string": (_jsonl_case(b'{"text": ["a", "list"]}'), "line 2", 1),
    "invalid_utf8": (_jsonl_case(b'{"text": "\xc3\x28 bad"}'), "line 2", 1),
    "truncated_stream": (_truncated, "a.jsonl.zst", 1),
    "missing_column": (_no_column, "a.parquet", 2),
    "too_deep": (_jsonl_case(b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "line 2", 1),
    "corrupt_stream": (_corrupt_page, "a.parquet:row 1000", 1000),
}


@pytest.mark.parametrize("reason", sorted(CASES))
def test_bad_input_stops_with_location_and_hint(tmp_path, reason):
    make, where, _ = CASES[reason]
    fmt, path = make(str(tmp_path))
    with pytest.raises(PrepError) as e:
        shard([path], tmp_path / "out", fmt=fmt)
    msg = str(e.value)
    assert path in msg and where in msg and f"[{reason}]" in msg
    assert "rerun with --skip-bad" in msg and "\n" not in msg  # one line, the advice kept
    # nothing half-done is left behind as if finished
    assert not os.path.exists(tmp_path / "out" / "t_train.bin")
    files = os.listdir(parts_dir(str(tmp_path / "out"), "t"))
    assert not [f for f in files if "tmp-" in f]
    # only units before the bad one (the corrupt page is in row group 1) are finished
    done = [f for f in files if f.endswith(".done.json")]
    assert done == [] or (reason == "corrupt_stream" and all(".u00000." in f for f in done))


@pytest.mark.parametrize("reason", sorted(CASES))
def test_skip_bad_skips_and_counts_by_reason(tmp_path, reason):
    make, _, n_bad = CASES[reason]
    fmt, path = make(str(tmp_path))
    m = shard([path], tmp_path / "out", fmt=fmt, skip_bad=True)["manifest"]
    docs = m["documents"]
    assert docs["skipped"] == {reason: n_bad}
    assert docs["read"] == docs["written"]["train"] + n_bad
    assert m["inputs"][0]["skipped"] == {reason: n_bad} and m["inputs"][0]["problems"]
    if docs["written"]["train"]:
        assert len(load_docs(tmp_path / "out" / "t_train")) == docs["written"]["train"]
    else:  # a file without its column: nothing to write, and the manifest says so
        assert "no documents" in m["warnings"][0]


def test_rerun_with_skip_bad_resumes_and_a_strict_rerun_redoes_what_it_skipped(tmp_path):
    """A bad line's advice, "rerun with --skip-bad", resumes the run (the finished unit is kept:
    it was refused as a run of other settings, every unit thrown away); a rerun without
    --skip-bad over units that skipped bad input redoes them, and stops at that input again."""
    fmt, path = _corrupt_page(str(tmp_path))
    with pytest.raises(PrepError, match="rerun with --skip-bad"):
        shard([path], tmp_path / "out", fmt=fmt)
    first = [f for f in os.listdir(parts_dir(str(tmp_path / "out"), "t")) if f.endswith(".done.json")]
    assert len(first) == 1
    kept = os.path.join(parts_dir(str(tmp_path / "out"), "t"), first[0])
    before = os.stat(kept).st_mtime_ns
    m = shard([path], tmp_path / "out", fmt=fmt, skip_bad=True)["manifest"]
    assert m["documents"]["skipped"] == {"corrupt_stream": 1000} and os.stat(kept).st_mtime_ns == before
    with pytest.raises(PrepError, match=r"\[corrupt_stream\]"):
        shard([path], tmp_path / "out", fmt=fmt)


def test_empty_documents_are_always_counted(tmp_path):
    """An empty text is a document skipped as empty; a blank line is no document at all (it
    stopped the run as bad JSON)."""
    lines = [GOOD[0], b'{"text": ""}', b"", b'{"text": "  \\n\\t "}', b"  \t", GOOD[1], b""]
    path = write_zst(str(tmp_path / "a.jsonl.zst"), lines)
    m = shard([path], tmp_path / "out", fmt="jsonl")["manifest"]
    assert m["documents"]["skipped"] == {"empty": 2}
    assert m["documents"]["written"] == {"train": 2} and m["documents"]["read"] == 4


def test_min_tokens_keeps_the_long_documents_and_counts_the_rest(tmp_path, capsys):
    """--min-tokens (a long-context stage's shard): documents with fewer tokens are skipped as
    `short` in both splits, the kept ones are the whole documents of a run without it, a rerun
    resumes without redoing them (`short` is no error), and another N under the same --out is
    refused as other settings."""
    lines = [json.dumps({"text": ("word " * n).strip()}).encode() for n in (3, 40, 5, 60, 80, 2)]
    path = write_zst(str(tmp_path / "a.jsonl.zst"), lines)
    every = shard([path], tmp_path / "all", fmt="jsonl", valid_fraction=0.3)["manifest"]
    full = load_docs(tmp_path / "all" / "t_train") + load_docs(tmp_path / "all" / "t_valid")
    n = 20
    m = shard([path], tmp_path / "out", fmt="jsonl", valid_fraction=0.3, min_tokens=n)["manifest"]
    kept = load_docs(tmp_path / "out" / "t_train") + load_docs(tmp_path / "out" / "t_valid")
    assert sorted(map(len, kept)) == sorted(len(d) for d in full if len(d) >= n) and len(kept) == 3
    assert m["documents"]["skipped"] == {"short": 3} and m["documents"]["read"] == 6
    assert sum(m["documents"]["written"].values()) == 3 and min(m["documents"]["written"].values()) >= 1
    assert m["settings"]["min_tokens"] == n and "min_tokens" not in every["settings"]
    assert shard([path], tmp_path / "out", fmt="jsonl", valid_fraction=0.3,
                 min_tokens=n)["inputs_done_now"] == 0
    with pytest.raises(PrepError, match="different settings"):
        shard([path], tmp_path / "out", fmt="jsonl", valid_fraction=0.3, min_tokens=n + 1)
    from prep_helpers import TOKENIZER
    from lenext_dist.prep.cli import shard_main

    argv = ["--input", path, "--format", "jsonl", "--tokenizer", TOKENIZER, "--out", str(tmp_path / "out"),
            "--name", "t", "--valid-fraction", "0.3", "--no-progress", "--min-tokens"]
    assert shard_main([*argv, str(n)]) == 0  # the flag is the same setting: a finished run
    capsys.readouterr()
    assert shard_main([*argv, "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --min-tokens must be >= 0") and len(err.strip().splitlines()) == 1


def test_set_filter_needs_set_names(tmp_path):
    """No set name, or one that is not a string (a list was a traceback, a number a failed sort of
    the counts at the end): missing_set_name."""
    lines = [GOOD[0], b'{"text": "no meta"}', b'{"text": "a list", "meta": {"redpajama_set_name": ["x"]}}',
             b'{"text": "a number", "meta": {"redpajama_set_name": 7}}']
    path = write_zst(str(tmp_path / "a.jsonl.zst"), lines)
    with pytest.raises(PrepError, match=r"missing_set_name.*--skip-bad"):
        shard([path], tmp_path / "o1", exclude_sets=["RedPajamaGithub"])
    m = shard([path], tmp_path / "o2", exclude_sets=["RedPajamaGithub"], skip_bad=True)["manifest"]
    assert m["documents"]["skipped"] == {"missing_set_name": 3}


def test_missing_tokenizer_and_bad_options_are_clear(tmp_path):
    from lenext_dist.prep.runner import ShardJob, run_shard

    path = write_zst(str(tmp_path / "a.jsonl.zst"), GOOD)
    with pytest.raises(PrepError, match="lenext prep tokenizer"):
        run_shard(ShardJob([path], "jsonl", str(tmp_path / "none.model"), str(tmp_path), "x"))
    with pytest.raises(PrepError, match="valid-fraction"):
        shard([path], tmp_path, fmt="jsonl", valid_fraction=1.5)
    with pytest.raises(PrepError, match="task-index"):
        shard([path], tmp_path, fmt="jsonl", task_index=2, num_tasks=2)


def test_an_empty_tokenizer_flag_is_named(tmp_path, capsys):
    """`--tokenizer ""` is refused as empty, not as "tokenizer model '<the current folder>' not
    found"."""
    from lenext_dist.prep.cli import shard_main

    path = write_zst(str(tmp_path / "a.jsonl.zst"), GOOD)
    with pytest.raises(SystemExit) as e:
        shard_main(["--input", path, "--format", "jsonl", "--tokenizer", "", "--out",
                    str(tmp_path / "o"), "--name", "x", "--no-progress"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --tokenizer: is empty" in err and "Traceback" not in err


def test_a_slurm_task_id_that_is_not_a_number_is_one_line(tmp_path, capsys, monkeypatch):
    """A Slurm array variable that is not an integer names itself and its value; explicit
    --task-index/--num-tasks do not read it."""
    from prep_helpers import TOKENIZER
    from lenext_dist.prep.cli import shard_main

    path = write_zst(str(tmp_path / "a.jsonl.zst"), GOOD)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "x")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    argv = ["--input", path, "--format", "jsonl", "--tokenizer", TOKENIZER, "--out",
            str(tmp_path / "o"), "--name", "x", "--no-progress"]
    assert shard_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SLURM_ARRAY_TASK_ID='x'") and "not an integer" in err
    assert len(err.strip().splitlines()) == 1
    assert shard_main([*argv, "--task-index", "0", "--num-tasks", "1"]) == 0


@pytest.mark.parametrize("args,message", [
    (["--tasks", "passkey:inf"], "--tasks passkey:inf: the weight after ':' must be a number > 0"),
    (["--tasks", "passkey:nan"], "--tasks passkey:nan: the weight after ':' must be a number > 0"),
    (["--tasks", "passkey:1e308,recall:1e308"], "--tasks passkey:1e308: the weight"),
    (["--tasks", "passkey", "--task-seed", "-1"], "--task-seed must be >= 0, got -1"),
])
def test_bad_task_weights_and_seed_are_one_line_errors(args, message, tmp_path, capsys):
    """Numpy's ValueErrors (NaN probabilities, a negative seed) never reach the user."""
    from prep_helpers import SLIMPAJAMA, TOKENIZER
    from lenext_dist.prep.cli import shard_main

    argv = ["--input", SLIMPAJAMA[0], "--format", "tasks", "--tokenizer", TOKENIZER,
            "--out", str(tmp_path), "--name", "x", "--no-progress", *args]
    assert shard_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
