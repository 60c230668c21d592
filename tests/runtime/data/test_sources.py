"""runtime/data/sources.py: which reader `--data` names, and what it says when it names none."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.data.errors import DataError
from runtime.data.sources import DataChoice, choose_data
from sample_files import criteo_spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "crieto:day_0.tsv",
            "--data crieto:day_0.tsv: unknown reader 'crieto' (did you mean 'criteo'?); the readers: "
            "synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or prepared:DIR",
        ),
        (
            "parket:x",
            "--data parket:x: unknown reader 'parket' (did you mean 'parquet'?); the readers: "
            "synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or prepared:DIR",
        ),
        (
            "avro:x",
            "--data avro:x: unknown reader 'avro'; the readers: "
            "synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or prepared:DIR",
        ),
        (
            "day_0.tsv",
            "--data day_0.tsv: name the reader "
            "(criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or prepared:DIR); the spec's data section does not",
        ),
    ],
)
def test_an_unknown_reader_or_a_bare_path_without_a_spec_reader_is_named(text: str, message: str) -> None:
    with pytest.raises(DataError) as raised:
        choose_data(text, criteo_spec())
    assert str(raised.value) == message


def test_a_bare_path_goes_to_the_specs_reader_even_with_a_colon_in_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("day:0.tsv").write_text("")
    inputs = criteo_spec(data={"reader": "criteo", "path": "elsewhere"})
    assert choose_data("day:0.tsv", inputs) == DataChoice("criteo", "day:0.tsv")
    assert choose_data("csv:day:0.tsv", inputs) == DataChoice("csv", "day:0.tsv")
