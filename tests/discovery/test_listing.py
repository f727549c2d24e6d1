"""list_files: files, recursive directories, globs, lists; skipped names; symlinks; fsspec."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.e2e import TOKEN, TokenMemoryFileSystem
from torch_dataloader_utils.discovery.listing import ListedFile, list_files, parse_hive_keys
from torch_dataloader_utils.errors import ConfigError, NoFilesFoundError, PathNotFoundError


def _touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _names(listing: object, root: Path) -> list[str]:
    return [Path(f.path).relative_to(root).as_posix() for f in listing.files]  # type: ignore[attr-defined]


def test_single_file(tmp_path: Path) -> None:
    f = _touch(tmp_path / "a.parquet", b"12345")
    listing = list_files(str(f))
    assert listing.fs.is_local
    assert [x.path for x in listing.files] == [str(f)]
    assert listing.files[0].size == 5
    assert listing.files[0].base is None


def test_directory_is_recursive_and_sorted(tmp_path: Path) -> None:
    for rel in ["b/2.parquet", "a/x=1/1.parquet", "c.parquet", "a/0.parquet"]:
        _touch(tmp_path / rel)
    listing = list_files(str(tmp_path))
    assert _names(listing, tmp_path) == ["a/0.parquet", "a/x=1/1.parquet", "b/2.parquet", "c.parquet"]
    assert all(f.base == str(tmp_path) for f in listing.files)


def test_trailing_slash_and_pathlike(tmp_path: Path) -> None:
    _touch(tmp_path / "d/a.parquet")
    assert _names(list_files(str(tmp_path / "d") + "/"), tmp_path / "d") == ["a.parquet"]
    assert _names(list_files(tmp_path / "d"), tmp_path / "d") == ["a.parquet"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "skipped",
    [
        "_SUCCESS",
        "_metadata",
        "_common_metadata",
        "part-0.parquet.crc",
        ".part-0.parquet.crc",
        ".hidden.parquet",
        ".hidden_dir/a.parquet",
        "_temporary/0/a.parquet",
        "sub/.DS_Store",
        "sub/_SUCCESS",
    ],
)
def test_markers_hidden_and_checksums_are_skipped(tmp_path: Path, skipped: str) -> None:
    _touch(tmp_path / "part-0.parquet")
    _touch(tmp_path / skipped)
    listing = list_files(str(tmp_path))
    assert _names(listing, tmp_path) == ["part-0.parquet"]
    assert listing.skipped == 1


def test_only_skipped_files_is_no_files_error_mentioning_them(tmp_path: Path) -> None:
    _touch(tmp_path / "_SUCCESS")
    _touch(tmp_path / ".x.crc")
    with pytest.raises(NoFilesFoundError, match=r"2 hidden/marker files were skipped") as exc:
        list_files(str(tmp_path))
    assert str(tmp_path) in str(exc.value)


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(NoFilesFoundError, match=r"no data files found under path="):
        list_files(str(tmp_path))


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(PathNotFoundError, match=r"does not exist") as exc:
        list_files(str(tmp_path / "nope"))
    assert isinstance(exc.value, FileNotFoundError)
    assert str(tmp_path / "nope") in str(exc.value)


def test_glob(tmp_path: Path) -> None:
    for rel in ["a/1.parquet", "a/2.parquet", "a/notes.txt", "b/3.parquet"]:
        _touch(tmp_path / rel)
    assert _names(list_files(str(tmp_path / "a" / "*.parquet")), tmp_path) == ["a/1.parquet", "a/2.parquet"]
    assert _names(list_files(str(tmp_path / "**" / "*.parquet")), tmp_path) == [
        "a/1.parquet",
        "a/2.parquet",
        "b/3.parquet",
    ]


def test_glob_matching_directories_lists_them(tmp_path: Path) -> None:
    for rel in ["d1/1.parquet", "d1/_SUCCESS", "d2/sub/2.parquet", "e/3.parquet"]:
        _touch(tmp_path / rel)
    listing = list_files(str(tmp_path / "d*"))
    assert _names(listing, tmp_path) == ["d1/1.parquet", "d2/sub/2.parquet"]
    assert listing.skipped == 1


def test_glob_matches_skip_markers_checksums_and_hidden(tmp_path: Path) -> None:
    for rel in [
        "d/a.parquet",
        "d/_SUCCESS",
        "d/_metadata",
        "d/a.parquet.crc",
        "d/.b.parquet",
        "d/_tmp/c.parquet",
    ]:
        _touch(tmp_path / rel)
    listing = list_files(str(tmp_path / "d" / "*"))
    assert _names(listing, tmp_path) == ["d/a.parquet"]
    assert listing.skipped >= 4
    assert _names(list_files(str(tmp_path / "d" / "**" / "*.parquet")), tmp_path) == ["d/a.parquet"]


def test_glob_with_explicit_hidden_directory_is_honoured(tmp_path: Path) -> None:
    _touch(tmp_path / ".cache" / "a.parquet")
    _touch(tmp_path / ".cache" / "_SUCCESS")
    assert _names(list_files(str(tmp_path / ".cache" / "*")), tmp_path) == [".cache/a.parquet"]


def test_fsspec_glob_skips_markers(tokmem: TokenMemoryFileSystem) -> None:
    for name in ["a.parquet", "_SUCCESS", "a.parquet.crc", ".hidden"]:
        tokmem.pipe_file(f"/bucket/g/{name}", b"1")
    listing = list_files("tokmem://bucket/g/*", {"token": TOKEN})
    assert [f.path for f in listing.files] == ["/bucket/g/a.parquet"]


def test_glob_matching_nothing(tmp_path: Path) -> None:
    _touch(tmp_path / "a.parquet")
    with pytest.raises(NoFilesFoundError):
        list_files(str(tmp_path / "*.orc"))


def test_list_of_paths_deduplicated(tmp_path: Path) -> None:
    a = _touch(tmp_path / "a.parquet")
    _touch(tmp_path / "d/b.parquet")
    listing = list_files([str(a), str(tmp_path / "d"), str(a), str(tmp_path / "*.parquet")])
    assert _names(listing, tmp_path) == ["a.parquet", "d/b.parquet"]


def test_list_with_a_missing_path_fails(tmp_path: Path) -> None:
    a = _touch(tmp_path / "a.parquet")
    with pytest.raises(PathNotFoundError, match="missing"):
        list_files([str(a), str(tmp_path / "missing")])


@pytest.mark.parametrize("bad", [[], 3, [3], None])
def test_bad_path_type(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"path="):
        list_files(bad)  # type: ignore[arg-type]


def test_paths_on_two_filesystems(tmp_path: Path, tokmem: TokenMemoryFileSystem) -> None:
    a = _touch(tmp_path / "a.parquet")
    tokmem.pipe_file("/b/x.parquet", b"x")
    with pytest.raises(ConfigError, match="different filesystems"):
        list_files([str(a), "tokmem://b/x.parquet"], {"token": TOKEN})


def test_symlinked_file_and_directory_are_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _touch(real / "a.parquet", b"aaa")
    _touch(real / "sub/b.parquet", b"bb")
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(real / "a.parquet", data / "link-a.parquet")
    os.symlink(real / "sub", data / "linked-dir")
    os.symlink(tmp_path / "gone.parquet", data / "dangling.parquet")
    listing = list_files(str(data))
    assert _names(listing, data) == ["link-a.parquet", "linked-dir/b.parquet"]
    assert [f.size for f in listing.files] == [3, 2], "sizes are the targets' sizes"
    # A symlink given directly is followed too.
    direct = list_files(str(data / "link-a.parquet"))
    assert direct.files[0].size == 3


def test_symlink_cycle_is_listed_once(tmp_path: Path) -> None:
    _touch(tmp_path / "d/a.parquet")
    os.symlink(tmp_path / "d", tmp_path / "d" / "loop")
    listing = list_files(str(tmp_path / "d"))
    assert _names(listing, tmp_path / "d") == ["a.parquet"]


def test_fsspec_directory_uses_storage_options(tokmem: TokenMemoryFileSystem) -> None:
    tokmem.pipe_file("/bucket/t/k=1/a.parquet", b"123")
    tokmem.pipe_file("/bucket/t/k=2/b.parquet", b"4567")
    tokmem.pipe_file("/bucket/t/_SUCCESS", b"")
    tokmem.pipe_file("/bucket/t/.tmp/c.parquet", b"")
    listing = list_files("tokmem://bucket/t", {"token": TOKEN})
    assert listing.fs.protocol == "tokmem"
    assert [f.path for f in listing.files] == ["/bucket/t/k=1/a.parquet", "/bucket/t/k=2/b.parquet"]
    assert [f.size for f in listing.files] == [3, 4]
    assert listing.skipped == 2
    assert [parse_hive_keys(f) for f in listing.files] == [[("k", "1")], [("k", "2")]]


def test_fsspec_glob_and_file(tokmem: TokenMemoryFileSystem) -> None:
    tokmem.pipe_file("/bucket/t/a.parquet", b"1")
    tokmem.pipe_file("/bucket/t/b.parquet", b"22")
    tokmem.pipe_file("/bucket/t/c.txt", b"")
    opts = {"token": TOKEN}
    assert [f.path for f in list_files("tokmem://bucket/t/*.parquet", opts).files] == [
        "/bucket/t/a.parquet",
        "/bucket/t/b.parquet",
    ]
    assert [f.size for f in list_files("tokmem://bucket/t/b.parquet", opts).files] == [2]


def test_fsspec_missing_path(tokmem: TokenMemoryFileSystem) -> None:
    with pytest.raises(PathNotFoundError, match=r"tokmem://.*nope"):
        list_files("tokmem://bucket/nope", {"token": TOKEN})


def test_fsspec_listing_without_storage_options_fails(tokmem: TokenMemoryFileSystem) -> None:
    tokmem.pipe_file("/bucket/t/a.parquet", b"1")
    with pytest.raises(PermissionError, match="needs storage_options"):
        list_files("tokmem://bucket/t")


def test_parse_hive_keys_decodes_and_maps_default_partition() -> None:
    f = ListedFile("/r/a%3Db=x%2Fy/k=__HIVE_DEFAULT_PARTITION__/plain/f.parquet", 1, None, "/r")
    assert parse_hive_keys(f) == [("a=b", "x/y"), ("k", None)]
    assert parse_hive_keys(ListedFile("/r/k=1/f.parquet", 1, None, None)) == []


def test_glob_matches_use_the_fixed_prefix_as_base(tmp_path: Path) -> None:
    _touch(tmp_path / "t" / "k=1" / "a.parquet")
    _touch(tmp_path / "t" / "k=2" / "sub" / "b.parquet")
    listing = list_files(str(tmp_path / "t" / "k=*"))
    assert [f.base for f in listing.files] == [str(tmp_path / "t")] * 2
    assert [parse_hive_keys(f) for f in listing.files] == [[("k", "1")], [("k", "2")]]


@pytest.mark.slow
def test_missing_s3_credentials_are_named(s3_server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 28, item 5: no credentials got a hint about the endpoint and timeouts."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from torch_dataloader_utils import DiscoveryError, ReadError, create_dataloader
    from torch_dataloader_utils.config import FetchConfig
    from torch_dataloader_utils.storage.fetch import fetch_range
    from torch_dataloader_utils.storage.fs import resolve

    prefix = s3_server.new_prefix()
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3]}), buffer)
    s3_server.fs().pipe(f"{prefix}/a.parquet", buffer.getvalue())
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    options = {"endpoint_url": s3_server.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    with pytest.raises(DiscoveryError) as listing:
        create_dataloader(f"s3://{prefix}/", storage_options=options, num_workers=0, request_timeout=5)
    spec, path = resolve(f"s3://{prefix}/a.parquet", options)
    with pytest.raises(ReadError) as reading:
        fetch_range(spec, path, 0, 4, size=None, config=FetchConfig(retries=0), metadata=True)
    for error in (listing.value, reading.value):
        text = str(error)
        assert "no credentials were found" in text
        assert "pass key and secret" in text
        assert "AWS_ACCESS_KEY_ID" in text
        assert "request_timeout" not in text
