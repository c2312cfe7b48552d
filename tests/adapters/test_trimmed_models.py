"""The trimmed botocore models (agent/adapters/botocore-models, agent.adapters.trim_models; issue 16).

The agent's clients read EC2's, Auto Scaling's and CloudWatch's models trimmed to the operations in CALLS
(EC2's full model costs ~15 MiB for one call). Checked here: the committed files are what the generator
makes from the installed botocore; they hold every operation the agent calls with every shape it reaches,
each as botocore's own; the agent's clients read them (and a user's AWS_DATA_PATH still comes first); and
the calls work against moto's server through the trimmed models.
"""

from __future__ import annotations

import json

import pytest
from botocore.loaders import Loader

from agent.adapters import trim_models
from agent.adapters.aws import CALLS, TRIMMED_MODELS_DIR, TRIMMED_SERVICES, AwsClients, AwsError, Ec2Reboot

from helpers.aws import aws_fixture, moto_server_fixture  # noqa: F401 (the fixtures aws and moto_server)

FULL = Loader()  # botocore's own data only


def committed(service: str) -> tuple[str, dict]:
    (path,) = sorted((TRIMMED_MODELS_DIR / service).glob("*/service-2.json"))
    return path.parent.name, json.loads(path.read_text())


def without_docs(value: dict) -> dict:
    return {k: v for k, v in value.items() if k not in trim_models.DOC_KEYS}


@pytest.mark.parametrize("service", sorted(TRIMMED_SERVICES))
def test_the_committed_model_is_what_the_generator_makes_from_the_installed_botocore(service):
    path, text = trim_models.generate(service)
    assert path.is_file(), f"{path} is missing: run python -m agent.adapters.trim_models"
    assert path.read_text() == text, f"{path} is stale for this botocore: run python -m agent.adapters.trim_models"


@pytest.mark.parametrize("service", sorted(TRIMMED_SERVICES))
def test_the_trimmed_model_holds_every_call_and_every_shape_it_reaches_as_botocore_has_them(service):
    version, model = committed(service)
    full = FULL.load_service_model(service, "service-2", version)
    called = {op for svc, op in CALLS if svc == service}
    assert set(model["operations"]) == called
    assert model["metadata"] == full["metadata"]
    reached: set[str] = set()
    todo = [
        ref["shape"]
        for op in model["operations"].values()
        for ref in [op.get("input"), op.get("output"), *op.get("errors", [])]
        if ref
    ]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            assert name in model["shapes"], f"{service}: shape {name} is referenced but not in the trimmed model"
            todo += trim_models.shape_refs(model["shapes"][name])
    assert reached == set(model["shapes"])  # nothing more than reached
    for name in called:
        assert model["operations"][name] == without_docs(full["operations"][name])
    for name, shape in model["shapes"].items():
        expected = without_docs(full["shapes"][name])
        if "members" in expected:
            expected["members"] = {k: without_docs(v) for k, v in expected["members"].items()}
        assert shape == expected, name


def test_trimming_refuses_an_operation_the_model_does_not_have():
    full = FULL.load_service_model("ec2", "service-2")
    with pytest.raises(KeyError, match="EC2 has no operation RebootEverything"):
        trim_models.trim(full, ["RebootEverything"])


@pytest.mark.parametrize("service", sorted(TRIMMED_SERVICES))
def test_the_agents_clients_read_the_trimmed_models(aws, service):
    client = AwsClients().client(service)
    assert set(client.meta.service_model.operation_names) == {op for svc, op in CALLS if svc == service}


def test_other_services_read_botocores_own_models(aws):
    assert "ListBuckets" in AwsClients().client("s3").meta.service_model.operation_names


def test_a_users_aws_data_path_still_comes_first(aws, monkeypatch, tmp_path):
    version, model = committed("ec2")
    model["operations"]["DescribeRegions"] = FULL.load_service_model("ec2", "service-2")["operations"][
        "DescribeRegions"
    ]
    model["shapes"].update(
        {
            n: s
            for n, s in FULL.load_service_model("ec2", "service-2")["shapes"].items()
            if n.startswith("DescribeRegions")
        }
    )
    target = tmp_path / "models" / "ec2" / version
    target.mkdir(parents=True)
    (target / "service-2.json").write_text(json.dumps(model))
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path / "models"))
    assert "DescribeRegions" in AwsClients().client("ec2").meta.service_model.operation_names


@pytest.mark.slow  # over 2 s: the full suite runs it, the fast lane does not
def test_reboot_goes_through_the_trimmed_model_and_its_errors_are_parsed(aws):
    instance = aws.lone_instance()
    clients = AwsClients()
    Ec2Reboot(clients=clients).reboot(instance)  # moto answers the request the trimmed model serialised
    with pytest.raises(AwsError) as err:
        Ec2Reboot(clients=clients).reboot("i-0123456789abcdef0")
    assert err.value.code == "InvalidInstanceID.NotFound" and not err.value.transient


def test_without_the_trimmed_models_the_full_model_is_used(aws, monkeypatch, tmp_path):
    """A wheel without the package data still works: botocore's own model is found after ours."""
    monkeypatch.setattr("agent.adapters.aws.TRIMMED_MODELS_DIR", tmp_path / "none")
    assert "RunInstances" in AwsClients().client("ec2").meta.service_model.operation_names
