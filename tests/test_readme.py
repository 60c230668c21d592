"""The README works as written: its command summary, its example error, its module snippet.

- Every option of every `reccompile` command's parser appears on that
  command's lines of the command summary.
- The example spec error is the output of the command it shows, on a spec
  that is in the repository.
- "Using a generated module" runs in sequence after `make run`: its shell
  line, then its Python snippet, in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _blocks(section: str, language: str) -> list[str]:
    """The fenced `language` blocks of the README section titled `section`."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.DOTALL)


def _summary_per_command() -> dict[str, str]:
    """Command name -> its lines of the command summary (`reccompile SPEC` is compile)."""
    (summary,) = [b for b in _blocks("The command line", "sh") if b.startswith("reccompile ")]
    entries = re.split(r"^reccompile ", summary, flags=re.MULTILINE)[1:]
    return {("compile" if e.startswith("SPEC") else e.split()[0]): e for e in entries}


def _options() -> dict[str, list[list[str]]]:
    """Command name -> the option strings of each of its options (`-o`, `--outdir`: one option)."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name: [a.option_strings for a in command._actions if a.option_strings and a.dest != "help"]
        for name, command in commands.choices.items()
    }


def _named(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize("command", sorted(_options()))
def test_the_command_summary_lists_every_option(command: str) -> None:
    lines = _summary_per_command().get(command)
    assert lines is not None, f"the README's command summary has no line for `reccompile {command}`"
    missing = [names for names in _options()[command] if not any(_named(n, lines) for n in names)]
    assert missing == [], f"`reccompile {command}` options missing from the README: {missing}"


def test_the_example_error_is_what_the_command_prints(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    (example,) = [b for b in re.findall(r"```\n(\$ reccompile check .*?)```", README, flags=re.DOTALL)]
    command, *expected = example.splitlines()
    args = shlex.split(command)[2:]
    assert (REPO / args[-1]).is_file()
    monkeypatch.chdir(REPO)
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", expected)


def test_the_module_snippet_runs_after_make_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (command,) = _blocks("Using a generated module", "sh")
    (snippet,) = _blocks("Using a generated module", "python")
    (tmp_path / "specs").mkdir()
    shutil.copy(REPO / "specs" / "dlrm_criteo.yaml", tmp_path / "specs")
    # What `make run` leaves behind: a module for 2 ranks in build/.
    monkeypatch.chdir(tmp_path)
    assert main(["specs/dlrm_criteo.yaml", "--world-size", "2", "-o", "build"]) == 0
    program, *args = shlex.split(command.strip())
    assert program == ".venv/bin/reccompile"
    assert main(args) == 0
    done = subprocess.run(
        [sys.executable, "-c", snippet + "\nprint(float(loss))\n"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert 0.0 < float(done.stdout.split()[-1]) < 10.0


def _ml_1m(root: Path) -> Path:
    """A tiny ml-1m: ratings.dat of 20 users (the README's movies 1193 and 661 among theirs) and movies.dat."""
    movies = [1193, 661, 914, 3408, 2355, 1197, 1287, 2804]
    genres = [
        "Drama",
        "Animation|Children's|Musical",
        "Musical|Romance",
        "Drama",
        "Animation|Comedy",
        "Action|Adventure|Romance",
        "Action|Drama",
        "Comedy|Drama",
    ]
    named = zip(movies, genres, strict=True)
    (root / "movies.dat").write_text("".join(f"{m}::Movie {m} (2000)::{g}\n" for m, g in named))
    lines = [
        f"{u}::{m}::{1 + (u * m) % 5}::{978300000 + 10 * u + i}" for u in range(1, 21) for i, m in enumerate(movies)
    ]
    (root / "ratings.dat").write_text("\n".join(lines) + "\n")
    return root / "ratings.dat"


def test_the_serving_examples_answer_what_predict_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "Serving online" section's server, curl and tritonclient examples, as written, on
    specs/two_tower_movielens.yaml trained 2 steps on a tiny ml-1m; only the port is the one the server
    got (port 0), not 8000."""
    import json

    from serving_client import started_server

    ratings = _ml_1m(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = str(REPO / "specs" / "two_tower_movielens.yaml")
    assert (
        main(
            [
                "train",
                spec,
                "--data",
                f"movielens:{ratings}",
                "--steps",
                "2",
                "--data-workers",
                "0",
                "--checkpoint-dir",
                "ckpt",
                "-o",
                "build",
            ]
        )
        == 0
    )
    assert main(["export", spec, "--checkpoint", "ckpt", "--no-aot", "-o", "out"]) == 0
    (tmp_path / "asked.dat").write_text("1::1193::5::0\n2::661::5::0\n")
    assert main(["predict", "out", "--data", "movielens:asked.dat", "-o", "predicted.csv"]) == 0
    predicted = [float(line.split(",")[-1]) for line in (tmp_path / "predicted.csv").read_text().splitlines()[1:]]
    serve, curl = _blocks("Serving online", "sh")
    (snippet,) = _blocks("Serving online", "python")
    program, *args = shlex.split(serve)
    assert program == "reccompile" and args[0] == "serve"
    with started_server(args[1:], cwd=tmp_path) as server:
        here = "{}:{}".format(*server.address)
        curled = curl.replace("localhost:8000", here)
        done = subprocess.run(["bash", "-c", curled], capture_output=True, text=True, timeout=60)
        answer = json.loads(done.stdout)
        ran = subprocess.run(
            [sys.executable, "-c", snippet.replace("localhost:8000", here)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
    assert (answer["model_name"], answer["model_version"]) == ("two_tower_movielens", "1")
    (like,) = answer["outputs"]
    assert (like["name"], like["datatype"], like["shape"]) == ("like", "FP32", [2])
    assert like["data"] == pytest.approx(predicted, rel=1e-6, abs=1e-6)
    assert ran.returncode == 0, ran.stderr
    printed = [float(v) for v in ran.stdout.strip().strip("[]").split()]
    assert printed == pytest.approx(predicted, rel=1e-6, abs=1e-6)


def test_your_own_data_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The commands of "Your own data" on a small table in the example's layout (tests/runtime/features)."""
    sys.path.insert(0, str(REPO / "tests" / "runtime" / "features"))
    from own_data import rating_rows, split_by_user, write_csv

    (commands,) = _blocks("Your own data", "sh")
    (tmp_path / "specs" / "examples").mkdir(parents=True)
    shutil.copy(REPO / "specs" / "examples" / "movielens_csv.yaml", tmp_path / "specs" / "examples")
    train, test = split_by_user(rating_rows())
    write_csv(tmp_path / "data" / "train.csv", train)
    write_csv(tmp_path / "data" / "test.csv", test)
    monkeypatch.chdir(tmp_path)
    for line in commands.strip().splitlines():
        program, *args = shlex.split(line)
        assert program == "reccompile"
        assert main(args) == 0, line
    out = capsys.readouterr().out
    assert "  feature user: vocabulary of 40 values (of 40 seen, min_count 1), 1 OOV row" in out
    assert "wrote 160 predictions to scores.csv" in out
    assert (tmp_path / "served" / "features.json").read_bytes() == (
        tmp_path / "build" / "movielens_csv.features.json"
    ).read_bytes()


def test_the_models_table_names_every_spec_with_a_source_and_its_differences() -> None:
    """Every spec under specs/ (its path below specs/) is in one row of the Models table, whose source
    and differences columns are filled."""
    body = README.split("\n## Models\n", 1)[1].split("\n#", 1)[0]  # to the next heading
    rows = [line.split(" | ") for line in body.splitlines() if line.startswith("| `")]
    named = {spec: row for row in rows for spec in re.findall(r"`([\w/]+\.yaml)`", row[0])}
    specs = sorted(p.relative_to(REPO / "specs").as_posix() for p in (REPO / "specs").rglob("*.yaml"))
    assert [spec for spec in specs if spec not in named] == []
    assert [spec for spec in named if spec not in specs] == []
    assert [row[0] for row in rows if len(row) != 4 or not all(cell.strip(" |") for cell in row)] == []
