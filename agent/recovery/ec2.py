"""Reboot this node's EC2 instance (the ``reboot`` remedy of a ladder): EC2 ``RebootInstances``.

The instance id comes from the Node's ``spec.providerID`` (``aws:///<az>/i-...``), else IMDSv2, as for
mark-unhealthy. A Node of another cloud is no EC2 instance (:class:`agent.recovery.ladder.NotEc2Instance`,
reported, never an IMDS lookup). AWS errors propagate as :class:`agent.adapters.aws.AwsError`: throttled,
denied and an instance in the wrong state (``IncorrectState``: stopping, stopped) are reported and retried
later by the ladder, never turned into another remedy.
"""

from __future__ import annotations

from typing import Any

from agent.recovery.ladder import NotEc2Instance
from agent.recovery.model import NodeView


class Ec2Rebooter:
    """``(node) -> instance id`` after RebootInstances; ``ec2`` is an :class:`agent.adapters.aws.Ec2Reboot`
    (its EC2 client is built by the first call), ``imds`` an :class:`agent.adapters.aws.InstanceMetadata`."""

    def __init__(self, *, ec2: Any, imds: Any = None) -> None:
        self._ec2 = ec2
        self._imds = imds

    def __call__(self, node: NodeView) -> str:
        from agent.adapters.aws import AwsError, instance_id_from_provider_id

        provider = node.provider_id.strip()
        instance_id = instance_id_from_provider_id(provider) if provider else None
        if instance_id is None and provider:
            if provider.startswith("aws://"):
                raise AwsError(
                    f"cannot read an instance id from the Node's providerID {provider!r}", code="BadProviderID"
                )
            raise NotEc2Instance(f"providerID {provider!r} is not an EC2 instance: reboot does not apply")
        if instance_id is None:
            if self._imds is None:
                raise AwsError("the Node has no providerID and IMDS is not available", code="NoInstanceId")
            instance_id = self._imds.instance_id()
        self._ec2.reboot(instance_id)
        return instance_id
