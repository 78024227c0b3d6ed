"""`spec.engine`: the serving engine, its image, extra arguments, environment (corev1 EnvVar, typed) and API keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import CamelModel, EngineName, MoeBackend
from m3fleet.api.rules import cel
from m3fleet.api.spec_model import SecretKeyRef


class ObjectKeySelector(CamelModel):
    """corev1 SecretKeySelector / ConfigMapKeySelector."""

    name: str = Field(
        max_length=253,
        description="Secret or ConfigMap in the resource's namespace.",
        json_schema_extra=children.name_rules("name"),
    )
    key: str = Field(max_length=253, description="Key inside it.", json_schema_extra=children.key_rules("key"))
    optional: bool | None = Field(default=None, description="Start the pod even when the key is missing.")


FIELD_PATH_PATTERN = (  # backslashes doubled: the pattern sits in a CEL string literal
    r"^(metadata[.](name|namespace|uid)|metadata[.](labels|annotations)\\[.+\\]"
    r"|spec[.](nodeName|serviceAccountName)|status[.](hostIP|hostIPs|podIP|podIPs))$"
)
RESOURCE_FIELD_PATTERN = "^(limits|requests)[.](cpu|memory|ephemeral-storage|hugepages-[-a-zA-Z0-9]+)$"


class ObjectFieldSelector(CamelModel):
    api_version: str | None = Field(default=None, max_length=64, description="v1.")
    field_path: str = Field(
        max_length=256,
        description="A pod field the kubelet can expose (metadata.name, metadata.labels['k'], status.podIP, ...).",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matches('{FIELD_PATH_PATTERN}')",
                    "fieldPath is not a pod field the kubelet exposes to env; fix: use metadata.name, "
                    "metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], "
                    "spec.nodeName, spec.serviceAccountName, status.hostIP(s) or status.podIP(s)",
                )
            ]
        },
    )


class ResourceFieldSelector(CamelModel):
    container_name: str | None = Field(default=None, max_length=63, description="The engine container (default).")
    resource: str = Field(
        max_length=128,
        pattern=RESOURCE_FIELD_PATTERN,
        description="limits.cpu, limits.memory, limits.ephemeral-storage, requests.* or *.hugepages-<size>.",
    )
    divisor: str | None = Field(default=None, max_length=64, description='A quantity, quoted (e.g. "1Mi").')


class EnvVarSource(CamelModel):
    """corev1 EnvVarSource, exactly one of its fields (typed here so a broken reference is refused at admission)."""

    model_config = ConfigDict(
        json_schema_extra={
            "minProperties": 1,
            "x-kubernetes-validations": [
                cel(
                    "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
                    "has(self.resourceFieldRef)].filter(x, x).size() == 1",
                    "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef; "
                    "fix: keep one of them",
                )
            ],
        }
    )
    secret_key_ref: ObjectKeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: ObjectKeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A resource of the container.")


class EnvVar(CamelModel):
    """A corev1 EnvVar."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.valueFrom) || !has(self.value) || self.value == ''",
                    "value and valueFrom are both set; fix: keep one of them",
                )
            ]
        }
    )
    name: str = Field(
        min_length=1,
        max_length=256,
        description="Environment variable name.",
        json_schema_extra=children.env_name_rules(),
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="corev1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."
    )


class EngineSpec(CamelModel):
    name: EngineName = Field(default=EngineName.VLLM, description="Serving engine: vllm, sglang or trtllm.")
    image: str = Field(
        default="",
        max_length=512,
        description="Engine image; empty means the catalog's versioned default for this engine and "
        "accelerator. Pin by digest in production.",
        json_schema_extra=children.image_rules("image"),
    )
    moe_backend: MoeBackend = Field(
        default=MoeBackend.AUTO,
        description="MoE kernel backend for MXFP4 on AMD: aiter (fast, needs an image with the AITER MXFP4 "
        "MoE path), emulation (works on current images), or auto (what the pinned image supports).",
    )
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=64,
        description="Arguments appended after the rendered ones. Flags the plan owns (parallel sizes, "
        "block size, max model length, parsers, memory fraction) are rejected.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for the engine container. Variables that change how the "
        "engine is executed (BASH_ENV, ENV, PATH, LD_*, PYTHONPATH, OMPI_*, "
        "VLLM_LOGGING_CONFIG_PATH, VLLM_PLUGINS, ...) and those m3fleet sets "
        "(HOME, HF_HOME, HF_TOKEN, LWS_*, the engine's rendered variables) are rejected.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key the OpenAI-compatible endpoint requires (Authorization: "
        "Bearer <key>). vLLM reads it from VLLM_API_KEY; SGLang never holds it: the key-guard container in front "
        "of it enforces it. Only env from the Secret, never a command line or a ConfigMap. Not supported by trtllm.",
    )
    admin_api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="SGLang only: Secret key holding the key of SGLang's admin endpoints (flush_cache, "
        "update_weights_*, profiling, ...), enforced by the key-guard container (SGLang never holds it). Without it "
        "the admin endpoints answer no one.",
    )


TRTLLM_API_KEY_PROBLEM = "is not supported by engine trtllm: the pinned trtllm-serve has no API key option"
TRTLLM_API_KEY_FIX = "use engine vllm or sglang, or remove it and put an authenticating gateway in front"
ADMIN_KEY_PROBLEM = "applies to engine sglang only (its admin endpoints)"
ADMIN_KEY_FIX = "remove it"
