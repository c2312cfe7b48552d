"""The Helm chart (daemonset/helm/node-health-agent): lint, render and schema-check every documented values
example, refuse bad values, and render the same objects as the kustomize overlays.

One source of truth: the kustomize tree stays hand-written (bases, patches and components that users
layer and edit, with the commented examples that tests/deploy/test_manifests.py keeps valid) and the chart
renders from values; ``test_helm_and_kustomize_render_the_same_objects`` renders both for each pair of
equivalent settings and compares the objects after normalising only what the tools themselves add
(Helm's and kustomize's bookkeeping labels, Helm's config checksum, kustomize's ConfigMap name hash,
list order, YAML comments in the ConfigMaps). A change to one side without the other fails with the
object and field that differ. The chart also reads the kustomize tree's shared files (the variants'
rules.yaml/checks.yaml, the alerts, dashboards and admission policy) through ``files/`` symlinks.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.app.config import build_scheduled_checks, load_agent_config
from agent.app.settings import rule_dirs
from agent.checks.model import CheckContext
from agent.recovery.policyfile import load_policy

from helpers.k8srender import (
    CHART,
    DAEMONSET,
    EXAMPLES,
    IMAGE,
    IMAGE_SET,
    NAMESPACE,
    REPO,
    Obj,
    helm,
    helm_template,
    kustomize,
    one,
    validate,
)

pytestmark = pytest.mark.slow  # renders with helm

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))

# kustomize overlay <-> Helm values example (and namespace) that must render the same objects.
PAIRS = (
    ("neuron", "neuron.yaml", NAMESPACE),
    ("nvidia", "nvidia.yaml", NAMESPACE),
    ("aks-gpu", "aks-gpu.yaml", NAMESPACE),
    ("generic", "generic.yaml", NAMESPACE),
    ("mixed", "mixed.yaml", NAMESPACE),
    ("kube-system", "mixed.yaml", "kube-system"),
    ("eks", "eks.yaml", NAMESPACE),
)

TOOL_LABELS = {
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
TOOL_ANNOTATIONS = {"checksum/config"}
HASHED_CONFIGMAP = re.compile(r"^(node-health-agent-rules-[a-z]+)-[a-z0-9]{10}$")


# ---- normalising ----------------------------------------------------------------------------------------------


def _normalise(node: Any, *, key: str = "") -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in ("labels", "annotations") and key == "metadata" and isinstance(v, dict):
                drop = TOOL_LABELS if k == "labels" else TOOL_ANNOTATIONS
                v = {lk: lv for lk, lv in v.items() if lk not in drop}
                if not v:
                    continue
            out[k] = _normalise(v, key=k)
        return out
    if isinstance(node, list):
        items = [_normalise(item, key=key) for item in node]
        if items and all(isinstance(i, dict) and "name" in i for i in items):
            return sorted(items, key=lambda i: i["name"])
        if items and all(isinstance(i, dict) and "key" in i for i in items):  # matchExpressions: ANDed, no order
            return sorted(items, key=lambda i: i["key"])
        return items
    if isinstance(node, str):
        return HASHED_CONFIGMAP.sub(r"\1", node)
    return node


def normalise(obj: Obj) -> Obj:
    obj = _normalise(copy.deepcopy(obj))
    if obj["kind"] == "ConfigMap":  # compare documents, not their comments and layout
        obj["data"] = {
            name: json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            for name, text in obj["data"].items()
        }
    return obj


def by_id(docs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    out: dict[tuple[str, str, str], Obj] = {}
    for doc in docs:
        n = normalise(doc)
        key = (n["kind"], n["metadata"].get("namespace", ""), n["metadata"]["name"])
        assert key not in out, f"two objects {key}"
        out[key] = n
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: kustomize {a.get(k, '<absent>')!r} / helm {b.get(k, '<absent>')!r}")
            else:
                out.extend(differences(a[k], b[k], f"{path}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: kustomize {a!r} / helm {b!r}"]


# ---- the pairs -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[list[Obj], list[Obj]]]:
    return {
        overlay: (kustomize(DAEMONSET / "overlays" / overlay), helm_template(EXAMPLES / values, namespace=namespace))
        for overlay, values, namespace in PAIRS
    }


@pytest.mark.parametrize(("overlay", "values", "namespace"), PAIRS, ids=[p[0] for p in PAIRS])
def test_helm_and_kustomize_render_the_same_objects(pairs, overlay: str, values: str, namespace: str) -> None:
    kustomized, helmed = pairs[overlay]
    # The chart never creates its release namespace (helm install --create-namespace, or kubectl create
    # namespace and label it, docs/deploy.md); the overlays do, except where it exists (kube-system).
    namespaces = [d for d in kustomized if d["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == ([] if namespace == "kube-system" else [namespace])
    left = by_id([d for d in kustomized if d["kind"] != "Namespace"])
    right = by_id(helmed)
    assert sorted(left) == sorted(right), "the two render different objects"
    problems = [f"{key}: {d}" for key in left for d in differences(left[key], right[key])]
    assert not problems, "\n".join(problems)


# ---- lint, render, validate every documented example -----------------------------------------------------------


OVERLAYS = sorted(p.name for p in (DAEMONSET / "overlays").iterdir() if (p / "kustomization.yaml").is_file())


def test_every_overlay_has_a_helm_equivalent() -> None:
    assert sorted(overlay for overlay, _, _ in PAIRS) == OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_valid_objects(pairs, overlay: str) -> None:
    kustomized, _ = pairs[overlay]
    for doc in kustomized:
        validate(doc)


def test_every_example_is_documented() -> None:
    docs = (REPO / "docs" / "deploy.md").read_text()
    missing = [p.name for p in EXAMPLE_FILES if f"examples/{p.name}" not in docs]
    assert EXAMPLE_FILES and not missing, f"examples not in docs/deploy.md: {missing}"


@pytest.mark.parametrize("values", [None, *EXAMPLE_FILES], ids=["defaults", *(p.stem for p in EXAMPLE_FILES)])
def test_helm_lint(values: Path | None) -> None:
    args = ["lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--set", IMAGE_SET]
    if values is not None:
        args += ["--values", str(values)]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", [None, *EXAMPLE_FILES], ids=["defaults", *(p.stem for p in EXAMPLE_FILES)])
def test_every_example_renders_valid_objects(values: Path | None) -> None:
    docs = helm_template(*([values] if values else []))
    assert any(d["kind"] == "DaemonSet" for d in docs)
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("values", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_every_examples_configuration_loads_in_the_agent(values: Path, tmp_path: Path) -> None:
    """What each agent would load: its ConfigMap's files after its packs (rules, checks, recovery policy)."""
    docs = helm_template(values)
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    for ds in (d for d in docs if d["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
        env = {e["name"]: e.get("value") for e in agent["env"]}
        (volume,) = [v for v in pod["volumes"] if v["name"] == "rules"]
        where = tmp_path / ds["metadata"]["name"]
        where.mkdir()
        for name, text in config_maps[volume["configMap"]["name"]].items():
            (where / name).write_text(text)
        files = [
            where / Path(a).name
            for a, flag in zip(agent["args"][1:], agent["args"], strict=False)
            if flag == "--config"
        ]
        config = load_agent_config(
            [*rule_dirs(plugins_dirs=None, packs=[env["NHA_PACKS"]]), *files], entry_points=lambda: ()
        )
        build_scheduled_checks(config, context=CheckContext(state_dir=tmp_path), entry_points=lambda: ())
        if "NHA_RECOVERY_POLICY" in env:
            load_policy(where / Path(env["NHA_RECOVERY_POLICY"]).name)


def test_mixed_install_has_no_colliding_objects() -> None:
    docs = helm_template(EXAMPLES / "mixed.yaml")
    ids = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(ids) == len(set(ids))
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    assert sorted(d["metadata"]["name"] for d in daemonsets) == [
        "node-health-agent-generic",
        "node-health-agent-neuron",
        "node-health-agent-nvidia",
    ]
    selectors = [json.dumps(d["spec"]["selector"], sort_keys=True) for d in daemonsets]
    assert len(set(selectors)) == 3, "each DaemonSet selects only its own pods"


def test_extra_volumes_reach_the_agent_only() -> None:
    """extraVolumes / extraVolumeMounts (e.g. exec check plugins from a ConfigMap) go to the agent container alone."""
    sets = (
        "extraVolumes[0].name=plugins",
        "extraVolumes[0].configMap.name=my-checks",
        "extraVolumes[0].configMap.defaultMode=493",  # 0755
        "extraVolumeMounts[0].name=plugins",
        "extraVolumeMounts[0].mountPath=/etc/node-health-agent/plugins",
        "extraVolumeMounts[0].readOnly=true",
    )
    for ds in (d for d in helm_template(EXAMPLES / "mixed.yaml", sets=sets) if d["kind"] == "DaemonSet"):
        validate(ds)
        pod = ds["spec"]["template"]["spec"]
        assert {"name": "plugins", "configMap": {"name": "my-checks", "defaultMode": 493}} in pod["volumes"]
        holders = {
            c["name"]
            for c in [*pod["initContainers"], *pod["containers"]]
            if any(m["name"] == "plugins" for m in c.get("volumeMounts", []))
        }
        assert holders == {"agent"}


POD_RESOURCES = "/var/lib/kubelet/pod-resources"
SOCKET_KMSG = "/run/node-health-agent/kmsg.sock"


def pod_resources_mounts(ds: Obj) -> dict[str, list[Obj]]:
    """The pod-resources mounts of each container of ``ds`` (init containers included), by container name."""
    pod = ds["spec"]["template"]["spec"]
    return {
        c["name"]: [m for m in c.get("volumeMounts", []) if m["mountPath"] == POD_RESOURCES]
        for c in [*pod["initContainers"], *pod["containers"]]
    }


FORWARD_ARGS = [
    "--forward-pod-resources",
    f"{POD_RESOURCES}/kubelet.sock",
    "--pod-resources-socket",
    "/run/node-health-agent/pod-resources.sock",
]


def containers(ds: Obj) -> dict[str, Obj]:
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize(("sets", "on"), [((), False), (("deviceHolders.enabled=true",), True)], ids=["off", "on"])
def test_the_pod_resources_socket_is_mounted_only_where_device_holders_are_on(sets: tuple[str, ...], on: bool) -> None:
    """deviceHolders.enabled (default off) mounts the kubelet's pod-resources folder read-only into the kmsg-relay
    container alone (hostPath, type Directory, the same path), which forwards the socket into the shared emptyDir;
    the agent gets DEVICE_HOLDERS=true and POD_RESOURCES_SOCKET there."""
    for ds in (d for d in helm_template(EXAMPLES / "mixed.yaml", sets=sets) if d["kind"] == "DaemonSet"):
        validate(ds)
        pod = ds["spec"]["template"]["spec"]
        mounts = pod_resources_mounts(ds)
        volumes = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == POD_RESOURCES]
        relay, agent = containers(ds)["kmsg-relay"], containers(ds)["agent"]
        env = {e["name"]: e.get("value") for e in agent["env"]}
        forwarding = relay["args"][-len(FORWARD_ARGS) :] == FORWARD_ARGS
        if not on:
            assert not volumes and not any(mounts.values()) and not forwarding
            assert "DEVICE_HOLDERS" not in env and "POD_RESOURCES_SOCKET" not in env
            assert not any("pod-resources" in arg for arg in relay["args"])
            continue
        assert volumes == [{"name": "pod-resources", "hostPath": {"path": POD_RESOURCES, "type": "Directory"}}]
        assert mounts.pop("kmsg-relay") == [{"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True}]
        assert not any(mounts.values()), "the agent and the init container never see the kubelet's socket"
        assert forwarding and relay["args"][: -len(FORWARD_ARGS)][:3] == ["kmsg-relay", "--socket", SOCKET_KMSG]
        assert (env["DEVICE_HOLDERS"], env["POD_RESOURCES_SOCKET"]) == (
            "true",
            "/run/node-health-agent/pod-resources.sock",
        )


def test_the_device_holders_component_renders_what_the_chart_renders(tmp_path: Path) -> None:
    """kustomize's components/device-holders on the mixed overlay and the chart's deviceHolders.enabled on
    examples/mixed.yaml render the same objects."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DAEMONSET / "overlays" / "mixed", tmp_path)],
                "components": [os.path.relpath(DAEMONSET / "components" / "device-holders", tmp_path)],
            }
        )
    )
    kustomized = [d for d in kustomize(tmp_path) if d["kind"] != "Namespace"]
    helmed = helm_template(EXAMPLES / "mixed.yaml", sets=("deviceHolders.enabled=true",))
    daemonsets = [d for d in kustomized if d["kind"] == "DaemonSet"]
    assert daemonsets and all(
        pod_resources_mounts(d)["kmsg-relay"] and not pod_resources_mounts(d)["agent"] for d in daemonsets
    )
    assert all(containers(d)["kmsg-relay"]["args"][-len(FORWARD_ARGS) :] == FORWARD_ARGS for d in daemonsets)
    left, right = by_id(kustomized), by_id(helmed)
    assert sorted(left) == sorted(right), "the two render different objects"
    problems = [f"{key}: {d}" for key in left for d in differences(left[key], right[key])]
    assert not problems, "\n".join(problems)


def test_a_configuration_change_rolls_only_the_agents_it_changes() -> None:
    """Each pod template carries its own ConfigMap's checksum (kustomize: the hashed ConfigMap name)."""

    def checksums(*sets: str) -> dict[str, str]:
        docs = helm_template(EXAMPLES / "mixed.yaml", sets=sets)
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in docs
            if d["kind"] == "DaemonSet"
        }

    before = checksums()
    nvidia = checksums("accelerators.nvidia.checks.checks[0].name=gpu-count")
    assert [n for n in before if before[n] != nvidia[n]] == ["node-health-agent-nvidia"]
    everyone = checksums("recovery.policy.startupDelay=2m")
    assert all(before[n] != everyone[n] for n in before)


def test_image_follows_the_release() -> None:
    """The chart's appVersion, the kustomize images: tag and the package version are one version."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == version
    images = yaml.safe_load((DAEMONSET / "agent" / "kustomization.yaml").read_text())["images"]
    assert images == [{"name": IMAGE, "newTag": version}]
    ds = one(helm_template(EXAMPLES / "neuron.yaml"), "DaemonSet")  # image.repository=IMAGE
    pod = ds["spec"]["template"]["spec"]
    assert {c["image"] for c in [*pod["initContainers"], *pod["containers"]]} == {f"{IMAGE}:{version}"}
    by_digest = one(helm_template(EXAMPLES / "neuron.yaml", sets=("image.digest=sha256:" + "a" * 64,)), "DaemonSet")
    assert by_digest["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@sha256:" + "a" * 64)


# ---- values.schema.json refuses what would not work -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (("accelerators.neuron.enabled=yes",), "'/accelerators/neuron/enabled': got string, want boolean"),
        (("accelerators.gaudi.enabled=true",), "additional properties 'gaudi' not allowed"),
        (("accelerators.neuron.enabled=false", "accelerators.nvidia.enabled=false"), "'/accelerators': 'anyOf' failed"),
        (("accelerators.nvidia.matchNodes[0].key=a", "accelerators.nvidia.matchNodes[0].operator=Gt"), "operator"),
        (("accelerators.nvidia.matchNodes[0].key=a", "accelerators.nvidia.matchNodes[0].operator=In"), "values"),
        (("accelerators.neuron.packs={kernel,tpu}",), "'/accelerators/neuron/packs/1'"),
        (("cloudwatch.enabled=true",), "'/clusterName': minLength"),
        (("aws.roleArn=my-role",), "'/aws/roleArn'"),
        (("aws.podIdentityAssociation.create=true", "clusterName=c"), "'/aws/podIdentityAssociation/roleArn'"),
        (("image.digest=latest",), "'/image/digest'"),
        (("recovery.startupDelay=soon",), "'/recovery/startupDelay'"),
        (("recovery.diagnostics.s3=my-bucket/nha",), "'/recovery/diagnostics/s3'"),
        (("recovery.diagnostics.keep=-1",), "'/recovery/diagnostics/keep'"),
        (("bootIdFile=boot_id",), "'/bootIdFile'"),
        (("scheduledMaintenance.enabled=yes",), "'/scheduledMaintenance/enabled'"),
        (("networkPolicy.scraper=null",), "missing property 'scraper'"),
        (("extraConfigFiles.rules\\.yaml=x",), "invalid propertyName 'rules.yaml'"),
        (("unknownKey=1",), "additional properties 'unknownKey' not allowed"),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, tuple) else None,
)
def test_schema_refuses_bad_values(sets: tuple[str, ...], says: str) -> None:
    args = ["template", "x", str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    proc = helm(*args)
    assert proc.returncode != 0, f"accepted {sets}"
    assert "schema" in proc.stderr and says in proc.stderr, proc.stderr


def test_schema_describes_every_value() -> None:
    """values.yaml and values.schema.json name the same keys (the schema forbids any other)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: closed"
            assert set(value) <= set(node["properties"]), f"{path}: {set(value) - set(node['properties'])}"
            for key, sub in value.items():
                walk(sub, node["properties"][key], f"{path}.{key}")
            for key, sub in node["properties"].items():
                assert sub.get("description"), f"{path}.{key} has no description"

    walk(values, schema, "")


RECOVERY_FLAG_VARS = ("NHA_DIAGNOSTICS_KEEP", "NHA_DIAGNOSTICS_S3", "NHA_BOOT_ID_FILE", "NHA_SCHEDULED_MAINTENANCE")


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        # recovery off: no bundles (report-only takes none), the rest as set
        ((), {"diagnostics_keep": 5, "diagnostics_s3": "", "scheduled_maintenance": False}),
        (
            (
                "recovery.enabled=true",
                "recovery.diagnostics.keep=3",
                "recovery.diagnostics.s3=s3://my-bucket/node-health",
                "bootIdFile=/host/boot_id",
                "scheduledMaintenance.enabled=true",
            ),
            {
                "diagnostics_keep": 3,
                "diagnostics_s3": "s3://my-bucket/node-health",
                "boot_id_file": Path("/host/boot_id"),
                "scheduled_maintenance": True,
            },
        ),
    ],
    ids=["defaults", "set"],
)
def test_the_recovery_flags_reach_every_agent_as_the_agent_reads_them(sets, expected, monkeypatch) -> None:
    """recovery.diagnostics, bootIdFile and scheduledMaintenance become the NHA_* variables of the flags
    --diagnostics-keep/-s3, --boot-id-file and --scheduled-maintenance: each agent's env, parsed by the agent."""
    from agent.app.cli import build_parser
    from agent.app.settings import build_settings

    agents = [
        c
        for o in helm_template(sets=sets)
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["name"] == "agent"
    ]
    assert agents
    for agent in agents:
        with monkeypatch.context() as m:
            for name in [n for n in os.environ if n.startswith("NHA_")]:
                m.delenv(name)
            for env in agent["env"]:  # these flags only: others name host paths this machine lacks
                if env["name"] in RECOVERY_FLAG_VARS:
                    m.setenv(env["name"], env["value"])
            settings = build_settings(build_parser().parse_args(["run"]))
        assert {key: getattr(settings, key) for key in expected} == expected


# ---- no image that does not exist; values cannot reshape the objects ---------------------------------------------


def test_an_install_without_an_image_refuses_saying_how_to_get_one() -> None:
    """No image is published for this version: the chart refuses to point at one silently."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == ""
    proc = helm("template", "x", str(CHART), "--namespace", NAMESPACE)
    assert proc.returncode != 0
    assert "image.repository is empty" in proc.stderr and "docs/deploy.md" in proc.stderr, proc.stderr


HOSTILE = (
    "a\nshareProcessNamespace: true",
    "x: {}",
    "{}",
    "[1, 2]",
    "0",
    "true",
    "null",
    "- a",
    "#comment",
    "a\n  hostPID: true",
)


def _pod_keys(docs: list[Obj]) -> set[str]:
    return {k for d in docs if d["kind"] == "DaemonSet" for k in d["spec"]["template"]["spec"]}


def _values_file(tmp_path: Path, dotted: str, value: Any, **more: Any) -> Path:
    """A values file setting ``dotted`` (a.b.c) to ``value``: what a user's -f file can say (no --set parsing)."""
    doc: dict[str, Any] = {}
    for key, v in {dotted: value, **more}.items():
        *parents, leaf = key.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _env(agent: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in agent["env"]}


@pytest.mark.parametrize("hostile", HOSTILE, ids=repr)
@pytest.mark.parametrize(
    ("value", "lands"),
    [
        ("priorityClassName", lambda pod, agent: pod["priorityClassName"]),
        ("accelerators.nvidia.runtimeClassName", lambda pod, agent: pod["runtimeClassName"]),
        ("image.tag", lambda pod, agent: agent["image"].removeprefix(f"{IMAGE}:")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_hostile_string_value_stays_one_string(value: str, lands: Any, hostile: str, tmp_path: Path) -> None:
    """Every string value is rendered quoted: newlines, `: `, `{}` or a number never become keys or other types.
    (Values the schema constrains, such as aws.region, the S3 URL or the digest, are refused before rendering.)"""
    baseline = _pod_keys(helm_template(EXAMPLES / "nvidia.yaml", _values_file(tmp_path, value, "plain")))
    docs = helm_template(EXAMPLES / "nvidia.yaml", _values_file(tmp_path, value, hostile))
    assert _pod_keys(docs) == baseline, "a value added keys to the pod spec"
    for ds in (d for d in docs if d["kind"] == "DaemonSet"):
        validate(ds)
        pod = ds["spec"]["template"]["spec"]
        (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
        assert lands(pod, agent) == hostile


@pytest.mark.parametrize("delay", ["0", "90s", "1h30m"])
def test_startup_delay_is_a_string_env_value(delay: str, tmp_path: Path) -> None:
    """recovery.startupDelay "0" (the documented 'disable') renders "0", which the API server accepts."""
    values = _values_file(tmp_path, "recovery.startupDelay", delay, **{"recovery.enabled": True})
    ds = one(helm_template(EXAMPLES / "neuron.yaml", values), "DaemonSet")
    validate(ds)
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    assert _env(agent)["RECOVERY_STARTUP_DELAY"] == delay
