"""The `MiniMaxM3ModelCache` custom resource (`m3fleet.dev/v1alpha1`): a checkpoint staged on a pool's nodes.

Shaped after what platform teams run today: KServe's LocalModelCache (a checkpoint + node groups), OME's
model agent (download to every node of a pool, label the nodes that hold it), NVIDIA's NIMCache (a source
with a pinned revision and a token Secret, or a PVC) and KubeAI's cache profiles (where on the node). One
resource says which checkpoint (a Hugging Face repo at a pinned commit with a token Secret, or a PVC), which
nodes (an accelerator pool plus labels and tolerations), where on each node (an absolute node-local path,
e.g. NVMe), whether to pre-pull the engine images of the deployments that use it, and whether removing it
also removes the files. The operator stages the copy with a Job per node (`m3fleet stage`, the same program
this package ships), labels the nodes whose copy is complete and verified, and reports per-node progress.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from m3fleet.api.children import image_rules, label_map_rules, toleration_schema
from m3fleet.api.conditions import CACHE, conditions_description
from m3fleet.api.models import (
    API_VERSION,
    GROUP,
    Accelerator,
    CamelModel,
    Condition,
    ObjectMeta,
    PvcSource,
    SecretKeyRef,
    cel,
    invalid,
)

CACHE_KIND = "MiniMaxM3ModelCache"
CACHE_PLURAL = "minimaxm3modelcaches"
CACHE_SINGULAR = "minimaxm3modelcache"
CACHE_SHORT_NAMES = ("m3cache",)

# Node labels: `cache.m3fleet.dev/<namespace>.<name>=ready` on each node holding a complete, verified copy.
# The key's name part is at most 63 characters (the apiserver's rule), so namespace + "." + name must fit.
NODE_LABEL_PREFIX = "cache.m3fleet.dev/"
NODE_LABEL_READY = "ready"
LABEL_NAME_MAX = 63
SOURCE_FIX = "set one of them: huggingFace (the Hub) or pvc (a volume)"  # one wording, in the CRD and the model
REVISION_PATTERN = "^[0-9a-f]{40}$"
REPO_PATTERN = "^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$"
# An absolute path with no empty, "." or ".." segments and no trailing slash; never "/" itself.
PATH_PATTERN = r"^(/[A-Za-z0-9_@+=,:-][A-Za-z0-9_.@+=,:-]*)+$"
PATH_PROBLEM = (
    "is not an absolute node-local directory: it must start with '/', name at least one directory, and have no "
    "'.', '..' or empty segments and no trailing '/'"
)
PATH_FIX = "give an absolute path on the node's local disk, e.g. /mnt/nvme/m3fleet/minimax-m3"
REVISION_PROBLEM = "is not a pinned commit: a branch or tag can move, and a copy staged from it could not be verified"
REVISION_FIX = (
    "give the full 40-character commit hash (the repo's 'Files and versions' page, or `hf api models/<repo>` -> sha)"
)
_PATH_RE = re.compile(PATH_PATTERN)
FORBIDDEN_PATHS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/root", "/sbin", "/sys", "/usr", "/var")


# Where caches may write, and what may write there: the cluster admin's choice (chart values
# modelCache.allowedPathPrefixes and modelCache.allowedStagerImages), read by the operator at startup.
DEFAULT_PATH_PREFIXES = ("/var/lib/m3fleet", "/mnt/*/m3fleet")  # '*': any one directory (a disk's mount point)
PATH_PREFIXES_CHART_VALUE = "modelCache.allowedPathPrefixes"
STAGER_IMAGES_CHART_VALUE = "modelCache.allowedStagerImages"
FOREIGN_FILES = "file(s) m3fleet did not write, first: "  # `m3fleet stage` says it; the cache's condition repeats it
_FOREIGN_RE = re.compile(re.escape(FOREIGN_FILES) + r'("(?:[^"\\]|\\.)*")')


def foreign_files_message(directory: str, first: str, count: int) -> str:
    """`directory` holds `count` files no staging record lists; `first` is quoted so the controller can read it back."""
    return f"{directory} holds {count} {FOREIGN_FILES}{json.dumps(first)}"


def foreign_file(message: str) -> str | None:
    """The first foreign file a staging program's message names (None: the message is about something else)."""
    match = _FOREIGN_RE.search(message)
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None


def _under(path: str, prefix: str) -> bool:
    """Whether `path` is strictly inside `prefix`, whose '*' segments match any one directory name."""
    parts, wanted = path.strip("/").split("/"), prefix.strip("/").split("/")
    return len(parts) > len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=False))


def prefix_problem(prefix: str) -> str | None:
    """Why an allowed path prefix (an admin's setting) is unusable; None when it is fine."""
    plain = prefix.replace("*", "x")
    if not _PATH_RE.fullmatch(plain) or any(seg in (".", "..") for seg in plain.split("/")):
        return f"{prefix!r} {PATH_PROBLEM}"
    if prefix in FORBIDDEN_PATHS:
        return f"{prefix!r} is a system directory: caches under it could overwrite the node's own files"
    return None


def path_not_allowed(path: str, prefixes: Sequence[str]) -> str | None:
    """spec.path outside every prefix the admin allows: the condition's message (None: allowed)."""
    if any(_under(path, prefix) for prefix in prefixes):
        return None
    allowed = ", ".join(prefixes) or "none"
    example = prefixes[0].replace("*", "nvme") if prefixes else "/var/lib/m3fleet"
    return (
        f"spec.path: {path} is not inside a directory the cluster admin allows for model caches ({allowed}); "
        f"nothing is staged or deleted there; fix: choose a directory inside one of them, e.g. {example}/<name>, "
        f"or ask the admin to allow it (chart value {PATH_PREFIXES_CHART_VALUE})"
    )


def allowed_prefixes(setting: str | None) -> tuple[str, ...]:
    """The admin's allowed path prefixes from a comma-separated setting (None or empty: the defaults). Raises
    ValueError naming the first unusable one."""
    prefixes = tuple(p.strip() for p in (setting or "").split(",") if p.strip()) or DEFAULT_PATH_PREFIXES
    for prefix in prefixes:
        if (problem := prefix_problem(prefix)) is not None:
            raise ValueError(
                f"{PATH_PREFIXES_CHART_VALUE}: {problem}; fix: give absolute directories, e.g. /mnt/*/m3fleet"
            )
    return prefixes


def allowed_image_repositories(setting: str | None, operator_image: str) -> tuple[str, ...]:
    """The admin's allowed stager image repositories from a comma-separated setting (None or empty: the operator
    image's own repository). Raises ValueError on an entry that is not a bare repository."""
    repositories = tuple(r.strip() for r in (setting or "").split(",") if r.strip())
    for repository in repositories:
        if image_repository(repository) != repository or " " in repository:
            raise ValueError(
                f"{STAGER_IMAGES_CHART_VALUE}: {repository!r} is not a bare image repository; fix: drop its tag or "
                "digest, e.g. ghcr.io/m3fleet/operator"
            )
    return repositories or (image_repository(operator_image),)


def image_repository(image: str) -> str:
    """The repository of an image reference: without its digest and tag."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def stager_image_not_allowed(image: str, allowed: Sequence[str]) -> str | None:
    """spec.stagerImage whose repository is not one the admin allows: the condition's message (None: allowed; empty
    means the operator's own image, always allowed)."""
    if not image or image_repository(image) in allowed:
        return None
    return (
        f"spec.stagerImage: {image} is not an image the cluster admin allows to write node directories (allowed "
        f"repositories: {', '.join(allowed) or 'none'}); nothing is staged or deleted with it; fix: leave it empty "
        f"(the operator's own image) or ask the admin to allow it (chart value {STAGER_IMAGES_CHART_VALUE})"
    )


def node_label_key(namespace: str, name: str) -> str:
    return f"{NODE_LABEL_PREFIX}{namespace}.{name}"


def label_key_problem(namespace: str, name: str) -> str | None:
    size = len(namespace) + 1 + len(name)
    if size > LABEL_NAME_MAX:
        return (
            f"namespace and name together ({namespace}.{name}, {size} characters) are longer than the "
            f"{LABEL_NAME_MAX} characters of the node label {NODE_LABEL_PREFIX}<namespace>.<name>; use a shorter name"
        )
    return None


class HuggingFaceCacheSource(CamelModel):
    repo: str = Field(
        max_length=200,
        pattern=REPO_PATTERN,
        description="Hugging Face model repo, e.g. MiniMaxAI/MiniMax-M3.",
    )
    revision: str = Field(
        max_length=40,
        description="The commit to stage: its full 40-character hash (a branch or tag can move).",
        json_schema_extra={"pattern": REVISION_PATTERN},
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret (in this namespace) with a Hugging Face token, given to the staging Job as HF_TOKEN "
        "via secretKeyRef; the operator checks that it exists (metadata only) and never reads it.",
    )
    endpoint: str = Field(
        default="",
        max_length=512,
        description="Hub endpoint (HF_ENDPOINT), e.g. an in-cluster mirror; empty means huggingface.co.",
    )

    @field_validator("revision")
    @classmethod
    def _pinned(cls, value: str) -> str:
        if not re.fullmatch(REVISION_PATTERN.strip("^$"), value):
            raise invalid(REVISION_PROBLEM, REVISION_FIX)
        return value


class CacheSource(CamelModel):
    """Where the checkpoint comes from: exactly one of `huggingFace` or `pvc`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.pvc) != has(self.huggingFace)",
                    f"source needs exactly one of huggingFace and pvc; fix: {SOURCE_FIX}",
                )
            ]
        }
    )
    hugging_face: HuggingFaceCacheSource | None = Field(default=None, description="Download from Hugging Face.")
    pvc: PvcSource | None = Field(
        default=None,
        description="Copy from a claim (ReadOnlyMany). Verified against m3fleet-manifest.json in its directory "
        "(path, size and sha256 per file) when present, else against the source files' sizes.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> CacheSource:
        if (self.pvc is None) == (self.hugging_face is None):
            has = "has both pvc and huggingFace" if self.pvc else "has neither pvc nor huggingFace"
            raise invalid(has, SOURCE_FIX)
        return self


class CacheNodes(CamelModel):
    accelerator: Accelerator = Field(description="The pool: every node with this accelerator's labels.")
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Extra node labels that narrow the pool (all must match).",
        json_schema_extra=label_map_rules("nodeSelector"),
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="corev1 Tolerations for the staging Jobs and the image pre-pull pods (the accelerator's own "
        "GPU taint is always tolerated).",
        json_schema_extra={"items": toleration_schema()},
    )


class MiniMaxM3ModelCacheSpec(CamelModel):
    source: CacheSource = Field(description="Which checkpoint, and where it comes from.")
    nodes: CacheNodes = Field(description="Which nodes get a copy.")
    path: str = Field(
        max_length=1024,
        description="Absolute directory on each node's local disk (e.g. NVMe) that holds the copy; engine pods "
        "mount it read-only. It must be inside a prefix the cluster admin allows (chart value "
        "modelCache.allowedPathPrefixes; by default /var/lib/m3fleet and /mnt/*/m3fleet), and empty or holding only "
        "what m3fleet staged there.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"self.matches('{PATH_PATTERN}')", f"path {PATH_PROBLEM}; fix: {PATH_FIX}"),
                cel(
                    f"!({list(FORBIDDEN_PATHS)}.exists(p, self == p))",
                    f"path is a system directory; fix: {PATH_FIX}",
                ),
            ]
        },
    )
    pre_pull_images: bool = Field(
        default=True,
        description="Pull the engine images of the deployments that use this cache onto its nodes ahead of time "
        "(a DaemonSet owned by the cache).",
    )
    delete_files_on_removal: bool = Field(
        default=False,
        description="When the cache is deleted, also delete the files m3fleet staged on each node (those its "
        "staging record lists; a cleanup Job per node); node labels are always removed. After a change of path, "
        "those in the old directory on each node once the new copy is complete there.",
    )
    stager_image: str = Field(
        default="",
        max_length=512,
        description="Image that runs `m3fleet stage` in the Jobs; empty means the operator's own image. Its "
        "repository must be one the cluster admin allows (chart value modelCache.allowedStagerImages).",
        json_schema_extra=image_rules("stagerImage"),
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not _PATH_RE.fullmatch(value) or any(seg in (".", "..") for seg in value.split("/")):
            raise invalid(PATH_PROBLEM, PATH_FIX)
        if value in FORBIDDEN_PATHS:
            raise invalid("is a system directory", PATH_FIX)
        return value

    def content_digest(self) -> str:
        """What a node's copy is a copy of (source and path): a change means every node stages again."""
        source = self.source.model_dump(by_alias=True, mode="json", exclude={"hugging_face": {"token_secret_ref"}})
        text = repr(sorted(source.items())) + "|" + self.path
        return hashlib.sha256(text.encode()).hexdigest()[:12]


class CacheNodeStatus(CamelModel):
    name: str = Field(max_length=253, description="Node.")
    phase: str = Field(
        description="Pending (Job not started), Staging, Ready (complete and verified), Failed (retried), Removing.",
    )
    attempts: int = Field(default=0, description="Staging Jobs run for the current content.")
    message: str = Field(default="", max_length=4096, description="The last failure, or what is under way.")
    left_behind: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Directories a change of path left on the node whose staging was stopped before any record "
        "of it completed; emptied with deleteFilesOnRemoval once the new copy is complete.",
    )


class MiniMaxM3ModelCacheStatus(CamelModel):
    observed_generation: int = Field(default=0, description="Generation the status reflects.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description=conditions_description(CACHE, "docs/reference/minimaxm3modelcache.md"),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    nodes_total: int = Field(default=0, description="Nodes selected.")
    nodes_ready: int = Field(default=0, description="Nodes holding a complete, verified copy.")
    nodes_summary: str = Field(default="", description="'ready/total', for kubectl get.")
    node_label: str = Field(default="", description="The label on nodes holding a verified copy (=ready).")
    content: str = Field(default="", description="Digest of what is staged (source and path).")
    nodes: list[CacheNodeStatus] = Field(
        default_factory=list,
        max_length=4096,
        description="Per node: its phase, attempts and last message.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    images: list[str] = Field(default_factory=list, max_length=64, description="Engine images pre-pulled.")


class MiniMaxM3ModelCache(CamelModel):
    api_version: str = Field(default=API_VERSION, description=f"{GROUP}/v1alpha1.")
    kind: str = Field(default=CACHE_KIND, description=CACHE_KIND)
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: MiniMaxM3ModelCacheSpec = Field(description="What to stage where.")
    status: MiniMaxM3ModelCacheStatus | None = Field(default=None, description="What the operator observed.")
