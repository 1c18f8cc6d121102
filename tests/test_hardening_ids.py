"""Run ids and files: a bad id or an unusable directory is a one-line error before the run, never after it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hx_cli import hx
from toybench import RANDOM, ToyBench, ids

from hx.environments.rollout import Rollout
from hx.harness.config import HarnessConfig
from streams.config import NatsSettings
from streams.connection import connect
from streams.errors import InvalidRunId
from streams.topology import RUN_ID_MAX, TRACE, check_run_id


@pytest.mark.parametrize(("run_id", "message"), [
    ("../../x", "has characters '/'"),
    ("a/b", "has characters '/'"),
    (".hidden", "a first character other than a letter or digit"),
    ("-flag", "a first character other than a letter or digit"),
    ("x" * 300, f"run id is 300 characters long; at most {RUN_ID_MAX} are allowed"),
    ("x" * 5000, f"run id is 5000 characters long; at most {RUN_ID_MAX} are allowed"),
    ("tab\there", "has characters '\\t'"),
    ("ünï", "has characters 'nü'".replace("nü", "ïü")),
])
def test_a_bad_run_id_is_refused_up_front(tmp_path: Path, run_id: str, message: str) -> None:
    result = hx("--data-dir", str(tmp_path / "data"), "run", "--tasks", "1", "--run-id", run_id)
    assert result.exit_code == 2, result.output  # a usage error, before anything ran
    assert message in result.stderr and "--run-id" in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "x.json").exists()


def test_valid_run_ids() -> None:
    for good in ("run-20261123T181323Z-7da887", "a", "A.b_c-1", "x" * RUN_ID_MAX):
        assert check_run_id(good) == good


async def test_the_rollout_api_checks_run_ids_too(nats_url: str) -> None:
    async with connect(NatsSettings(url=nats_url)) as conn:
        ro = Rollout(ToyBench(), RANDOM, HarnessConfig(), log=conn.log)
        with pytest.raises(InvalidRunId, match="at most 128"):
            await ro.rollout("y" * 129, ids("easy", 1))
        assert await conn.log.last_seq(TRACE.name) == 0


def test_an_unusable_data_dir_is_one_line_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = hx("--data-dir", str(blocker / "data"), "run", "--tasks", "1", "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot use data directory {blocker / 'data'}: Not a directory"), line
    assert not (tmp_path / "r.json").exists()  # the claimed results file was given back


def test_an_unusable_results_directory_is_one_line_before_the_run(tmp_path: Path, nats_url: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "1", "--run-id", "nowhere",
                "--out", str(blocker / "results" / "r.json"))
    assert result.exit_code == 1, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot write results to") and "Not a directory" in line, line

    async def appended() -> int:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return await conn.log.last_seq(TRACE.name)
    assert asyncio.run(appended()) == 0  # refused before the run claimed anything on the log


def test_a_results_name_too_long_for_the_file_system_is_found_before_the_run(tmp_path: Path) -> None:
    result = hx("--data-dir", str(tmp_path), "run", "--tasks", "1", "--out", str(tmp_path / ("r" * 300 + ".json")))
    assert result.exit_code == 1 and "File name too long" in result.stderr
    assert not (tmp_path / "nats").exists()
