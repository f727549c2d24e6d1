"""The library's S3 clients parse botocore's data files once per process, and forked workers inherit them."""

from __future__ import annotations

import multiprocessing
from typing import Any

from botocore.loaders import JSONFileLoader

from tests.fixtures.s3 import S3Server
from torch_dataloader_utils.storage.fs import FileSystemSpec, resolve


def _loader_of(spec: FileSystemSpec) -> Any:
    return spec.fsspec().session.get_component("data_loader")


def test_the_librarys_clients_share_one_loader_and_a_users_client_keeps_its_own(s3_server: S3Server) -> None:
    prefix = s3_server.new_prefix()
    first, _ = resolve(f"s3://{prefix}", s3_server.options())
    other, _ = resolve(f"s3://{prefix}", {**s3_server.options(), "default_block_size": 1 << 20})
    assert first.fsspec() is not other.fsspec()  # two clients (options differ)
    assert _loader_of(first) is _loader_of(other)
    users = s3_server.fs()  # a user's own s3fs object
    users.pipe_file(f"{prefix}/a.bin", b"x")
    assert users.session.get_component("data_loader") is not _loader_of(first)


def _child(options: dict[str, Any], prefix: str, out: Any) -> None:
    loaded: list[str] = []
    original = JSONFileLoader.load_file

    def counting(self: JSONFileLoader, file_path: str) -> Any:
        loaded.append(file_path)
        return original(self, file_path)

    JSONFileLoader.load_file = counting  # type: ignore[method-assign]
    spec, root = resolve(f"s3://{prefix}", options)
    names = sorted(spec.call("ls", root, detail=False))
    out.put((loaded, names))


def test_a_forked_worker_builds_its_client_without_parsing_botocores_files_again(s3_server: S3Server) -> None:
    prefix = s3_server.new_prefix()
    s3_server.fs().pipe_file(f"{prefix}/a.bin", b"x")
    spec, root = resolve(f"s3://{prefix}", s3_server.options())
    spec.call("ls", root)  # the parent's client parsed them
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child, args=(s3_server.options(), prefix, out))
    child.start()
    loaded, names = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert [n.rsplit("/", 1)[-1] for n in names] == ["a.bin"]  # the child's own client works
    assert loaded == []  # on the previous code: the S3 model, endpoint rules, partitions...
