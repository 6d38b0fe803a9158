"""Records from the datasets world: a parquet file, a save_to_disk folder, a local folder of
data files and a hub name (from the local cache, offline) give the records the JSONL gives."""

import json
import os
import subprocess
import sys

import pytest

from betaprm.data.convert import convert_file
from betaprm.data.records import read_records
from betaprm.errors import BetaPRMInputError


def _rows():
    rows = []
    for i in range(6):
        r = {
            "id": f"r{i}",
            "question": f"what is {i} + 1?",
            "steps": [f"{i} + 1 = {i + 1}", f"answer {i + 1}"],
            "mc_correct": [3, i % 4],
            "mc_total": [4, 4],
            "source": "toy",
        }
        if i % 2:
            r["answer"] = str(i + 1)  # absent from half the rows: a null cell in a table
        rows.append(r)
    return rows


def _as_dicts(loaded):
    return [vars(r) | {"line": 0} for r in loaded.records]


def write_hub_cache(cache_dir, repo_id, splits: dict) -> None:
    """Lay out ``datasets``' cache as a ``load_dataset(repo_id)`` download leaves it (arrow
    files under ``namespace___name/default/0.0.0/HASH``), so that offline mode finds it
    by name. The hub itself is not reachable from the tests."""
    import glob
    import tempfile

    from datasets.packaged_modules.json.json import Json

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, rows in splits.items():
            files[split] = os.path.join(tmp, f"{split}.jsonl")
            with open(files[split], "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        b = Json(
            data_files=files,
            dataset_name=repo_id.split("/")[1],
            hash="0" * 16,
            config_name="default",
            cache_dir=str(cache_dir),
        )
        b.repo_id = repo_id  # the namespace___name folder a hub download is cached under
        b._cache_dir = b._build_cache_dir()
        b.download_and_prepare()
    (built,) = glob.glob(os.path.join(cache_dir, repo_id.replace("/", "___"), "*"))
    os.rename(built, os.path.join(os.path.dirname(built), "default"))  # a hub repo's config id


def test_parquet_and_saved_folders_give_the_jsonl_records(tmp_path):
    import datasets

    rows = _rows()
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    want = _as_dicts(read_records(tmp_path / "c.jsonl"))
    # every column in every row, null where a JSONL line has no such field (from_list would
    # take the first row's keys only)
    ds = datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}})
    ds.to_parquet(str(tmp_path / "c.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "train.jsonl").write_text((tmp_path / "c.jsonl").read_text())
    for spec in ("c.parquet", "saved", "dict:train", "files"):
        assert _as_dicts(read_records(tmp_path / spec if ":" not in spec else f"{tmp_path}/{spec}")) == want, spec
    assert [r.id for r in read_records(f"{tmp_path}/dict:test").records] == ["r0", "r1"]
    # a .json file: a JSON list, or JSON lines under that name
    (tmp_path / "list.json").write_text(json.dumps(rows))
    (tmp_path / "lines.json").write_text((tmp_path / "c.jsonl").read_text())
    assert _as_dicts(read_records(tmp_path / "list.json")) == want == _as_dicts(read_records(tmp_path / "lines.json"))
    with pytest.raises(BetaPRMInputError, match=r"has 2 splits \(train, test\); name one as .*dict:train"):
        read_records(tmp_path / "dict")
    with pytest.raises(BetaPRMInputError, match=r"no split 'dev'; it has train, test"):
        read_records(f"{tmp_path}/dict:dev")
    # a missing path is a missing file at once, never a hub lookup
    for missing in (tmp_path / "nope", tmp_path / "nope.csv", "runs/data/nope"):
        with pytest.raises(BetaPRMInputError, match="no such file"):
            read_records(missing, flag="--data")
    # a bad row is named by its row number, as a JSONL line is by its line
    bad = [*rows[:2], {**rows[2], "mc_correct": [9, 0]}]
    datasets.Dataset.from_list(bad).to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(BetaPRMInputError, match=r"bad.parquet:3: field 'mc_correct\[0\]': K = 9 > N = 4"):
        read_records(tmp_path / "bad.parquet")


def test_convert_reads_a_saved_folder(tmp_path):
    import datasets

    trl = [{"prompt": "p", "completions": ["a", "b"], "labels": [True, False]}] * 3
    datasets.Dataset.from_list(trl).save_to_disk(str(tmp_path / "trl"))
    (tmp_path / "trl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trl))
    a = convert_file("trl", tmp_path / "trl", tmp_path / "a.jsonl")
    b = convert_file("trl", tmp_path / "trl.jsonl", tmp_path / "b.jsonl")
    assert a == b and (tmp_path / "a.jsonl").read_text().replace('"trl-', '"x-') == (
        (tmp_path / "b.jsonl").read_text().replace('"trl-', '"x-')
    )


def _offline_env(tmp_path):
    return {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def test_a_hub_name_loads_offline_from_the_cache_and_a_missing_one_is_a_clear_error(tmp_path):
    rows = _rows()
    write_hub_cache(tmp_path / "hf" / "datasets", "someone/toy-counts", {"train": rows, "test": rows[:2]})
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = (
        "import json, sys; from betaprm.data.records import read_records\n"
        "print(json.dumps([vars(r) | {'line': 0} for r in read_records(sys.argv[1]).records]))"
    )
    env = _offline_env(tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", code, "someone/toy-counts:train"], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.splitlines()[-1]) == _as_dicts(read_records(tmp_path / "c.jsonl"))
    res = subprocess.run(
        [sys.executable, "-m", "betaprm", "validate", "nobody/not-cached"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "not a file, and datasets could not load it as a hub name" in res.stderr
    assert "HF_HUB_OFFLINE" in res.stderr


def test_data_fingerprints_follow_contents_and_a_file_has_no_splits(tmp_path):
    import datasets

    from betaprm.provenance import fingerprint

    rows = _rows()
    datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in rows[0]}).save_to_disk(str(tmp_path / "a"))
    datasets.Dataset.from_dict({k: [r.get(k) for r in rows[:3]] for k in rows[0]}).save_to_disk(str(tmp_path / "b"))
    fa, fb = fingerprint(tmp_path / "a"), fingerprint(tmp_path / "b")
    assert fa != fb and fa != fingerprint(tmp_path / "empty")
    (tmp_path / "c.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(BetaPRMInputError, match=r"c.jsonl is a file, which has no splits; drop ':train'"):
        read_records(f"{tmp_path / 'c.jsonl'}:train")


def test_a_folder_with_two_files_of_one_stem_is_refused(tmp_path):
    """x.json and x.jsonl would both be split 'x': refused, naming both (the earlier code
    read one of them and dropped the other silently)."""
    from betaprm.data.sources import iter_splits
    from betaprm.errors import BetaPRMInputError

    (tmp_path / "x.json").write_text('[{"a": 1}]')
    (tmp_path / "x.jsonl").write_text('{"a": 2}\n')
    with pytest.raises(BetaPRMInputError, match=r"x.json and x.jsonl would both be split 'x'"):
        iter_splits(tmp_path)
