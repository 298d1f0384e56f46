"""Readers on the real sample layouts, and every malformed-input case they must report."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from prep_helpers import SAMPLE, SLIMPAJAMA, STARCODER, write_zst
from lenext_dist.prep.errors import Bad, PrepError
from lenext_dist.prep.readers import (
    Doc,
    JsonlReader,
    ParquetReader,
    TxtReader,
    discover_inputs,
    open_reader,
)


def test_slimpajama_layout_has_text_and_set_names():
    recs = list(open_reader(SLIMPAJAMA[0], "slimpajama"))
    assert recs and all(isinstance(r, Doc) for r in recs)
    sets = {r.set_name for r in recs}
    assert "RedPajamaBook" in sets
    all_sets = {r.set_name for p in SLIMPAJAMA for r in open_reader(p, "slimpajama")}
    assert all_sets == {"RedPajamaBook", "RedPajamaGithub"}


def test_jsonl_reader_matches_plain_decompression(tmp_path):
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(open(SLIMPAJAMA[1], "rb").read())
    want = [json.loads(ln)["text"] for ln in raw.decode().splitlines()]
    reader = JsonlReader(SLIMPAJAMA[1])
    assert [r.text for r in reader] == want
    assert reader.bytes_done == os.path.getsize(SLIMPAJAMA[1])
    # the same lines uncompressed and split across several zstd frames read the same
    plain = tmp_path / "x.jsonl"
    plain.write_bytes(raw)
    assert [r.text for r in JsonlReader(str(plain))] == want
    multi = tmp_path / "multi.jsonl.zst"
    cut = raw.index(b"\n", len(raw) // 2) + 1
    c = zstandard.ZstdCompressor()
    multi.write_bytes(c.compress(raw[:cut]) + c.compress(raw[cut:]))
    assert [r.text for r in JsonlReader(str(multi))] == want


def test_starcoder_parquet_streams_all_rows_in_order():
    table = pq.read_table(STARCODER[0], columns=["content"])
    want = table.column("content").to_pylist()
    got = [r.text for r in ParquetReader(STARCODER[0])]
    assert got == want and len(got) > 32  # > one row group: batches were stitched in order


def _bad(records):
    return [r for r in records if isinstance(r, Bad)]


@pytest.mark.parametrize(
    "line, reason",
    [
        (b'{"text": "ok"', "bad_json"),
        (b"[1, 2]", "bad_json"),
        (b'{"meta": {}}', "missing_text"),
        (b'{"text": null}', "missing_text"),
        (b'{"text": 42}', "text_not_string"),
        (b'{"text": "caf\xe9"}', "invalid_utf8"),
        (b'{"text": "lone \\ud800 surrogate"}', "invalid_utf8"),
    ],
)
def test_each_malformed_line_is_reported_with_its_line(tmp_path, line, reason):
    path = write_zst(str(tmp_path / "d.jsonl.zst"), [b'{"text": "first"}', line, b'{"text": "3"}'])
    recs = list(JsonlReader(path))
    assert [r.text for r in recs if isinstance(r, Doc)] == ["first", "3"]
    (bad,) = _bad(recs)
    assert bad.reason == reason and bad.where == f"{path}:line 2"
    assert "--skip-bad" in str(bad.error()) and f"{path}:line 2" in str(bad.error())


def test_truncated_zst_keeps_complete_lines_and_reports(tmp_path):
    lines = [json.dumps({"text": f"document number {i} " * 20}).encode() for i in range(3000)]
    full = write_zst(str(tmp_path / "full.jsonl.zst"), lines)
    data = open(full, "rb").read()
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(data[: len(data) // 2])
    recs = list(JsonlReader(str(cut)))
    docs = [r for r in recs if isinstance(r, Doc)]
    (bad,) = _bad(recs)
    assert bad.reason == "truncated_stream" and bad is recs[-1]
    assert 0 < len(docs) < 3000
    assert [d.text for d in docs] == [json.loads(ln)["text"] for ln in lines[: len(docs)]]


def test_corrupt_zst_is_reported(tmp_path):
    p = tmp_path / "junk.jsonl.zst"
    p.write_bytes(b"this is not zstd at all" * 10)
    (bad,) = list(JsonlReader(str(p)))
    assert bad.reason == "corrupt_stream"


def test_parquet_without_the_column_counts_all_rows(tmp_path):
    p = str(tmp_path / "python" / "x.parquet")
    os.makedirs(os.path.dirname(p))
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), p)
    (bad,) = list(ParquetReader(p))
    assert bad.reason == "missing_column" and bad.docs == 3 and "'content'" in bad.detail


def test_parquet_bad_rows_are_reported_by_row(tmp_path):
    p = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"content": pa.array([b"ok", None, b"\xff\xfe", b"fine"], pa.binary())}),
                   p, row_group_size=2)
    recs = list(ParquetReader(p))
    assert [r.text for r in recs if isinstance(r, Doc)] == ["ok", "fine"]
    assert [(b.reason, b.where) for b in _bad(recs)] == [
        ("missing_text", f"{p}:row 1"), ("invalid_utf8", f"{p}:row 2")]
    q = str(tmp_path / "ints.parquet")
    pq.write_table(pa.table({"content": [1, 2]}), q)
    assert [b.reason for b in ParquetReader(q)] == ["column_not_string"]


def test_a_row_group_units_progress_is_its_share_of_the_file(tmp_path):
    """A unit of row groups counts the bytes the plan gives it (units.py: size // groups each),
    not the whole file's: 8 units of an 8-group file each reported the file's size, so the bar
    ran 8x past its total."""
    from lenext_dist.prep.units import split_file

    p = str(tmp_path / "g.parquet")
    pq.write_table(pa.table({"content": [f"row {i} " * 20 for i in range(4000)]}), p, row_group_size=500)
    units = split_file(p, "starcoder", os.path.getsize(p), step=1 << 20)
    assert len(units) == 8
    for u in units:
        r = ParquetReader(p, row_groups=u["row_groups"])
        seen = []
        for _ in r:
            seen.append(r.bytes_done)
        assert max(seen) <= u["bytes"] and r.bytes_done == u["bytes"]


def test_txt_is_one_document(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"line one\nline two\n")
    assert list(TxtReader(str(p))) == [Doc("line one\nline two\n", None)]
    p.write_bytes(b"bad \xff byte")
    assert [r.reason for r in TxtReader(str(p))] == ["invalid_utf8"]


def test_discover_sorts_dedupes_and_filters_languages(tmp_path):
    pat = os.path.join(SAMPLE, "slimpajama", "chunk*", "*.jsonl.zst")
    got = discover_inputs([pat, SLIMPAJAMA[0], os.path.join(SAMPLE, "slimpajama")], "slimpajama")
    assert got == SLIMPAJAMA and len(got) == 8
    for lang in ("python", "java"):
        d = tmp_path / lang
        d.mkdir()
        pq.write_table(pa.table({"content": [f"{lang} code"]}), str(d / "train-0.parquet"))
    both = discover_inputs([str(tmp_path / "*" / "*.parquet")], "starcoder")
    assert [os.path.basename(os.path.dirname(p)) for p in both] == ["java", "python"]
    only = discover_inputs([str(tmp_path)], "starcoder", languages=["Python"])
    assert only == [str(tmp_path / "python" / "train-0.parquet")]
    with pytest.raises(PrepError, match="matches no"):
        discover_inputs([str(tmp_path / "nothing*.jsonl.zst")], "slimpajama")
    with pytest.raises(PrepError, match="language"):
        discover_inputs([str(tmp_path)], "starcoder", languages=["rust"])
