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
- volume sub-paths: validateLocalDescendingPath, relative and without a `..` segment;
- node selectors: ValidateLabels, keys IsQualifiedName (an optional DNS-1123 subdomain prefix of at most 253
  characters and '/', then a name of at most 63), values IsValidLabelValue (at most 63, or empty);
- tolerations: validateTolerations, the key a qualified name (empty only with operator Exists), operator Equal or
  Exists (empty means Equal), the value a label value (empty with Exists), effect NoSchedule, PreferNoSchedule,
  NoExecute or empty, tolerationSeconds only with NoExecute.

A CEL rule over a map is costed by the apiserver from the map's size and its strings' lengths: each such map is
bounded (maxProperties, the values' maxLength) so the CRD's cost estimate fits the budget.
"""

from __future__ import annotations

from typing import Any

from m3fleet.api.rules import cel

DNS_SUBDOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a volume's name (IsDNS1123Label)
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
_LABEL_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = f"^({DNS_SUBDOMAIN_PATTERN[1:-1]}/)?{_LABEL_NAME}$"
LONG_PREFIX_PATTERN = "^[^/]{254,}/"  # a prefix over 253 characters (RE2 has no look-ahead to bound it above)
LABEL_VALUE_PATTERN = f"^({_LABEL_NAME})?$"
LABEL_VALUE_MAX = 63
LABEL_KEY_MAX = 253 + 1 + 63
LABEL_MAP_MAX = 32
TOLERATION_OPERATORS = ("", "Equal", "Exists")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")

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
_LABEL_WORDS = "up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
LABEL_KEY_PROBLEM = (
    "is not a label key ([prefix/]name: the prefix a DNS subdomain of at most 253 characters, the name "
    f"{_LABEL_WORDS}), so the apiserver refuses the pod that carries it"
)
LABEL_KEY_FIX = (
    "give the key as `kubectl get nodes --show-labels` (or pods, namespaces) lists it, e.g. example.com/pool"
)
LABEL_VALUE_PROBLEM = f"is not a label value (empty, or {_LABEL_WORDS}), so the apiserver refuses the pod"
LABEL_VALUE_FIX = "give the value as `kubectl get nodes --show-labels` (or pods, namespaces) lists it, e.g. gpu-a"


def _matches(pattern: str) -> str:
    return f"self.matches('{pattern}')"


def name_rules(field: str, fix: str = NAME_FIX, optional: bool = False) -> dict[str, Any]:
    """A Secret, ConfigMap, claim, PriorityClass or scheduler name (`field` is how a message names it); `optional`:
    empty is admitted too (the cluster's default)."""
    rule = _matches(DNS_SUBDOMAIN_PATTERN)
    return {
        "x-kubernetes-validations": [
            cel(f"self == '' || {rule}" if optional else rule, f"{field} {NAME_PROBLEM}; fix: {fix}")
        ]
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


def label_key(variable: str) -> str:
    return f"{variable}.matches('{LABEL_KEY_PATTERN}') && !{variable}.matches('{LONG_PREFIX_PATTERN}')"


def _label_value(variable: str) -> str:
    return f"{variable}.matches('{LABEL_VALUE_PATTERN}')"


def label_map_rules(field: str) -> dict[str, Any]:
    """A map of label keys to label values that a child carries as labels or a node selector."""
    return {
        "maxProperties": LABEL_MAP_MAX,
        "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX},
        "x-kubernetes-validations": [
            cel(f"self.all(k, {label_key('k')})", f"{field} has a key that {LABEL_KEY_PROBLEM}; fix: {LABEL_KEY_FIX}"),
            cel(
                f"self.all(k, {_label_value('self[k]')})",
                f"{field} has a value that {LABEL_VALUE_PROBLEM}; fix: {LABEL_VALUE_FIX}",
            ),
        ],
    }


def toleration_schema() -> dict[str, Any]:
    """A corev1 Toleration (the schema of each item of a `tolerations` list), with the apiserver's rules."""
    exists = "(has(self.operator) && self.operator == 'Exists')"
    key_set = "(has(self.key) && self.key != '')"
    value_set = "(has(self.value) && self.value != '')"
    return {
        "type": "object",
        "properties": {
            "key": {
                "type": "string",
                "maxLength": LABEL_KEY_MAX,
                "description": "Taint key the toleration matches; empty (with operator Exists) matches every taint.",
            },
            "operator": {
                "type": "string",
                "maxLength": 16,
                "description": "Equal (the default) or Exists.",
                "x-kubernetes-validations": [
                    cel(
                        f"self in {list(TOLERATION_OPERATORS)}",
                        "operator must be Equal or Exists (empty means Equal); fix: use Equal or Exists",
                    )
                ],
            },
            "value": {"type": "string", "maxLength": LABEL_VALUE_MAX, "description": "Taint value (with Equal)."},
            "effect": {
                "type": "string",
                "maxLength": 16,
                "description": "NoSchedule, PreferNoSchedule or NoExecute; empty matches every effect.",
                "x-kubernetes-validations": [
                    cel(
                        f"self in {list(TOLERATION_EFFECTS)}",
                        "effect is not a taint effect; fix: use NoSchedule, PreferNoSchedule, NoExecute or leave it "
                        "empty",
                    )
                ],
            },
            "tolerationSeconds": {
                "type": "integer",
                "format": "int64",
                "description": "How long a NoExecute taint is tolerated before eviction.",
            },
        },
        "x-kubernetes-validations": [
            cel(
                f"!{key_set} || {label_key('self.key')}",
                f"key {LABEL_KEY_PROBLEM}; fix: give the taint's key as `kubectl describe node` lists it, e.g. "
                "nvidia.com/gpu",
                ".key",
            ),
            cel(
                f"{key_set} || {exists}",
                "key is empty, which only operator Exists allows (it then tolerates every taint); fix: give the "
                "taint's key, or set operator: Exists",
                ".key",
            ),
            cel(
                f"!{exists} || !{value_set}",
                "value must be empty when operator is Exists; fix: remove value, or use operator: Equal",
                ".value",
            ),
            cel(
                f"{exists} || !{value_set} || {_label_value('self.value')}",
                f"value {LABEL_VALUE_PROBLEM}; fix: give the taint's value as `kubectl describe node` lists it",
                ".value",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerationSeconds applies only to effect NoExecute; fix: set effect: NoExecute or remove "
                "tolerationSeconds",
                ".tolerationSeconds",
            ),
        ],
    }


SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# Marks an object m3fleet.api.crd must not default to `{}`: an empty label selector selects everything.
KEEP_ABSENT = "x-m3fleet-keep-absent"
SELECTOR_EXPRESSIONS_MAX = 16  # expressions per selector and values per expression: the CEL cost budget's bound


def label_selector_schema(description: str) -> dict[str, Any]:
    """A metav1.LabelSelector as a NetworkPolicy carries it (ValidateLabelSelector: keys qualified names, values
    label values, In/NotIn with values, Exists/DoesNotExist without)."""
    with_values = "self.operator in ['In', 'NotIn']"
    return {
        "type": "object",
        KEEP_ABSENT: True,
        "description": description,
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels that must all match.",
                **label_map_rules("matchLabels"),
            },
            "matchExpressions": {
                "type": "array",
                "maxItems": SELECTOR_EXPRESSIONS_MAX,
                "description": "Requirements that must all hold.",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": LABEL_KEY_MAX, "description": "Label key."},
                        "operator": {
                            "type": "string",
                            "maxLength": 16,
                            "description": "In, NotIn, Exists or DoesNotExist.",
                        },
                        "values": {
                            "type": "array",
                            "maxItems": SELECTOR_EXPRESSIONS_MAX,
                            "description": "Label values (In, NotIn).",
                            "items": {"type": "string", "maxLength": LABEL_VALUE_MAX},
                        },
                    },
                    "x-kubernetes-validations": [
                        cel(label_key("self.key"), f"key {LABEL_KEY_PROBLEM}; fix: {LABEL_KEY_FIX}", ".key"),
                        cel(
                            f"self.operator in {list(SELECTOR_OPERATORS)}",
                            "operator must be In, NotIn, Exists or DoesNotExist; fix: use one of those",
                            ".operator",
                        ),
                        cel(
                            f"({with_values}) == (has(self.values) && size(self.values) > 0)",
                            "values must be given with In and NotIn, and only with them; fix: list values for In or "
                            "NotIn, remove them for Exists and DoesNotExist",
                            ".values",
                        ),
                        cel(
                            f"!has(self.values) || self.values.all(v, {_label_value('v')})",
                            f"values has one that {LABEL_VALUE_PROBLEM}; fix: {LABEL_VALUE_FIX}",
                            ".values",
                        ),
                    ],
                },
            },
        },
    }


def network_peer_schema() -> dict[str, Any]:
    """A NetworkPolicyPeer: its selectors checked as the apiserver checks them; ipBlock (CIDRs) kept as written."""
    selectors = "(has(self.podSelector) || has(self.namespaceSelector))"
    return {
        "type": "object",
        "properties": {
            "podSelector": label_selector_schema("Pods admitted (in namespaceSelector's namespaces, else this one)."),
            "namespaceSelector": label_selector_schema("Namespaces whose pods are admitted."),
            "ipBlock": {
                "type": "object",
                "description": "CIDR admitted (and exceptions), checked by the apiserver in the NetworkPolicy.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
        "x-kubernetes-validations": [
            cel(
                f"{selectors} != has(self.ipBlock)",
                "a peer needs podSelector and/or namespaceSelector, or ipBlock alone; fix: give one of them",
            )
        ],
    }
