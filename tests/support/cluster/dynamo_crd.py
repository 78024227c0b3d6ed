"""The DynamoGraphDeployment CRD (nvidia.com/v1beta1) as far as m3fleet's rendering touches it, so the real
apiserver validates what m3fleet emits.

Transcribed from Dynamo's published CRD (ai-dynamo/dynamo deploy/operator/config/crd/bases/
nvidia.com_dynamographdeployments.yaml, v1beta1, generated from deploy/operator/api/v1beta1/
dynamographdeployment_types.go and dynamocomponentdeployment_types.go): the same group, kind, plural, scope and
served/storage version, and for every field m3fleet sets the published type, enum, pattern, bounds, list type and
the two CEL rules on `components`; fields m3fleet does not set are left out, so the apiserver (kubectl's strict field
validation) refuses anything else m3fleet might emit. `podTemplate` is a corev1 PodTemplateSpec in the published
schema: here an object whose content is kept (the built-in schemas validate the same template in the pods
rendering). The published file is 1.6 MB and not installable from a package registry, which is why the tier
carries this transcription rather than the file.
"""

from __future__ import annotations

from typing import Any

NAME_PATTERN = "^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$"
_NUMBER = "(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))"
QUANTITY_PATTERN = f"^(\\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?{_NUMBER}))?$"  # resource.Quantity
COMPONENT_TYPES = ["frontend", "worker", "prefill", "decode", "planner", "epp"]

_COMPONENT: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": NAME_PATTERN},
        "type": {"type": "string", "enum": COMPONENT_TYPES},
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "multinode": {
            "type": "object",
            "properties": {"nodeCount": {"type": "integer", "format": "int32", "minimum": 2, "default": 2}},
        },
        "sharedMemorySize": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        },
        "podTemplate": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "dynamographdeployments.nvidia.com"},
    "spec": {
        "group": "nvidia.com",
        "names": {
            "kind": "DynamoGraphDeployment",
            "listKind": "DynamoGraphDeploymentList",
            "plural": "dynamographdeployments",
            "singular": "dynamographdeployment",
            "shortNames": ["dgd"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "backendFramework": {"type": "string", "enum": ["sglang", "vllm", "trtllm"]},
                                    "components": {
                                        "type": "array",
                                        "maxItems": 25,
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["name"],
                                        "items": _COMPONENT,
                                        "x-kubernetes-validations": [
                                            {
                                                "rule": "self.filter(c, has(c.type) && c.type == 'epp').size() <= 1",
                                                "message": "at most one component may have type epp",
                                            },
                                        ],
                                    },
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}
