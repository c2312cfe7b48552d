"""A Kubernetes API server for tests that the real ``kubernetes`` Python client talks to.

See :class:`KubeApiServer`.  Modules: ``server`` (lifecycle, outages, seeding, kubeconfig),
``handler`` (HTTP), ``api`` (verbs), ``store`` (resourceVersions, history, watchers), ``resources``
(per-kind strategies), ``validation``, ``codec`` (typed decoding, Time/MicroTime), ``smp``
(strategic merge patch), ``rfcpatch`` (JSON merge patch / JSON patch), ``schema`` (OpenAPI merge
keys), ``selectors``, ``disruption`` (PDB status, eviction), ``kubelet`` (confirms graceful pod
deletions), ``dra`` (resource.k8s.io kinds per version), ``tainteviction`` (DeviceTaintRule status),
``eventconv``, ``faults``, ``requestlog``, ``authz``, ``discovery``, ``errors``, ``gotime``,
``fixtures``.
"""

from .authz import PolicyRule
from .faults import FaultRule
from .requestlog import RequestRecord
from .server import KubeApiServer

__all__ = ["FaultRule", "KubeApiServer", "PolicyRule", "RequestRecord"]
