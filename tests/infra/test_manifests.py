"""Specifications of the deployment files in infra/.

Every YAML file is parsed; the KubeRay manifests, the nightly CronJob, the Ray
cluster launcher config and the Dockerfile are checked for the properties the
pipeline relies on (see infra/README.md). Where Ray can judge a file itself (its
launcher schema, its KubeRay autoscaler), the test asks Ray.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY = INFRA / "kuberay"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
LAUNCHER = INFRA / "cluster" / "aws-p5.yaml"

API_VERSIONS = {
    "RayCluster": "ray.io/v1",
    "RayJob": "ray.io/v1",
    "RayCronJob": "ray.io/v1",
    "CronJob": "batch/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ServiceAccount": "v1",
    "Namespace": "v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
GPU = "nvidia.com/gpu"
H100 = "accelerator_type:H100"
NIGHT = "20250102"


# --- loading --------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.suffix in {".yaml", ".yml"})


@functools.cache
def _parse(path: Path) -> tuple[dict[str, Any], ...]:
    with path.open() as f:
        return tuple(doc for doc in yaml.safe_load_all(f) if doc is not None)


def load(path: Path) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML file (a fresh copy: tests may mutate it)."""
    return copy.deepcopy(list(_parse(path)))


def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted(KUBERAY.glob("*.yaml")) for doc in load(path)]


def one(kind: str) -> dict[str, Any]:
    found = [doc for doc in manifests() if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in infra/kuberay, found {len(found)}"
    return found[0]


def launcher() -> dict[str, Any]:
    (config,) = load(LAUNCHER)
    return config


def cluster_specs() -> dict[str, dict[str, Any]]:
    """Every RayCluster spec in infra/kuberay, by where it lives."""
    return {
        "RayCluster": one("RayCluster")["spec"],
        "RayJob": one("RayJob")["spec"]["rayClusterSpec"],
        "RayCronJob": one("RayCronJob")["spec"]["jobTemplate"]["rayClusterSpec"],
    }


def ray_pod_specs(cluster: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster["workerGroupSpecs"]:
        yield group["groupName"], group["template"]["spec"]


def cronjob_pod_spec() -> dict[str, Any]:
    return one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def submitter_pod_specs() -> dict[str, dict[str, Any]]:
    return {
        "RayJob": one("RayJob")["spec"]["submitterPodTemplate"]["spec"],
        "RayCronJob": one("RayCronJob")["spec"]["jobTemplate"]["submitterPodTemplate"]["spec"],
    }


def all_pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for where, cluster in cluster_specs().items():
        for group, spec in ray_pod_specs(cluster):
            yield f"{where}/{group}", spec
    for where, spec in submitter_pod_specs().items():
        yield f"{where}/submitter", spec
    yield "CronJob", cronjob_pod_spec()


def gpu_group(cluster: dict[str, Any]) -> dict[str, Any]:
    groups = [
        g
        for g in cluster["workerGroupSpecs"]
        if GPU in g["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    ]
    assert len(groups) == 1, "expected exactly one GPU worker group"
    return groups[0]


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def dockerfile_args() -> dict[str, str]:
    args = {}
    for instruction, rest in dockerfile_instructions():
        if instruction == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name.strip()] = value.strip()
    return args


# --- every file -----------------------------------------------------------------


def test_the_expected_infra_files_exist():
    for relative in [
        "docker/Dockerfile",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob.yaml",
        "kuberay/cronjob.yaml",
        "kuberay/raycronjob.yaml",
        "kuberay/networkpolicy.yaml",
        "kuberay/monitoring.yaml",
        "cluster/aws-p5.yaml",
        "README.md",
    ]:
        assert (INFRA / relative).is_file(), relative


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_file_parses_to_known_kinds_with_their_api_version(path):
    docs = load(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        if path.parent == INFRA / "cluster":
            assert {"provider", "available_node_types", "head_node_type"} <= doc.keys()
            continue
        kind = doc.get("kind")
        assert kind in API_VERSIONS, f"{path}: unexpected kind {kind!r}"
        assert doc.get("apiVersion") == API_VERSIONS[kind], f"{path}: {kind}"


def test_every_namespaced_object_lives_in_the_overnight_namespace():
    for doc in manifests():
        if doc["kind"] in {"Namespace", "Kustomization"}:
            continue
        assert doc["metadata"]["namespace"] == "overnight", doc["kind"]


# --- Ray clusters ---------------------------------------------------------------


def test_rayjob_and_raycronjob_run_the_same_cluster_as_the_raycluster():
    specs = cluster_specs()
    assert specs["RayJob"] == specs["RayCluster"]
    assert specs["RayCronJob"] == specs["RayCluster"]
    assert one("RayCronJob")["spec"]["jobTemplate"] == one("RayJob")["spec"]


@pytest.mark.parametrize("where", ["RayCluster", "RayJob", "RayCronJob"])
def test_head_takes_no_work_and_workers_autoscale_from_zero(where):
    cluster = cluster_specs()[where]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] == 0, group["groupName"]
        assert group.get("replicas", 0) == 0, group["groupName"]
        assert group["maxReplicas"] >= 1, group["groupName"]


@pytest.mark.parametrize("where", ["RayCluster", "RayJob", "RayCronJob"])
def test_cluster_has_a_cpu_group_and_an_h100_group(where):
    cluster = cluster_specs()[where]
    gpu = gpu_group(cluster)
    cpu = [g for g in cluster["workerGroupSpecs"] if g is not gpu]
    assert len(cpu) == 1
    cpu_resources = cpu[0]["template"]["spec"]["containers"][0]["resources"]
    assert GPU not in cpu_resources["requests"]
    assert GPU not in cpu_resources["limits"]


@pytest.mark.parametrize("where", ["RayCluster", "RayJob", "RayCronJob"])
def test_gpu_group_requests_h100s_and_lands_on_h100_nodes(where):
    group = gpu_group(cluster_specs()[where])
    spec = group["template"]["spec"]
    resources = spec["containers"][0]["resources"]
    assert int(resources["requests"][GPU]) in {1, 8}
    assert resources["requests"][GPU] == resources["limits"][GPU]
    assert "H100" in json.dumps(spec.get("nodeSelector", {}) | spec.get("affinity", {}))
    assert any(t["key"] == GPU for t in spec["tolerations"])
    assert H100 in group["rayStartParams"]["resources"]


def test_ray_autoscaler_sees_a_zero_cpu_head_and_an_h100_node_type():
    autoscaling_config = pytest.importorskip("ray.autoscaler._private.kuberay.autoscaling_config")
    derive = getattr(autoscaling_config, "_derive_autoscaling_config_from_ray_cr", None)
    if derive is None:
        pytest.skip("this Ray has no KubeRay autoscaling config derivation to ask")
    config = derive(one("RayCluster"))  # also runs Ray's validate_config
    types = config["available_node_types"]
    head = types.pop(config["head_node_type"])
    assert head["resources"]["CPU"] == 0
    gpu_types = [t for t in types.values() if t["resources"].get("GPU")]
    cpu_types = [t for t in types.values() if not t["resources"].get("GPU")]
    assert len(gpu_types) == 1 and len(cpu_types) == 1
    assert gpu_types[0]["resources"][H100] == 1
    assert cpu_types[0]["resources"]["CPU"] > 0
    assert all(t["min_workers"] == 0 for t in types.values())


@pytest.mark.parametrize("where", ["RayCluster", "RayJob", "RayCronJob"])
def test_every_ray_pod_has_memory_backed_shared_memory(where):
    for group, spec in ray_pod_specs(cluster_specs()[where]):
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert "/dev/shm" in mounts, group
        volume = next(v for v in spec["volumes"] if v["name"] == mounts["/dev/shm"])
        assert volume["emptyDir"]["medium"] == "Memory", group


def test_every_container_requests_exactly_its_limits():
    for where, spec in all_pod_specs():
        for container in spec["containers"]:
            resources = container["resources"]
            assert resources["requests"] == resources["limits"], f"{where}/{container['name']}"
    for where, cluster in cluster_specs().items():
        resources = cluster["autoscalerOptions"]["resources"]
        assert resources["requests"] == resources["limits"], f"{where} autoscaler"


def test_gpu_containers_request_exactly_their_limits():
    for where, cluster in cluster_specs().items():
        container = gpu_group(cluster)["template"]["spec"]["containers"][0]
        assert container["resources"]["requests"] == container["resources"]["limits"], where


def test_every_pod_runs_as_a_non_root_user():
    for where, spec in all_pod_specs():
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True, where
        assert context["runAsUser"] != 0, where
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where


def test_ray_version_of_every_cluster_is_the_one_in_the_image_and_pyproject():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    from packaging.requirements import Requirement

    image_ray = dockerfile_args()["RAY_VERSION"]
    for where, cluster in cluster_specs().items():
        assert cluster["rayVersion"] == image_ray, where
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (ray,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray"]
    assert ray.specifier.contains(image_ray), f"RAY_VERSION {image_ray} outside {ray.specifier}"
    for lock in ("default", "dev", "gpu"):
        pins = (REPO / "requirements" / f"{lock}.txt").read_text()
        assert f"\nray=={image_ray} " in pins, (
            f"requirements/{lock}.txt does not pin ray {image_ray}"
        )


def _requirements(project: dict, extras: list[str]) -> list:
    """The project's requirements with these extras, its own extras (dev -> llm-cpu) expanded."""
    from packaging.requirements import Requirement

    out, todo = [], [*project["dependencies"]]
    for extra in extras:
        todo += project["optional-dependencies"][extra]
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.name == "overnight":
            for extra in requirement.extras:
                todo += project["optional-dependencies"][extra]
        else:
            out.append(requirement)
    return out


def test_the_lock_files_pin_every_dependency_within_pyproject_ranges():
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for lock, extras in (("default", []), ("dev", ["dev"])):
        pins: dict[str, list[str]] = {}
        for line in (REPO / "requirements" / f"{lock}.txt").read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split(";")[0].split("#")[0].strip().split("==")
                pins.setdefault(name.lower().replace("_", "-"), []).append(version)
        for requirement in _requirements(project, extras):
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            name = requirement.name.lower().replace("_", "-")
            assert name in pins, f"requirements/{lock}.txt lacks {name}: run scripts/lock.sh"
            for version in pins[name]:
                assert requirement.specifier.contains(version), (lock, name, version)


# --- RayJob ---------------------------------------------------------------------


def test_rayjob_runs_the_overnight_cli_and_removes_its_cluster_afterwards():
    spec = one("RayJob")["spec"]
    assert spec["entrypoint"].startswith("overnight ")
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] >= 0
    assert spec["submissionMode"] in {"K8sJobMode", "HTTPMode", "SidecarMode"}
    # The head advertises no CPUs: an entrypoint that reserved some would never start.
    assert spec.get("entrypointNumCpus", 0) == 0


@pytest.mark.parametrize("where", ["RayJob", "RayCronJob"])
def test_a_run_with_all_its_retries_ends_within_a_day_so_nightly_runs_cannot_overlap(where):
    # KubeRay starts activeDeadlineSeconds afresh on every retry (it resets the start time),
    # so the bound of a night is the deadline times the attempts, not the deadline alone.
    doc = one(where)["spec"]
    spec = doc["jobTemplate"] if where == "RayCronJob" else doc
    attempts = spec.get("backoffLimit", 0) + 1  # KubeRay's default is no retry
    assert 0 < spec["activeDeadlineSeconds"] * attempts < 24 * 3600, (where, attempts)


def test_rayjob_gets_a_fresh_name_per_one_off_run():
    metadata = one("RayJob")["metadata"]
    assert "name" not in metadata
    assert metadata["generateName"] == "overnight-run-"


def test_entrypoint_job_spec_is_mounted_into_the_head_from_a_configmap():
    job_spec = one("RayJob")["spec"]["entrypoint"].split()[2]
    head = one("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head["volumes"]}
    for mount in head["containers"][0]["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not job_spec.startswith(prefix):
            continue
        volume = volumes[mount["name"]]
        config_maps = [volume["configMap"]] if "configMap" in volume else []
        config_maps += [s["configMap"] for s in volume.get("projected", {}).get("sources", [])]
        paths = {item["path"] for cm in config_maps for item in cm.get("items", [])}
        assert job_spec[len(prefix) :] in paths
        return
    pytest.fail(f"{job_spec} is not on any volume of the head")


def test_ray_pods_get_credentials_only_from_their_service_account_or_a_secret():
    service_accounts = {
        doc["metadata"]["name"] for doc in manifests() if doc["kind"] == "ServiceAccount"
    }
    for where, cluster in cluster_specs().items():
        for group, spec in ray_pod_specs(cluster):
            assert spec["serviceAccountName"] in service_accounts, f"{where}/{group}"
            sources = spec["containers"][0].get("envFrom", [])
            assert all(set(s) == {"secretRef"} for s in sources), f"{where}/{group}"


# --- nightly CronJob ------------------------------------------------------------

CRON_LIMITS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
CRON_NAMES = {
    3: {
        m: i + 1
        for i, m in enumerate(
            ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        )
    },
    4: {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
}


def is_valid_cron(expression: str) -> bool:
    fields = expression.split()
    if len(fields) != 5:
        return False
    for index, (field, (low, high)) in enumerate(zip(fields, CRON_LIMITS, strict=True)):
        for part in field.split(","):
            base, slash, step = part.partition("/")
            if slash and not (step.isdigit() and int(step) > 0):
                return False
            if base == "*":
                continue
            for bound in base.split("-", 1):
                value = int(bound) if bound.isdigit() else CRON_NAMES.get(index, {}).get(bound)
                if value is None or not low <= value <= high:
                    return False
    return True


@pytest.mark.parametrize(
    ("expression", "valid"),
    [
        ("0 1 * * *", True),
        ("*/15 0-6 * * mon-fri", True),
        ("0 1 * *", False),
        ("60 1 * * *", False),
        ("0 24 * * *", False),
        ("@daily", False),
    ],
)
def test_cron_check_accepts_five_field_expressions_only(expression, valid):
    assert is_valid_cron(expression) is valid


@pytest.mark.parametrize("kind", ["CronJob", "RayCronJob"])
def test_schedules_are_valid_five_field_cron_expressions(kind):
    assert is_valid_cron(one(kind)["spec"]["schedule"])


def test_cronjob_never_overlaps_itself_and_gives_up_on_a_missed_night():
    spec = one("CronJob")["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 0 < spec["startingDeadlineSeconds"] <= 6 * 3600
    assert spec["timeZone"]


def test_cronjob_may_only_get_and_create_rayjobs():
    pod = cronjob_pod_spec()
    binding = one("RoleBinding")
    role = one("Role")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert {"kind": "ServiceAccount", "name": pod["serviceAccountName"]} in [
        {k: s[k] for k in ("kind", "name")} for s in binding["subjects"]
    ]
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["ray.io"]
    assert rule["resources"] == ["rayjobs"]
    assert sorted(rule["verbs"]) == ["create", "get"]


def test_cronjob_template_is_rayjob_yaml_built_by_the_kustomization():
    kustomization = one("Kustomization")
    for resource in kustomization["resources"]:
        assert (KUBERAY / resource).is_file(), resource
    # Applying the kustomization must not start a run or a second scheduler.
    assert not {"rayjob.yaml", "raycronjob.yaml"} & set(kustomization["resources"])
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["rayjob.yaml"]
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True

    pod = cronjob_pod_spec()
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    volume = next(
        v for v in pod["volumes"] if v.get("configMap", {}).get("name") == generator["name"]
    )
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert env["RAYJOB_TEMPLATE"] == f"{mount['mountPath']}/rayjob.yaml"


def test_cronjob_names_the_rayjob_after_the_utc_date():
    script = nightly_script()
    assert "date -u +%Y%m%d" in script
    assert "overnight-nightly-${night}" in script
    assert "AlreadyExists" in script


def nightly_script() -> str:
    (container,) = cronjob_pod_spec()["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    (script,) = container["args"]
    return script


STUB_KUBECTL = """#!{python}
import os, sys
from pathlib import Path
import yaml

state = Path(os.environ["STUB_STATE"])
args = sys.argv[1:]
with (state / "calls").open("a") as calls:
    calls.write(" ".join(args) + "\\n")
if args[0] == "get" and args[1] == "rayjob":
    if (state / "rayjobs" / args[2]).exists():
        print(args[2])
        sys.exit(0)
    print(f'Error from server (NotFound): rayjobs.ray.io "{{args[2]}}" not found', file=sys.stderr)
    sys.exit(1)
if args[0] == "create":
    doc = yaml.safe_load(Path(args[args.index("-f") + 1]).read_text())
    name = doc["metadata"]["name"]
    refusal = os.environ.get("STUB_REFUSE_CREATE")
    if refusal == "AlreadyExists" or (state / "rayjobs" / name).exists():
        print(f'Error from server (AlreadyExists): rayjobs.ray.io "{{name}}" already exists', file=sys.stderr)
        sys.exit(1)
    if refusal:
        print(f"Error from server ({{refusal}}): rayjobs.ray.io is forbidden", file=sys.stderr)
        sys.exit(1)
    (state / "rayjobs" / name).write_text(yaml.safe_dump(doc))
    print(f"rayjob.ray.io/{{name}} created")
    sys.exit(0)
print("unexpected kubectl call: " + " ".join(args), file=sys.stderr)
sys.exit(2)
"""

STUB_DATE = f"""#!/bin/sh
[ "$*" = "-u +%Y%m%d" ] || {{ echo "unexpected date call: $*" >&2; exit 2; }}
echo {NIGHT}
"""


@pytest.fixture
def run_nightly(tmp_path):
    if shutil.which("sh") is None:
        pytest.skip("needs a POSIX shell")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (tmp_path / "rayjobs").mkdir()
    for name, text in {
        "kubectl": STUB_KUBECTL.format(python=sys.executable),
        "date": STUB_DATE,
    }.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env_path = f"{stubs}:{Path(shutil.which('sh')).parent}:/usr/bin:/bin"

    def run(**extra_env: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": env_path,
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "STUB_STATE": str(tmp_path),
            "POD_NAMESPACE": "overnight",
            "RAYJOB_TEMPLATE": str(KUBERAY / "rayjob.yaml"),
            **extra_env,
        }
        return subprocess.run(
            ["sh", "-c", nightly_script()],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    run.created = lambda: sorted(p.name for p in (tmp_path / "rayjobs").iterdir())  # type: ignore[attr-defined]
    return run


def test_nightly_script_creates_tonights_rayjob_from_the_template(run_nightly, tmp_path):
    result = run_nightly()
    assert result.returncode == 0, result.stderr
    assert run_nightly.created() == [f"overnight-nightly-{NIGHT}"]
    created = yaml.safe_load((tmp_path / "rayjobs" / f"overnight-nightly-{NIGHT}").read_text())
    template = one("RayJob")
    assert "generateName" not in created["metadata"]
    assert created["metadata"]["namespace"] == template["metadata"]["namespace"]
    assert created["spec"] == template["spec"]


def test_nightly_script_run_again_the_same_night_creates_nothing_and_succeeds(run_nightly):
    assert run_nightly().returncode == 0
    second = run_nightly()
    assert second.returncode == 0, second.stderr
    assert run_nightly.created() == [f"overnight-nightly-{NIGHT}"]
    assert "already exists" in second.stdout


def test_nightly_script_treats_a_concurrent_create_of_tonights_rayjob_as_done(run_nightly):
    result = run_nightly(STUB_REFUSE_CREATE="AlreadyExists")
    assert result.returncode == 0, result.stderr
    assert run_nightly.created() == []


def test_nightly_script_fails_when_the_rayjob_cannot_be_created(run_nightly):
    result = run_nightly(STUB_REFUSE_CREATE="Forbidden")
    assert result.returncode != 0
    assert "Forbidden" in result.stderr
    assert run_nightly.created() == []


# --- Ray cluster launcher (AWS) -------------------------------------------------


def test_launcher_head_type_is_declared_and_a_p5_type_offers_eight_h100s():
    config = launcher()
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    p5 = [t for t in types.values() if t["node_config"]["InstanceType"].startswith("p5.")]
    assert len(p5) == 1
    assert p5[0]["resources"]["GPU"] == 8
    assert p5[0]["resources"]["CPU"] == 192
    # Ray advertises one unit per node whatever the GPU count; more would
    # mislead the autoscaler.
    assert p5[0]["resources"][H100] == 1
    assert p5[0]["min_workers"] == 0
    assert types[config["head_node_type"]]["resources"]["CPU"] == 0


def test_launcher_worker_limits_cover_every_minimum():
    config = launcher()
    workers = [
        t for n, t in config["available_node_types"].items() if n != config["head_node_type"]
    ]
    assert config["max_workers"] >= sum(t.get("min_workers", 0) for t in workers)
    assert config["max_workers"] >= sum(t["max_workers"] for t in workers)
    assert all(t["max_workers"] >= t.get("min_workers", 0) for t in workers)
    assert any(not t["resources"].get("GPU") for t in workers), "a CPU worker type"


def test_launcher_config_is_accepted_by_rays_own_validation():
    util = pytest.importorskip("ray.autoscaler._private.util")
    util.validate_config(launcher())
    util.validate_config(util.prepare_config(launcher()))


def test_launcher_starts_the_image_without_its_overnight_entrypoint():
    assert '--entrypoint=""' in launcher()["docker"]["run_options"]


# --- images ---------------------------------------------------------------------


def test_every_ray_node_and_submitter_runs_the_same_image_as_the_launcher():
    images = {launcher()["docker"]["image"]}
    for cluster in cluster_specs().values():
        for _group, spec in ray_pod_specs(cluster):
            images |= {c["image"] for c in spec["containers"]}
    for spec in submitter_pod_specs().values():
        images |= {c["image"] for c in spec["containers"]}
    assert len(images) == 1, images
    (image,) = images
    assert re.fullmatch(r"[a-z0-9./-]+:[\w.-]+", image), image


def test_other_images_are_pinned_to_a_version():
    for container in cronjob_pod_spec()["containers"]:
        name, _, tag = container["image"].rpartition(":")
        assert name and tag and tag != "latest", container["image"]


# --- credentials ----------------------------------------------------------------

CREDENTIAL_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"aws_secret_access_key\s*[:=]\s*['\"]?[A-Za-z0-9/+=]{16,}", re.IGNORECASE),
    re.compile(r"password\s*:\s*['\"]?(?!\$\{|<|['\"]?$)\S+", re.IGNORECASE),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
]


@pytest.mark.parametrize(
    "text",
    [
        "aws_access_key_id: AKIAABCDEFGHIJKLMNOP",
        "aws_secret_access_key = abcdEFGH1234/+ijklMNOP5678qrst",
        "password: hunter2",
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEF",
    ],
)
def test_credential_scan_recognises_inline_secrets(text):
    assert any(p.search(text) for p in CREDENTIAL_PATTERNS)


def test_no_infra_file_contains_a_credential():
    for path in sorted(p for p in INFRA.rglob("*") if p.is_file()):
        text = path.read_text()
        for pattern in CREDENTIAL_PATTERNS:
            assert not pattern.search(text), f"{path.relative_to(REPO)}: {pattern.pattern}"


def test_no_manifest_carries_a_secret_or_a_literal_credential_variable():
    assert not [doc for doc in manifests() if doc["kind"] == "Secret"]
    credential = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)
    for where, spec in all_pod_specs():
        for container in spec["containers"]:
            for variable in container.get("env", []):
                if credential.search(variable["name"]):
                    assert "valueFrom" in variable, f"{where}: {variable['name']}"
    for key, value in walk(launcher()):
        assert not (isinstance(value, str) and credential.search(key)), key


# --- Dockerfile -----------------------------------------------------------------


def test_dockerfile_builds_on_a_cuda_12_cudnn_runtime_image():
    froms = [rest for instruction, rest in dockerfile_instructions() if instruction == "FROM"]
    assert len(froms) == 1
    assert re.fullmatch(r"nvidia/cuda:12\.\d+(\.\d+)?-cudnn\d*-runtime-ubuntu\d+\.\d+", froms[0])


def test_dockerfile_installs_python_3_11_and_the_project_with_its_gpu_extra():
    runs = " ".join(rest for instruction, rest in dockerfile_instructions() if instruction == "RUN")
    assert re.search(r"pip install [^&]*\"\.\[gpu\]\"", runs)
    assert dockerfile_args()["PYTHON"] == "python3.11"
    assert "${PYTHON} -m venv" in runs


def test_dockerfile_runs_as_a_numeric_non_root_user():
    users = [rest for instruction, rest in dockerfile_instructions() if instruction == "USER"]
    assert users, "no USER instruction"
    args = dockerfile_args()
    user = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], users[-1]).split(":")[0]
    assert user.isdigit() and int(user) != 0, users[-1]


def test_dockerfile_prepares_the_speaker_encoder_in_a_cache_its_user_owns():
    instructions = dockerfile_instructions()
    runs = [rest for instruction, rest in instructions if instruction == "RUN"]
    [prepare] = [r for r in runs if "overnight.workers.diarize.prepare" in r]
    envs = " ".join(rest for instruction, rest in instructions if instruction == "ENV")
    cache = re.search(r"OVERNIGHT_CACHE=(\S+)", envs)
    assert cache, "the model cache is not set for the image"
    assert f"chown -R ${{UID}}:${{GID}} {cache.group(1)}" in prepare
    users = [i for i, (instruction, _) in enumerate(instructions) if instruction == "USER"]
    assert instructions.index(("RUN", prepare)) < users[-1]  # prepared before the user drops root


def test_dockerfile_entrypoint_is_the_overnight_cli():
    entrypoints = [r for instruction, r in dockerfile_instructions() if instruction == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["overnight"]]


def test_docker_context_keeps_what_the_dockerfile_copies():
    ignore = (INFRA / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    for instruction, rest in dockerfile_instructions():
        if instruction != "COPY" or "--from" in rest:
            continue
        for source in rest.split()[:-1]:
            if "*" in source:
                continue
            assert f"!{source}" in ignore or f"!{source}/" in ignore, source


def test_ci_run_stops_with_a_clear_message_when_the_install_fails():
    done = subprocess.run(
        ["bash", ".ci/run"],
        cwd=REPO,
        env={**os.environ, "PYTHON": "/bin/false"},  # no Python at all: the install fails
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "is not Python >= 3.11" in done.stderr
    assert "installation failed" in done.stderr and "no test was run" in done.stderr


def test_prometheus_scrapes_the_metrics_port_of_every_ray_pod():
    """Each Ray container names Ray's metrics port, and the PodMonitor selects those pods by a
    label every Ray pod template carries."""
    [monitor] = [
        d for d in load(INFRA / "kuberay" / "monitoring.yaml") if d["kind"] == "PodMonitor"
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    for name in ("raycluster.yaml", "rayjob.yaml", "raycronjob.yaml"):
        text = (INFRA / "kuberay" / name).read_text()
        pods = text.count("- name: ray-head") + text.count("- name: ray-worker")
        assert text.count("{name: metrics, containerPort: 8080}") == pods, name
        for label, value in selector.items():
            assert text.count(f"{label}: {value}") >= pods, (name, label)


# --- model cache, disk, network, alerts -----------------------------------------


def dockerfile_env() -> dict[str, str]:
    env = {}
    for instruction, rest in dockerfile_instructions():
        if instruction == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


def ray_pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    for where, cluster in cluster_specs().items():
        yield f"{where}/head", cluster["headGroupSpec"]["template"]
        for group in cluster["workerGroupSpecs"]:
            yield f"{where}/{group['groupName']}", group["template"]


def submitter_pod_templates() -> dict[str, dict[str, Any]]:
    return {
        "RayJob": one("RayJob")["spec"]["submitterPodTemplate"],
        "RayCronJob": one("RayCronJob")["spec"]["jobTemplate"]["submitterPodTemplate"],
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def test_label_selector_check_follows_kubernetes_semantics():
    selector = {
        "matchLabels": {"a": "1"},
        "matchExpressions": [{"key": "b", "operator": "In", "values": ["x", "y"]}],
    }
    assert selects(selector, {"a": "1", "b": "y", "c": "z"})
    assert not selects(selector, {"a": "1"})
    assert not selects(selector, {"a": "2", "b": "x"})
    assert selects({}, {"anything": "goes"})


def test_no_pod_volume_hides_the_models_the_image_baked_into_its_cache():
    """The image prepares the speaker encoder under $OVERNIGHT_CACHE/models; a volume mounted
    there or above it would replace that folder with an empty one (--diarize exits 5)."""
    models = Path(dockerfile_env()["OVERNIGHT_CACHE"]) / "models"
    for where, spec in all_pod_specs():
        for container in spec["containers"] + spec.get("initContainers", []):
            for mount in container.get("volumeMounts", []):
                path = Path(mount["mountPath"])
                assert path != models and path not in models.parents, (where, mount)


def test_the_model_cache_volume_holds_the_images_hub_cache():
    hf_home = dockerfile_env()["HF_HOME"]
    for where, spec in all_pod_specs():
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] == "model-cache":
                    assert mount["mountPath"] == hf_home, where


def test_every_container_bounds_the_node_disk_it_may_fill():
    for where, spec in all_pod_specs():
        for container in spec["containers"]:
            assert "ephemeral-storage" in container["resources"]["limits"], where
    for where, cluster in cluster_specs().items():
        assert "ephemeral-storage" in cluster["autoscalerOptions"]["resources"]["limits"], where


def _quantity_gi(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi|Ti)", quantity).groups()
    return int(number) * {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}[unit]


def test_a_ray_pods_disk_limit_leaves_room_beyond_its_disk_backed_volumes():
    # emptyDirs on disk count against the pod's ephemeral storage; a limit below them would
    # get the pod evicted when its cache fills as allowed.
    for where, template in ray_pod_templates():
        spec = template["spec"]
        on_disk = sum(
            _quantity_gi(v["emptyDir"]["sizeLimit"])
            for v in spec["volumes"]
            if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
        )
        limit = sum(
            _quantity_gi(c["resources"]["limits"]["ephemeral-storage"]) for c in spec["containers"]
        )
        assert limit > on_disk, where


def network_policy() -> dict[str, Any]:
    [policy] = load(KUBERAY / "networkpolicy.yaml")
    return policy


def _ingress_rules_admitting(labels: dict[str, str]) -> list[dict[str, Any]]:
    """The ingress rules that admit a pod with these labels from the overnight namespace."""
    return [
        rule
        for rule in network_policy()["spec"]["ingress"]
        for peer in rule["from"]
        if "namespaceSelector" not in peer and selects(peer["podSelector"], labels)
    ]


def test_network_policy_covers_every_ray_pod_and_admits_their_peers_on_every_port():
    policy = network_policy()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for where, template in ray_pod_templates():
        labels = template["metadata"]["labels"]
        assert selects(policy["spec"]["podSelector"], labels), where
        # Ray's raylet, object manager, agents and worker processes listen on random ports.
        assert any("ports" not in rule for rule in _ingress_rules_admitting(labels)), where


def test_network_policy_admits_the_submitter_and_the_operator_to_the_jobs_api_only():
    for where, template in submitter_pod_templates().items():
        labels = template.get("metadata", {}).get("labels", {})
        assert labels, f"{where}: the submitter pod has no labels to be admitted by"
        assert not selects(network_policy()["spec"]["podSelector"], labels), where
        rules = _ingress_rules_admitting(labels)
        assert rules and all(r["ports"] == [{"protocol": "TCP", "port": 8265}] for r in rules)
    operator = [
        rule
        for rule in network_policy()["spec"]["ingress"]
        for peer in rule["from"]
        if "namespaceSelector" in peer
        and selects(peer.get("podSelector", {}), {"app.kubernetes.io/name": "kuberay-operator"})
        and "podSelector" in peer
    ]
    assert [r["ports"] for r in operator] == [[{"protocol": "TCP", "port": 8265}]]


def test_network_policy_admits_nothing_else_from_other_pods_or_namespaces():
    # The nightly CronJob's pods talk to the Kubernetes API server only.
    cronjob_labels = one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["metadata"]
    assert _ingress_rules_admitting(cronjob_labels["labels"]) == []
    assert _ingress_rules_admitting({"app": "something-else"}) == []
    metrics_ports = {
        p["containerPort"]
        for _, template in ray_pod_templates()
        for p in template["spec"]["containers"][0]["ports"]
        if p["name"] == "metrics"
    }
    for rule in network_policy()["spec"]["ingress"]:
        assert rule["from"], "a rule without sources admits every pod"
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                assert peer["namespaceSelector"]["matchLabels"], "every namespace"
                if "podSelector" not in peer:  # a whole namespace: Prometheus's
                    assert {p["port"] for p in rule["ports"]} == metrics_ports


def monitoring(kind: str) -> dict[str, Any]:
    [doc] = [d for d in load(KUBERAY / "monitoring.yaml") if d["kind"] == kind]
    return doc


def test_prometheus_objects_carry_the_label_kube_prometheus_stack_selects():
    for kind in ("PodMonitor", "PrometheusRule"):
        assert monitoring(kind)["metadata"]["labels"].get("release"), kind


def _alerts() -> dict[str, str]:
    return {
        rule["alert"]: rule["expr"]
        for group in monitoring("PrometheusRule")["spec"]["groups"]
        for rule in group["rules"]
    }


def test_alerts_cover_failing_items_a_failed_rayjob_and_a_missed_night():
    exprs = " ".join(_alerts().values())
    assert "ray_overnight_items_total" in exprs
    assert 'kuberay_job_deployment_status{namespace="overnight", deployment_status="Failed"}' in (
        exprs
    )
    assert "kube_cronjob_status_last_successful_time" in exprs
    assert "26 * 3600" in exprs


def test_failing_items_alert_counts_a_series_that_appears_with_its_whole_count():
    # increase() needs two samples, so the errors of a night's first batch (a series that
    # appears already counted) must come from the series itself.
    expr = " ".join(_alerts()["OvernightItemsFailing"].split())
    assert "increase(" in expr
    assert re.search(
        r"or \( ray_overnight_items_total\{[^}]*\} unless ray_overnight_items_total", expr
    )


def test_dockerfile_exports_ray_counters_once():
    assert dockerfile_env().get("RAY_EXPORT_COUNTER_AS_GAUGE") == "0"


def test_dockerfile_has_what_the_ray_cluster_launcher_runs_in_the_container():
    runs = " ".join(rest for instruction, rest in dockerfile_instructions() if instruction == "RUN")
    for package in ("rsync", "openssh-client"):
        assert re.search(rf"apt-get install [^&]*\b{package}\b", runs), package
    assert "grep -E '^(boto3|s3transfer)==' requirements/dev.txt" in runs


def _pins(name: str) -> dict[str, str]:
    lines = (REPO / "requirements" / name).read_text().splitlines()
    return dict(re.findall(r"^([\w.-]+)==(\S+)", "\n".join(lines), re.M))


def test_launcher_boto3_taken_from_the_dev_lock_fits_the_images_botocore():
    dev, gpu = _pins("dev.txt"), _pins("gpu.txt")
    assert "boto3" not in gpu  # else the image would install it twice, maybe at two versions
    assert dev["botocore"] == gpu["botocore"]
    # boto3 X.Y.Z requires botocore >= X.Y.Z, < X.(Y+1).0.
    boto3 = tuple(int(p) for p in dev["boto3"].split("."))
    botocore = tuple(int(p) for p in gpu["botocore"].split("."))
    assert boto3[:2] == botocore[:2] and boto3 <= botocore


def test_documented_minimum_kuberay_has_every_rayjob_field_the_manifests_use():
    # backoffLimit first exists in KubeRay v1.2.0.
    for path in (INFRA / "README.md", KUBERAY / "raycluster.yaml"):
        found = re.findall(r"KubeRay >= (\d+)\.(\d+)", path.read_text())
        assert found, path
        assert (int(found[0][0]), int(found[0][1])) >= (1, 2), path


def test_readme_triggers_an_early_night_under_a_name_never_used_before():
    readme = (INFRA / "README.md").read_text()
    assert "overnight-nightly-now" not in readme
    assert "create job --from=cronjob/overnight-nightly overnight-nightly-manual-$(date -u" in (
        readme
    )
