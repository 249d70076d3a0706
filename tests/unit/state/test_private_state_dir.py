"""Local state is private, as an SSH key is: directories 0700, files 0600, a directory another
user owns or may write refused, and no lock, checkpoint or temp file opened through a symlink."""

from __future__ import annotations

import os
import stat

import pytest

from streamloop.errors import ConfigError, StateDirectoryError
from streamloop.records import TopicPartition
from streamloop.state import checkpoint
from streamloop.state.bytes_stores import RocksDBBytesStore
from streamloop.state.directory import LOCK_FILE, StateDirectoryLock

OFFSETS = {TopicPartition("app-store-changelog", 0): 42}


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def state_dir(tmp_path) -> str:
    return str(tmp_path / "state")


def test_the_lock_creates_state_dir_and_application_dir_0700_and_its_file_0600(state_dir: str) -> None:
    lock = StateDirectoryLock(state_dir, "app")
    lock.acquire()
    try:
        assert mode(state_dir) == 0o700
        assert mode(os.path.join(state_dir, "app")) == 0o700
        assert mode(os.path.join(state_dir, "app", LOCK_FILE)) == 0o600
    finally:
        lock.release()


@pytest.mark.parametrize("unsafe", [0o770, 0o707, 0o777, 0o1777])
def test_a_state_dir_writable_by_group_or_others_is_refused_with_the_fix(state_dir: str, unsafe: int) -> None:
    os.mkdir(state_dir)
    os.chmod(state_dir, unsafe)
    with pytest.raises(StateDirectoryError) as caught:
        StateDirectoryLock(state_dir, "app").acquire()
    error = caught.value
    assert isinstance(error, ConfigError) and error.key == "state.dir" and error.path == state_dir
    assert "writable by group or others" in str(error)
    assert f"chmod 700 {state_dir}" in str(error) and "another state.dir" in str(error)
    assert not os.path.exists(os.path.join(state_dir, "app"))  # nothing created in it


def test_an_application_dir_writable_by_others_is_refused(state_dir: str) -> None:
    os.makedirs(os.path.join(state_dir, "app"), mode=0o700)
    os.chmod(state_dir, 0o700)
    os.chmod(os.path.join(state_dir, "app"), 0o777)
    with pytest.raises(StateDirectoryError, match="writable by group or others"):
        StateDirectoryLock(state_dir, "app").acquire()


def test_a_state_dir_of_another_user_is_refused(state_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    os.mkdir(state_dir, 0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    expected = f"belongs to another user \\(uid {me}, this process runs as uid {me + 1}\\)"
    with pytest.raises(StateDirectoryError, match=expected):
        StateDirectoryLock(state_dir, "app").acquire()


def test_a_private_existing_state_dir_is_accepted(state_dir: str) -> None:
    os.mkdir(state_dir, 0o700)
    lock = StateDirectoryLock(state_dir, "app")
    lock.acquire()
    lock.release()


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(state_dir: str, tmp_path) -> None:
    app = os.path.join(state_dir, "app")
    os.makedirs(app, mode=0o700)
    os.chmod(state_dir, 0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    before = mode(str(victim))
    os.symlink(victim, os.path.join(app, LOCK_FILE))
    with pytest.raises(StateDirectoryError, match="symbolic link"):
        StateDirectoryLock(state_dir, "app").acquire()
    assert victim.read_text() == "keep me"
    assert mode(str(victim)) == before


def test_checkpoint_file_is_0600_in_a_0700_task_dir(state_dir: str) -> None:
    task_dir = os.path.join(state_dir, "app", "0_0")
    checkpoint.write(task_dir, OFFSETS)
    assert mode(os.path.join(task_dir, checkpoint.FILE_NAME)) == 0o600
    for directory in (state_dir, os.path.dirname(task_dir), task_dir):
        assert mode(directory) == 0o700
    assert checkpoint.read(task_dir) == OFFSETS


def test_checkpoint_write_does_not_follow_a_planted_temp_symlink(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    task_dir = tmp_path / "task"
    task_dir.mkdir(mode=0o700)
    os.symlink(victim, task_dir / (checkpoint.FILE_NAME + ".tmp"))
    checkpoint.write(str(task_dir), OFFSETS)
    assert victim.read_text() == "keep me"
    assert checkpoint.read(str(task_dir)) == OFFSETS
    assert not os.path.islink(task_dir / checkpoint.FILE_NAME)


def test_checkpoint_write_replaces_a_symlink_instead_of_writing_through_it(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    task_dir = tmp_path / "task"
    task_dir.mkdir(mode=0o700)
    os.symlink(victim, task_dir / checkpoint.FILE_NAME)
    checkpoint.write(str(task_dir), OFFSETS)
    assert victim.read_text() == "keep me"
    assert not os.path.islink(task_dir / checkpoint.FILE_NAME)


def test_a_checkpoint_that_is_a_symlink_is_not_read(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    checkpoint.write(str(elsewhere), OFFSETS)
    task_dir = tmp_path / "task"
    task_dir.mkdir(mode=0o700)
    os.symlink(elsewhere / checkpoint.FILE_NAME, task_dir / checkpoint.FILE_NAME)
    assert checkpoint.read(str(task_dir)) == {}


def test_rocksdb_store_directory_is_0700_and_its_files_unreachable_by_others(state_dir: str) -> None:
    """RocksDB (rocksdict) creates its files itself with its own mode (0644 less the umask): the
    guarantee is the directories, 0700 from state.dir down, so no other user can reach them."""
    store_dir = os.path.join(state_dir, "app", "0_0", "counts")
    store = RocksDBBytesStore("counts", store_dir)
    store.open()
    try:
        store.put(b"k", b"v")
        store.flush()
    finally:
        store.close()
    for directory in (state_dir, os.path.join(state_dir, "app"), os.path.dirname(store_dir), store_dir):
        assert mode(directory) == 0o700, directory
        assert os.stat(directory).st_uid == os.geteuid()
    files = os.listdir(store_dir)
    assert files, "RocksDB wrote no file"
    for name in files:
        path = os.path.join(store_dir, name)
        assert os.lstat(path).st_uid == os.geteuid()
        assert mode(path) & 0o022 == 0, f"{name} is writable by group or others"
