"""The rules the apiserver and the kubelet apply to values a child object carries, as CRD rules.

A value m3fleet copies into a Pod, Deployment or Job (a Secret or claim name, a Secret key, an env name, an
image, a sub-path) is checked where the user writes it, by the CRD's own schema and CEL: `kubectl apply`, the
CLI (m3fleet.api.contract evaluates the same rules) and the operator then give one verdict, at admission,
instead of a child the apiserver refuses later (422 on the Deployment) or a pod the kubelet cannot start
(InvalidImageName, CreateContainerConfigError). Sources, as of Kubernetes 1.33:

- names of Secrets, ConfigMaps and PersistentVolumeClaims: DNS-1123 subdomains (apimachinery
  validation.IsDNS1123Subdomain, used by ValidateSecretName, ValidateConfigMapName, ValidatePersistentVolumeName);
- Secret and ConfigMap keys: IsConfigMapKey, `[-._a-zA-Z0-9]+`, at most 253 characters, not `.` or `..`;
- env names: IsRelaxedEnvVarName (RelaxedEnvironmentVariableValidation, on by default since 1.32): printable ASCII
  but `=`;
- images: the kubelet parses them with distribution/reference's grammar (reference/regexp.go); a name with a space
  or upper-case letters in the path fails as InvalidImageName;
- volume sub-paths: validateLocalDescendingPath, relative and without a `..` segment.
"""

from __future__ import annotations

from typing import Any

from m3fleet.api.rules import cel

DNS_SUBDOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KEY_PATTERN = "^[-._a-zA-Z0-9]+$"
ENV_NAME_PATTERN = "^[ -<>-~]+$"  # printable ASCII but =
_PATH_COMPONENT = "[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
# A first component is a registry only with a '.', a port or as localhost (reference.splitDockerDomain); else it is
# part of the lowercase path on docker.io.
_DOMAIN = (
    f"(?:localhost(?::[0-9]+)?|{_DOMAIN_COMPONENT}(?:[.]{_DOMAIN_COMPONENT})+(?::[0-9]+)?|{_DOMAIN_COMPONENT}:[0-9]+)"
)
_TAG = "[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}"
_DIGEST = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_PATTERN = f"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
DOT_DOT_PATTERN = "(^|/)[.][.](/|$)"  # a `..` path segment

NAME_PROBLEM = (
    "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending with a letter or "
    "digit), so the apiserver refuses the pod that names it"
)
NAME_FIX = "give the object's name as `kubectl get` shows it, e.g. hf-token (no namespace, no '/')"
KEY_PROBLEM = "is not a valid key (letters, digits, '-', '_' and '.'), so the pod that reads it is refused"
KEY_FIX = "give the key as `kubectl describe secret` lists it, e.g. token"
ENV_NAME_PROBLEM = "is not a valid environment variable name (printable ASCII characters, no '=')"
ENV_NAME_FIX = "rename it, e.g. MY_SETTING"
IMAGE_PROBLEM = (
    "is not an image reference the kubelet can pull ([registry[:port]/]path[:tag][@digest]: no spaces, a "
    "lowercase path)"
)
IMAGE_FIX = "give e.g. registry.example.com/team/vllm-openai:v0.33.0 or pin a digest with @sha256:<64 hex>"
SUB_PATH_PROBLEM = "is not a relative path inside the volume: it starts with '/' or has a '..' segment"
SUB_PATH_FIX = "give a directory relative to the volume's root, e.g. models/minimax-m3"
DOT_DOT_PROBLEM = "has a '..' segment, which would leave the directory it names"
DOT_DOT_FIX = "give the id or path without '..', e.g. MiniMaxAI/MiniMax-M3"


def _matches(pattern: str) -> str:
    return f"self.matches('{pattern}')"


def name_rules(field: str) -> dict[str, Any]:
    """A Secret, ConfigMap or claim name (`field` is how a message names it)."""
    return {
        "x-kubernetes-validations": [cel(_matches(DNS_SUBDOMAIN_PATTERN), f"{field} {NAME_PROBLEM}; fix: {NAME_FIX}")]
    }


def key_rules(field: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            cel(f"{_matches(KEY_PATTERN)} && self != '.' && self != '..'", f"{field} {KEY_PROBLEM}; fix: {KEY_FIX}")
        ]
    }


def env_name_rules() -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [cel(_matches(ENV_NAME_PATTERN), f"name {ENV_NAME_PROBLEM}; fix: {ENV_NAME_FIX}")]
    }


def image_rules(field: str) -> dict[str, Any]:
    """An image; empty means the default, which the catalog holds."""
    return {
        "x-kubernetes-validations": [
            cel(f"self == '' || {_matches(IMAGE_PATTERN)}", f"{field} {IMAGE_PROBLEM}; fix: {IMAGE_FIX}")
        ]
    }


def sub_path_rules() -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            cel(
                f"!self.startsWith('/') && !self.matches('{DOT_DOT_PATTERN}')",
                f"subPath {SUB_PATH_PROBLEM}; fix: {SUB_PATH_FIX}",
            )
        ]
    }


def no_dot_dot_rules(field: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            cel(f"!self.matches('{DOT_DOT_PATTERN}')", f"{field} {DOT_DOT_PROBLEM}; fix: {DOT_DOT_FIX}")
        ]
    }
