"""Mark this node's EC2 instance Unhealthy in its Auto Scaling group (the ``mark-unhealthy`` action).

The instance id comes from the Node's ``spec.providerID`` (``aws:///<az>/i-...``), else from IMDSv2.
``DescribeAutoScalingInstances`` finds the group first: an instance the group already has as
Unhealthy is not marked again (a restart between the call and the record on the Node never repeats
``SetInstanceHealth``), and an instance in no group (Karpenter, self-managed) is reported, not an
error. A Node whose providerID names another cloud is not an EC2 instance: reported, never an IMDS
lookup. AWS errors propagate as :class:`agent.adapters.aws.AwsError` (the loop retries transient ones).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agent.recovery.model import NodeView

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkResult:
    """``marked``: SetInstanceHealth(Unhealthy) was called now; ``already``: the group had it Unhealthy
    already; ``no_group``: the instance is in no Auto Scaling group; ``not_aws``: not an EC2 instance."""

    outcome: str
    instance_id: str
    group: str | None
    message: str


class AsgMarker:
    """``(node) -> MarkResult``; ``autoscaling`` is an :class:`agent.adapters.aws.AutoScaling`, ``imds`` an
    :class:`agent.adapters.aws.InstanceMetadata` (None: providerID only)."""

    def __init__(self, *, autoscaling: Any, imds: Any = None, respect_grace_period: bool = True) -> None:
        self._autoscaling = autoscaling
        self._imds = imds
        self._respect = respect_grace_period

    def __call__(self, node: NodeView) -> MarkResult:
        from agent.adapters.aws import AwsError, instance_id_from_provider_id

        provider = node.provider_id.strip()
        instance_id = instance_id_from_provider_id(provider) if provider else None
        if instance_id is None and provider:
            if provider.startswith("aws://"):
                raise AwsError(
                    f"cannot read an instance id from the Node's providerID {provider!r}", code="BadProviderID"
                )
            return MarkResult(
                outcome="not_aws",
                instance_id="",
                group=None,
                message=f"providerID {provider!r} is not an EC2 instance: mark-unhealthy does not apply",
            )
        if instance_id is None:
            if self._imds is None:
                raise AwsError(
                    "the Node has no spec.providerID and the instance metadata service is not available: this "
                    "node's EC2 instance is unknown",
                    code="NoInstanceId",
                )
            try:
                instance_id = self._imds.instance_id()
            except AwsError as exc:
                raise AwsError(
                    f"the Node has no spec.providerID and the instance metadata service gave no instance id ({exc}): "
                    "this node's EC2 instance is unknown",
                    code="NoInstanceId",
                    transient=exc.transient,
                ) from None
        membership = self._autoscaling.find_group(instance_id)
        if membership is None:
            return MarkResult(
                outcome="no_group",
                instance_id=instance_id,
                group=None,
                message=f"{instance_id} is in no Auto Scaling group",
            )
        if membership.health_status == "UNHEALTHY":
            return MarkResult(
                outcome="already",
                instance_id=instance_id,
                group=membership.group,
                message=f"instance {instance_id} is already Unhealthy in Auto Scaling group {membership.group}",
            )
        self._autoscaling.set_unhealthy(instance_id, respect_grace_period=self._respect)
        grace = " after the group's health check grace period" if self._respect else ""
        return MarkResult(
            outcome="marked",
            instance_id=instance_id,
            group=membership.group,
            message=f"instance {instance_id} marked Unhealthy in Auto Scaling group {membership.group}; the group "
            f"replaces it{grace}",
        )
