"""The AWS clients the parts that call AWS share (CloudWatch, the ASG marker, reboots, the S3 bundle).

Built on first use: a configuration that calls no AWS API never imports the adapter."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.adapters.aws import AwsClients, InstanceMetadata


class Aws:
    """One IMDS client and one set of AWS clients for the whole agent (AWS from the standard environment)."""

    @functools.cached_property
    def imds(self) -> InstanceMetadata:
        from agent.adapters.aws import InstanceMetadata

        return InstanceMetadata()

    @functools.cached_property
    def clients(self) -> AwsClients:
        from agent.adapters.aws import AwsClients

        return AwsClients(imds=self.imds)
