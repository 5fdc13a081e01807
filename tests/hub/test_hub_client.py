"""moescope.hub against a stand-in Hub: search, listing, header-only fit, downloads."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_helpers import (
    BIG_REPO,
    CHILD_TIMEOUT_S,
    GATED_REPO,
    GATED_TOKEN,
    REPO,
    SPLIT_REPO,
    Hub,
    held_pull,
)

from moescope.hub.download import (
    LockHolder,
    Progress,
    download_holder,
    download_model,
    local_models,
    model_paths,
)
from moescope.hub.errors import (
    DiskFullError,
    DownloadBusy,
    DownloadCancelled,
    DownloadInterrupted,
    HashMismatchError,
    HubGated,
    HubNotFound,
    HubUnreachable,
)
from moescope.hub.fit import remote_fit
from moescope.hub.remote import HubClient, pick_model, quant_of
from moescope.model.gguf_info import read_model_info
from moescope.util.errors import ModelFormatError
from moescope_testing.hub_server import closed_port_endpoint, file_key

MB = 1 << 20


def test_search_asks_for_gguf_and_flags_moe(hub: Hub) -> None:
    hits = HubClient().search("moe")
    assert [h.repo_id for h in hits][:2] == [BIG_REPO, REPO]  # most downloaded first
    assert all(h.moe for h in hits)
    assert hub.server.queries[-1]["filter"] == ["gguf"]
    assert HubClient().search("no-such-words") == []


def test_listing_groups_split_files_and_keeps_hashes(hub: Hub) -> None:
    models = HubClient().list_models(SPLIT_REPO)
    assert len(models) == 1
    m = models[0]
    assert m.name == "Q8_0/Split-MoE-Q8_0.gguf" and m.quant == "Q8_0"
    assert [Path(f.path).name for f in m.files] == [
        f"Split-MoE-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert m.complete and all(f.sha256 and len(f.sha256) == 64 for f in m.files)
    tiny = HubClient().list_models(REPO)
    assert sorted(x.quant for x in tiny) == ["Q4_0", "Q8_0"]  # README.md is not a model


def test_listing_follows_pages(hub: Hub) -> None:
    hub.server.page_size = 1  # README, then one file per page
    assert len(HubClient().list_models(REPO)) == 2


def test_pick_by_quant_file_or_error(hub: Hub) -> None:
    models = HubClient().list_models(REPO)
    assert pick_model(models, "q4_0").name == "Tiny-MoE-Q4_0.gguf"
    assert pick_model(models, "Tiny-MoE-Q8_0.gguf").quant == "Q8_0"
    with pytest.raises(HubNotFound, match="Q4_0, Q8_0"):
        pick_model(models, "Q6_K")
    assert quant_of("x/UD-IQ2_XXS/m-UD-IQ2_XXS-00001-of-00002.gguf") == "UD-IQ2_XXS"


def test_header_only_fit_of_a_17_gib_file_reads_one_mb(hub: Hub) -> None:
    model = HubClient().list_models(BIG_REPO)[0]
    assert model.size > 16 * (1 << 30)
    fit = remote_fit(HubClient(), model, "25%")
    local = read_model_info(hub.big)
    assert fit.info.metadata_sha256 == local.metadata_sha256
    assert fit.info.total_expert_bytes == local.total_expert_bytes
    assert fit.estimate.plan is not None and fit.estimate.plan.slots_per_layer == 32
    served = hub.server.served[file_key(BIG_REPO, "Big-MoE-Q4_0.gguf")]
    assert served == fit.bytes_read <= 2 * MB
    assert "32/128 experts per layer" in fit.summary()


def test_header_range_grows_until_the_header_is_read(hub: Hub) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    fit = remote_fit(HubClient(), model, "50%", first_bytes=512)
    assert fit.info.metadata_sha256 == read_model_info(hub.tiny).metadata_sha256
    ranges = [r for k, r in hub.server.ranges if k == file_key(REPO, model.name)]
    assert len(ranges) > 1 and ranges[0] == "bytes=0-511"
    assert fit.bytes_read < model.size  # the tensor data was never fetched


def test_split_model_fit_reads_every_part_header(hub: Hub) -> None:
    model = HubClient().list_models(SPLIT_REPO)[0]
    fit = remote_fit(HubClient(), model, "25%")
    local = read_model_info(hub.split_first)
    assert fit.info.total_expert_bytes == local.total_expert_bytes
    assert fit.info.n_tensors == local.n_tensors
    assert all(hub.server.served[file_key(SPLIT_REPO, f.path)] <= MB for f in model.files)


def test_download_verifies_and_lands_in_models_folder(hub: Hub, tmp_path: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    seen: list[Progress] = []
    path = download_model(HubClient(), model, tmp_path / "models", on_progress=seen.append)
    assert path == tmp_path / "models" / "test-org" / "Tiny-MoE-GGUF" / "Tiny-MoE-Q8_0.gguf"
    assert path.read_bytes() == hub.tiny.read_bytes()
    assert seen[-1].done == seen[-1].total == model.size
    assert "100%" in seen[-1].line()
    assert local_models(tmp_path / "models") == [path]
    assert read_model_info(path).is_moe


def test_a_model_already_in_place_takes_no_lock(hub: Hub, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing left to download writes nothing: a complete model in a read-only folder was
    refused ("cannot write NAME.gguf.lock") instead of returned."""
    from moescope.hub import download

    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    path = download_model(HubClient(), model, tmp_path / "models")

    def no_lock(*_args: object) -> None:
        raise AssertionError("the lock was taken with nothing to download")

    monkeypatch.setattr(download, "_download_lock", no_lock)
    seen: list[Progress] = []
    assert download_model(HubClient(), model, tmp_path / "models",
                          on_progress=seen.append) == path
    assert seen[-1].done == seen[-1].total == model.size
    assert path.read_bytes() == hub.tiny.read_bytes()


def test_download_holder_names_the_process_downloading_a_model(hub: Hub) -> None:
    """What *Get models* polls: the holder of a model's download lock, from another
    process (a real `moescope pull`), without taking the lock from it."""
    from moescope.util import paths

    folder = paths.models_dir()
    models = HubClient().list_models(REPO)
    q8, q4 = pick_model(models, "Q8_0"), pick_model(models, "Q4_0")
    assert download_holder(folder, q8) is None  # no lock file
    with held_pull(hub) as other:
        assert download_holder(folder, q8) == LockHolder(other.process.pid)
        assert download_holder(folder, q8) == LockHolder(other.process.pid)  # not taken
        assert download_holder(folder, q4) is None  # per model
        other.pause.go.set()
        assert other.process.wait(CHILD_TIMEOUT_S) == 0
    assert download_holder(folder, q8) is None
    lock = model_paths(folder, q8)[0].with_name("Tiny-MoE-Q8_0.gguf.lock")
    lock.write_text("999999\n")  # left by a crash: free
    assert download_holder(folder, q8) is None


def test_split_download_lists_only_the_first_part(hub: Hub, tmp_path: Path) -> None:
    model = HubClient().list_models(SPLIT_REPO)[0]
    path = download_model(HubClient(), model, tmp_path / "m")
    assert local_models(tmp_path / "m") == [path]
    assert read_model_info(path).parts[-1].name.endswith("-00003-of-00003.gguf")


def test_dropped_connection_resumes_in_the_same_download(hub: Hub, tmp_path: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    key = file_key(REPO, model.name)
    hub.server.drop_after[key] = 100_000
    path = download_model(HubClient(), model, tmp_path)
    assert path.read_bytes() == hub.tiny.read_bytes()
    ranges = [r for k, r in hub.server.ranges if k == key]
    assert ranges == [None, "bytes=100000-"]


def test_interrupted_download_resumes_on_the_next_run(hub: Hub, tmp_path: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    key = file_key(REPO, model.name)
    hub.server.drop_after[key] = 200_000
    with pytest.raises(DownloadInterrupted, match="run the download again to resume"):
        download_model(HubClient(), model, tmp_path, retries=0)
    final = model_paths(tmp_path, model)[0]
    partial = final.with_name(final.name + ".incomplete")
    assert not final.exists() and partial.stat().st_size == 200_000
    assert local_models(tmp_path) == []
    with pytest.raises(ModelFormatError, match="unfinished download"):
        read_model_info(partial)
    path = download_model(HubClient(), model, tmp_path)
    assert path.read_bytes() == hub.tiny.read_bytes() and not partial.exists()
    assert hub.server.ranges[-1] == (key, "bytes=200000-")
    assert hub.server.served[key] == model.size  # 200000 + the rest: nothing twice


def test_cancel_keeps_the_partial_file(hub: Hub, tmp_path: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    cancel = threading.Event()

    def progress(p: Progress) -> None:
        if p.done > 0:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        download_model(HubClient(), model, tmp_path, on_progress=progress, cancel=cancel)
    final = model_paths(tmp_path, model)[0]
    assert not final.exists() and final.with_name(final.name + ".incomplete").exists()


def test_corrupted_bytes_are_detected_and_deleted(hub: Hub, tmp_path: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    hub.server.corrupt.add(file_key(REPO, model.name))
    with pytest.raises(HashMismatchError, match=r"not the Hub's.*sha256"):
        download_model(HubClient(), model, tmp_path)
    final = model_paths(tmp_path, model)[0]
    assert not final.exists() and not final.with_name(final.name + ".incomplete").exists()


def test_no_network_is_one_quick_sentence(hub: Hub) -> None:
    client = HubClient(endpoint=closed_port_endpoint())
    with pytest.raises(HubUnreachable, match=r"cannot reach 127.0.0.1.*network"):
        client.search("moe")


def test_missing_repo_and_file_are_404(hub: Hub) -> None:
    with pytest.raises(HubNotFound, match="404"):
        HubClient().list_models("test-org/No-Such-Repo")
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    hub.server.repos[REPO].files.pop(model.name)
    with pytest.raises(HubNotFound, match="404"):
        remote_fit(HubClient(), model)


def test_gated_repo_needs_the_right_token(hub: Hub, tmp_path: Path) -> None:
    model = HubClient().list_models(GATED_REPO)[0]
    with pytest.raises(HubGated, match=r"401.*gated.*HF_TOKEN"):
        remote_fit(HubClient(), model)
    with pytest.raises(HubGated, match=r"403.*token was refused"):
        download_model(HubClient(token="hf_wrong"), model, tmp_path)
    assert remote_fit(HubClient(token=GATED_TOKEN), model).info.is_moe


def test_gated_repo_token_from_hf_token(hub: Hub, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", GATED_TOKEN)
    monkeypatch.delenv("HF_HUB_DISABLE_IMPLICIT_TOKEN")
    model = HubClient().list_models(GATED_REPO)[0]
    assert download_model(HubClient(), model, tmp_path).is_file()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only; skipped elsewhere)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()[:80]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_without_room_is_found_before_the_first_byte(hub: Hub, small_disk: Path) -> None:
    (small_disk / "filler").write_bytes(b"\0" * (700 << 10))
    model = pick_model(HubClient().list_models(REPO), "Q8_0")  # 478 KiB > 324 KiB free
    with pytest.raises(DiskFullError, match=r"not enough free space.*needs"):
        download_model(HubClient(), model, small_disk)
    assert hub.server.served[file_key(REPO, model.name)] == 0


def test_disk_filling_up_midway_keeps_the_partial_file(hub: Hub, small_disk: Path) -> None:
    model = pick_model(HubClient().list_models(REPO), "Q8_0")

    def fill(p: Progress) -> None:
        filler = small_disk / "filler"
        if p.done and not filler.exists():  # someone else takes the space meanwhile
            with filler.open("wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()

    with pytest.raises(DiskFullError, match=r"disk filled up.*resume"):
        download_model(HubClient(), model, small_disk, on_progress=fill)
    final = model_paths(small_disk, model)[0]
    assert not final.exists()
    assert 0 < final.with_name(final.name + ".incomplete").stat().st_size < model.size
    (small_disk / "filler").unlink()
    assert download_model(HubClient(), model, small_disk).read_bytes() == hub.tiny.read_bytes()


def _reports_holes(folder: Path) -> bool:
    probe = folder / "hole-probe"
    with probe.open("wb") as f:
        f.seek(1 << 20)
        f.write(b"x")
    try:
        with probe.open("rb") as f:
            return os.lseek(f.fileno(), 0, os.SEEK_HOLE) == 0
    except (AttributeError, OSError):
        return False
    finally:
        probe.unlink()


def test_a_partial_file_cut_by_another_program_is_not_put_in_place(hub: Hub,
                                                                   tmp_path: Path) -> None:
    """The bytes on disk, not just the stream, are checked before the rename: another
    program (an older MoEScope without the download lock, say) cutting the `.incomplete`
    file back while the download writes on leaves a zero-filled hole in it."""
    if not _reports_holes(tmp_path):
        pytest.skip("this file system does not report holes (SEEK_HOLE)")
    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    pause = hub.server.pause(file_key(REPO, model.name), range=None, at=300_000)
    partial = model_paths(tmp_path, model)[0].with_name(model.name + ".incomplete")

    def other_program() -> None:
        assert pause.reached.wait(60)
        subprocess.run([sys.executable, "-c",
                        f"import os; os.truncate({str(partial)!r}, 100_000)"], check=True)
        pause.go.set()

    cutter = threading.Thread(target=other_program)
    cutter.start()
    try:
        with pytest.raises(HashMismatchError, match=r"file on disk is not what was downloaded"):
            download_model(HubClient(), model, tmp_path)
    finally:
        pause.go.set()
        cutter.join(60)
    final = model_paths(tmp_path, model)[0]
    assert not final.exists() and not partial.exists()
    assert download_model(HubClient(), model, tmp_path).read_bytes() == hub.tiny.read_bytes()


def test_a_download_starting_while_the_window_looks_at_its_lock_is_not_refused(
        hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Get models looks at a model's lock every second (shared, let go at once): a pull
    starting in that instant was refused as busy. A look held for a moment now only delays
    it; a lock held longer (a real download) still refuses it."""
    import fcntl

    from moescope.hub import download

    model = pick_model(HubClient().list_models(REPO), "Q8_0")
    folder = tmp_path / "models"
    lock = model_paths(folder, model)[0].with_name("Tiny-MoE-Q8_0.gguf.lock")
    lock.parent.mkdir(parents=True)
    lock.write_text("")  # as the pull leaves it between its open and its lock
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a look in progress
        waits: list[float] = []

        def sleep(seconds: float) -> None:  # the look ends while the pull waits to retry
            waits.append(seconds)
            fcntl.flock(fd, fcntl.LOCK_UN)

        with monkeypatch.context() as patch:
            patch.setattr(download.time, "sleep", sleep)
            path = download_model(HubClient(), model, folder)
        assert waits == [download.LOOK_RETRY_S]
        assert path.read_bytes() == hub.tiny.read_bytes() and not lock.exists()
        lock.write_text("")
        fd2 = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held past the retries
            path.unlink()
            with pytest.raises(DownloadBusy):
                download_model(HubClient(), model, folder)
        finally:
            os.close(fd2)
    finally:
        os.close(fd)
