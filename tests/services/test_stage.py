"""`m3fleet stage`, the program the cache's Jobs run, run as that console script against stand-ins of its sources:

* a Hugging Face Hub on loopback (HF_ENDPOINT): a small HTTP server serving a fake repository through the Hub's
  own routes (`/api/models/<repo>/revision/<rev>?blobs=true` with per-file sizes, LFS sha256 and git blob sha1,
  and `/<repo>/resolve/<rev>/<file>` with the headers huggingface_hub reads). The real client
  (`huggingface_hub`) downloads from it. A corrupted file (right size, wrong bytes) must be rejected and the
  copy never marked complete; an unknown revision must fail as a bad source without touching what is staged.
* a directory standing in for the claim, with and without a manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from m3fleet.exitcodes import EXIT_RETRY

BIN = Path(sys.executable).parent
REPO = "MiniMaxAI/MiniMax-M3-tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
MARKER = ".m3fleet-complete.json"
STAGING = ".m3fleet-staging.json"


def git_sha1(content: bytes) -> str:
    return hashlib.sha1(f"blob {len(content)}\0".encode() + content).hexdigest()


@dataclass
class FakeHub:
    """A repository at one commit: files (name -> bytes), which of them are LFS, and what is served instead."""

    files: dict[str, bytes]
    lfs: set[str]
    corrupt: dict[str, bytes] = field(default_factory=dict)  # served instead of the published content
    requests: list[tuple[str, str]] = field(default_factory=list)

    def siblings(self) -> list[dict[str, Any]]:
        out = []
        for name, content in sorted(self.files.items()):
            entry: dict[str, Any] = {"rfilename": name, "size": len(content), "blobId": git_sha1(content)}
            if name in self.lfs:
                sha = hashlib.sha256(content).hexdigest()
                entry["lfs"] = {"size": len(content), "sha256": sha, "pointerSize": 134}
                entry["blobId"] = git_sha1(f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\n".encode())
            out.append(entry)
        return out


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
            self.send_response(code)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _serve(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            hub.requests.append((self.command, path))
            info_prefix = f"/api/models/{REPO}/revision/"
            resolve_prefix = f"/{REPO}/resolve/"
            if path.startswith(info_prefix):
                revision = path.removeprefix(info_prefix)
                if revision != COMMIT:
                    error = {"error": f"Invalid rev id: {revision}"}
                    self._send(404, json.dumps(error).encode(), {"X-Error-Code": "RevisionNotFound"}, head)
                    return
                body = {"id": REPO, "modelId": REPO, "sha": COMMIT, "siblings": hub.siblings()}
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
                return
            if path.startswith(resolve_prefix):
                revision, _, name = path.removeprefix(resolve_prefix).partition("/")
                if revision != COMMIT or name not in hub.files:
                    self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)
                    return
                published = hub.files[name]
                content = hub.corrupt.get(name, published)
                etag = hashlib.sha256(published).hexdigest() if name in hub.lfs else git_sha1(published)
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}
                if name in hub.lfs:
                    headers["X-Linked-Etag"] = f'"{etag}"'
                    headers["X-Linked-Size"] = str(len(published))
                self._send(200, content, headers, head)
                return
            self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

    return Handler


@pytest.fixture()
def hub() -> Iterator[tuple[FakeHub, str]]:
    weights = bytes(range(256)) * 4096  # 1 MiB
    fake = FakeHub(
        files={
            "config.json": b'{"architectures": ["MiniMaxM3SparseForConditionalGeneration"]}\n',
            "tokenizer.json": b'{"version": "1.0"}\n',
            "model-00001-of-00002.safetensors": weights,
            "model-00002-of-00002.safetensors": weights[::-1],
        },
        lfs={"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def stage(tmp_path: Path, *args: str, endpoint: str = "http://127.0.0.1:9") -> tuple[int, str, str]:
    """The console script, as the Job runs it (its environment: HF_ENDPOINT, HF_HOME, no token)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "M3FLEET_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    result = subprocess.run(
        [str(BIN / "m3fleet"), "stage", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    return result.returncode, result.stdout, result.stderr


def hf(tmp_path: Path, dest: Path, endpoint: str, revision: str = COMMIT) -> tuple[int, str, str]:
    return stage(
        tmp_path, "huggingface", "--repo", REPO, "--revision", revision, "--dest", str(dest), endpoint=endpoint
    )


def downloads(fake: FakeHub) -> list[str]:
    return sorted(p.rsplit("/", 1)[1] for method, p in fake.requests if method == "GET" and "/resolve/" in p)


def test_downloads_verifies_and_marks_complete_then_keeps_what_is_verified(
    hub: tuple[FakeHub, str], tmp_path: Path
) -> None:
    fake, endpoint = hub
    dest = tmp_path / "nvme" / "m3"
    code, out, err = hf(tmp_path, dest, endpoint)
    assert code == 0, err
    for name, content in fake.files.items():
        assert (dest / name).read_bytes() == content
    marker = json.loads((dest / MARKER).read_text())
    assert marker["source"] == {"huggingFace": {"repo": REPO, "revision": COMMIT}}
    recorded = {f["path"]: f for f in marker["files"]}
    assert (
        recorded["model-00001-of-00002.safetensors"]["sha256"]
        == hashlib.sha256(fake.files["model-00001-of-00002.safetensors"]).hexdigest()
    )
    assert recorded["config.json"]["gitSha1"] == git_sha1(fake.files["config.json"])
    assert downloads(fake) == sorted(fake.files)
    assert "4 files" in out and "verified" in (tmp_path / "termination-log").read_text()

    # The staging record lists every file written here, and Hugging Face's download cache as its own.
    record = json.loads((dest / STAGING).read_text())
    assert record["files"] == sorted(fake.files) and ".cache/huggingface" in record["trees"]

    # Run again (the Job retried, or re-created after its record was deleted): nothing is downloaded again,
    # and a file an earlier run wrote that the repo no longer has is removed.
    (dest / "old-shard.safetensors").write_bytes(b"x")
    (dest / STAGING).write_text(json.dumps({**record, "files": [*record["files"], "old-shard.safetensors"]}))
    fake.requests.clear()
    code, _, err = hf(tmp_path, dest, endpoint)
    assert code == 0, err
    assert downloads(fake) == []
    assert not (dest / "old-shard.safetensors").exists()
    assert json.loads((dest / STAGING).read_text())["files"] == sorted(fake.files)


def test_a_corrupted_file_is_rejected_and_the_copy_never_marked_complete(
    hub: tuple[FakeHub, str], tmp_path: Path
) -> None:
    fake, endpoint = hub
    name = "model-00002-of-00002.safetensors"
    good = fake.files[name]
    fake.corrupt[name] = bytes([good[0] ^ 0xFF]) + good[1:]  # same size: only the published sha256 can tell
    fake.corrupt["config.json"] = fake.files["config.json"].replace(b"M3", b"M4")  # a non-LFS file: git blob sha1
    dest = tmp_path / "nvme" / "m3"
    code, _, err = hf(tmp_path, dest, endpoint)
    assert code == EXIT_RETRY, err
    assert "2 of 4 files failed" in err and name in err and "sha256" in err
    assert "config.json: git blob sha1" in err and not (dest / "config.json").exists()
    assert not (dest / MARKER).exists()
    assert not (dest / name).exists()  # never left behind looking like the real file
    assert (dest / "model-00001-of-00002.safetensors").read_bytes() == fake.files["model-00001-of-00002.safetensors"]
    assert name in (tmp_path / "termination-log").read_text()

    # The Hub serves the right bytes again: the retry fetches only the rejected file and completes.
    fake.corrupt.clear()
    fake.requests.clear()
    code, _, err = hf(tmp_path, dest, endpoint)
    assert code == 0, err
    assert downloads(fake) == ["config.json", name]
    assert (dest / name).read_bytes() == good and (dest / MARKER).exists()


def test_an_unknown_revision_is_a_bad_source_and_leaves_the_staged_copy_alone(
    hub: tuple[FakeHub, str], tmp_path: Path
) -> None:
    _, endpoint = hub
    dest = tmp_path / "nvme" / "m3"
    assert hf(tmp_path, dest, endpoint)[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    code, _, err = hf(tmp_path, dest, endpoint, revision=OTHER)
    assert code == 3, err
    assert f"revision {OTHER} does not exist in {REPO}" in err
    assert f"revision {OTHER} does not exist" in (tmp_path / "termination-log").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before  # marker and files untouched


def test_copy_from_a_claim_directory_checks_the_manifest(tmp_path: Path) -> None:
    source = tmp_path / "pvc" / "MiniMax-M3"
    (source / "sub").mkdir(parents=True)
    files = {"config.json": b"{}\n", "sub/model.safetensors": os.urandom(300_000)}
    for name, content in files.items():
        (source / name).write_bytes(content)
    dest = tmp_path / "nvme" / "m3"

    # Without a manifest: sizes.
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    assert code == 0, err
    assert all((dest / n).read_bytes() == c for n, c in files.items()) and (dest / MARKER).exists()

    # With a manifest whose hash for one file is not what the claim holds: rejected, not complete.
    manifest = [{"path": n, "size": len(c), "sha256": hashlib.sha256(c).hexdigest()} for n, c in sorted(files.items())]
    manifest[1]["sha256"] = "0" * 64
    (source / "m3fleet-manifest.json").write_text(json.dumps({"files": manifest}))
    (dest / "sub/model.safetensors").write_bytes(b"partial")  # a copy interrupted earlier
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    assert code == EXIT_RETRY and "sub/model.safetensors" in err and "sha256" in err
    assert not (dest / MARKER).exists() and not (dest / "sub/model.safetensors").exists()

    # The right manifest: copied again and complete; the manifest itself is not part of the checkpoint.
    manifest[1]["sha256"] = hashlib.sha256(files["sub/model.safetensors"]).hexdigest()
    (source / "m3fleet-manifest.json").write_text(json.dumps({"files": manifest}))
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    assert code == 0, err
    assert (dest / "sub/model.safetensors").read_bytes() == files["sub/model.safetensors"]

    # A missing source directory is a bad source (exit 3), and the copy in place stays complete.
    code, _, err = stage(tmp_path, "copy", "--from", str(tmp_path / "nowhere"), "--dest", str(dest))
    assert code == 3 and "does not exist" in err
    assert (dest / MARKER).exists()

    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest))
    assert code == 0 and "removed the 2 files m3fleet wrote and the empty directory" in out, out
    assert not dest.exists()


def test_copy_from_another_source_never_trusts_a_size_and_a_bad_manifest_touches_nothing(tmp_path: Path) -> None:
    """A fine-tune's shards have the sizes of the base model's: from another source, a file only a size describes
    is copied again. A manifest naming a file the source lacks, or a path outside the checkpoint, is a bad source
    (exit 3) found before anything staged is touched."""
    base, tuned = tmp_path / "pvc" / "base", tmp_path / "pvc" / "tuned"
    for root, fill in ((base, b"a"), (tuned, b"b")):
        root.mkdir(parents=True)
        (root / "model.safetensors").write_bytes(fill * 4096)
    dest = tmp_path / "nvme" / "m3"
    assert stage(tmp_path, "copy", "--from", str(base), "--dest", str(dest))[0] == 0
    code, _, err = stage(tmp_path, "copy", "--from", str(tuned), "--dest", str(dest))
    assert code == 0, err
    assert (dest / "model.safetensors").read_bytes() == b"b" * 4096

    complete = (dest / MARKER).read_text()
    for entry in ({"path": "gone.safetensors", "size": 1}, {"path": "../../escape", "size": 1}):
        (tuned / "m3fleet-manifest.json").write_text(json.dumps({"files": [entry]}))
        code, _, err = stage(tmp_path, "copy", "--from", str(tuned), "--dest", str(dest))
        assert code == 3, err
        assert (dest / MARKER).read_text() == complete  # the copy staged before is intact and still complete
        assert (dest / "model.safetensors").read_bytes() == b"b" * 4096
    assert not (tmp_path / "nvme" / "escape").exists()


def foreign_tree(root: Path) -> dict[str, bytes]:
    """What other people keep in a directory: another team's weights, a data set, a notes file."""
    files = {
        "team-b/llama/model-00001.safetensors": os.urandom(4096),
        "datasets/eval.jsonl": b'{"q": 1}\n',
        "NOTES.md": b"do not delete\n",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return files


def intact(root: Path, files: dict[str, bytes]) -> bool:
    return all((root / name).read_bytes() == content for name, content in files.items())


def test_a_directory_holding_files_it_did_not_write_is_never_staged_into(
    hub: tuple[FakeHub, str], tmp_path: Path
) -> None:
    """Another team's weights, a data set and a notes file: the real `m3fleet stage`, from the Hub or a claim, stops
    before writing a byte (exit 3, the termination log naming the directory and the first foreign file), and
    `stage clean` leaves them too."""
    fake, endpoint = hub
    dest = tmp_path / "raid"
    theirs = foreign_tree(dest)
    code, _, err = hf(tmp_path, dest, endpoint)
    assert code == 3, err
    said = (tmp_path / "termination-log").read_text()
    assert f'{dest} holds 3 file(s) m3fleet did not write, first: "NOTES.md"' in said and "fix:" in said, said
    assert downloads(fake) == [] and intact(dest, theirs)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(theirs)

    source = tmp_path / "pvc"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"m" * 1000)
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    assert code == 3 and "NOTES.md" in err and intact(dest, theirs) and not (dest / STAGING).exists()

    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest))
    assert code == 0 and "removed the 0 files m3fleet wrote" in out and intact(dest, theirs), out


def test_files_added_beside_a_staged_copy_stop_staging_and_survive_its_cleanup(
    hub: tuple[FakeHub, str], tmp_path: Path
) -> None:
    """A directory m3fleet staged, then someone else's files put in it: a new run stops at them (exit 3), and the
    cleanup removes only what the record lists, leaving their files and so the directory."""
    fake, endpoint = hub
    dest = tmp_path / "nvme" / "m3fleet" / "m3"
    assert hf(tmp_path, dest, endpoint)[0] == 0
    theirs = foreign_tree(dest)
    code, _, err = hf(tmp_path, dest, endpoint)
    assert code == 3 and 'first: "NOTES.md"' in err and intact(dest, theirs)
    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest))
    assert code == 0 and f"removed the {len(fake.files)} files m3fleet wrote" in out, out
    assert intact(dest, theirs) and not any((dest / name).exists() for name in fake.files)
    assert not (dest / ".cache").exists() and not (dest / STAGING).exists() and not (dest / MARKER).exists()


def test_an_interrupted_copy_is_recorded_as_it_writes_and_cleaned_from_the_record(tmp_path: Path) -> None:
    """The record is saved before each file is written: a run stopped half way (its source gone mid-copy, here a
    file the source cannot read) leaves a record of what it wrote; the next run resumes, and a cleanup of the stopped
    run removes exactly that."""
    source = tmp_path / "pvc"
    source.mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        (source / name).write_bytes(name.encode() * 100)
    (source / "b.safetensors").chmod(0)
    dest = tmp_path / "nvme" / "m3fleet" / "m3"
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    if os.geteuid() != 0:  # root reads a file of mode 0: the copy completes and there is nothing to resume
        assert code == 1 and "b.safetensors" in err, err
        assert json.loads((dest / STAGING).read_text())["files"] == ["a.safetensors", "b.safetensors"]
        assert not (dest / MARKER).exists()
    (source / "b.safetensors").chmod(0o644)
    (dest / "NOTES.md").write_text("mine")
    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest))
    assert code == 0 and (dest / "NOTES.md").read_text() == "mine" and not (dest / "a.safetensors").exists(), out


def test_a_record_naming_paths_outside_the_directory_reaches_nothing(tmp_path: Path) -> None:
    """A staging record edited by hand to name `../` or absolute paths: `stage clean` removes nothing outside DIR,
    and staging treats the file it named as someone else's."""
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    dest = tmp_path / "nvme" / "m3fleet" / "m3"
    dest.mkdir(parents=True)
    (dest / "x").write_text("x")
    names = ["../../../precious.txt", str(outside), "x/../../../../precious.txt"]
    (dest / STAGING).write_text(json.dumps({"source": None, "files": names, "trees": ["../.."]}))
    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest))
    assert code == 0 and outside.read_text() == "keep" and (dest / "x").read_text() == "x", out
    (dest / STAGING).write_text(json.dumps({"source": None, "files": names, "trees": []}))
    source = tmp_path / "claim"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"m")
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest))
    assert code == 3 and 'first: "x"' in err and outside.read_text() == "keep", err


def test_another_caches_record_is_not_its_own(tmp_path: Path) -> None:
    """Two caches on one directory (one moved onto the other's): the second's run stops at the first's files, and
    its cleanup removes none of them; the first's own cleanup does."""
    source = tmp_path / "claim"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"m" * 100)
    dest = tmp_path / "nvme" / "m3fleet" / "shared"
    assert stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest), "--owner", "team/a")[0] == 0
    assert json.loads((dest / STAGING).read_text())["owner"] == "team/a"
    code, _, err = stage(tmp_path, "copy", "--from", str(source), "--dest", str(dest), "--owner", "team/b")
    assert code == 3 and "the staging record there is cache team/a's" in err, err
    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest), "--owner", "team/b")
    assert code == 0 and "nothing removed" in out and (dest / "model.safetensors").exists(), out
    code, out, _ = stage(tmp_path, "clean", "--dest", str(dest), "--owner", "team/a")
    assert code == 0 and not dest.exists(), out
