"""deploy/k8s: the kustomize base and its cpu and gpu overlays render with
`kubectl kustomize`, every object validates offline against Kubernetes'
own schemas (kubernetes-validate, strict), and the manifests keep their
promises: TLS identities from Secrets and no insecure mode, a locked-down
security context, Guaranteed QoS sized from the CPU pool, an in-memory
/dev/shm for exports, probes on the plaintext health port, a termination
grace that covers the server's drain, a PodDisruptionBudget, a
NetworkPolicy, Prometheus scraping, stable replica names for scale-out built from the
pod's namespace and a configurable cluster domain, an image that is a
placeholder until the user sets theirs (and the settings a user's own
overlay makes: image, namespace, cluster domain), and flags the server
actually has. The co-located trainer examples are validated the same
way."""

import os
import pathlib
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

import serverproc

REPO = pathlib.Path(serverproc.REPO)
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu"]
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "scrape-config.yaml"
# The newest release whose schemas the pinned kubernetes-validate ships,
# and the oldest each set of manifests supports (native sidecars and
# resource.k8s.io/v1 need 1.34; the rest, with its preStop sleep, 1.30).
LATEST = kubernetes_validate.latest_version()
OLDEST = {"kustomize": "1.30.0", "examples": "1.34.0"}
SERVER_IMAGE = "materializerd"
# What the manifests carry until a user sets their image: a name under the
# reserved .invalid domain, which never resolves.
PLACEHOLDER = "registry.invalid/materializerd"
SETTINGS = "materializerd-settings"
MAIN_SERVICE = "materializer.v1.Materializer"
OVERHEAD_FLOOR = 2 << 30


def kubectl():
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl (with its built-in kustomize, 1.27 or newer) is "
                    "needed to render deploy/k8s; install it and rerun",
                    pytrace=False)
    return path


def render(name, root=K8S):
    out = subprocess.run([kubectl(), "kustomize", str(root / name)],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"kubectl kustomize {name}: {out.stderr}"
    return [o for o in yaml.safe_load_all(out.stdout) if o]


@pytest.fixture(scope="module")
def rendered():
    return {name: render(name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def examples():
    return {p.name: [o for o in yaml.safe_load_all(p.read_text()) if o]
            for p in EXAMPLES}


def one(objects, kind):
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def pod_spec(obj):
    return obj["spec"]["template"]["spec"]


def image_parts(image):
    """(repository, tag or None, digest or None) of an image reference."""
    image, _, digest = image.partition("@")
    repository, tag = image, None
    if ":" in image.rsplit("/", 1)[-1]:
        repository, tag = image.rsplit(":", 1)
    return repository, tag, digest or None


def server_containers(spec):
    return [c for c in spec.get("containers", []) + spec.get("initContainers", [])
            if image_parts(c["image"])[0].split("/")[-1] == SERVER_IMAGE]


def expanded_args(container):
    """The container's args as the kubelet expands $(VAR) from its env
    (downward-API variables stay as $(VAR))."""
    env = {e["name"]: e["value"] for e in container.get("env", [])
           if "value" in e}
    return [re.sub(r"\$\((\w+)\)",
                   lambda m: env.get(m.group(1), m.group(0)), a)
            for a in container.get("args", [])]


def flags(container):
    out = {}
    for arg in expanded_args(container):
        name, _, value = arg.partition("=")
        out[name] = value
    return out


def pod_env(container, pod_name, namespace, objects):
    """The container's environment as the kubelet gives it to the pod
    `pod_name` in `namespace`: literal values, the downward API's name
    and namespace, and ConfigMap keys from the rendered `objects`."""
    config_maps = {o["metadata"]["name"]: o for o in objects
                   if o["kind"] == "ConfigMap"}
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        source = e["valueFrom"]
        if "fieldRef" in source:
            field = source["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": pod_name,
                              "metadata.namespace": namespace}[field]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            cm = config_maps.get(ref["name"])
            assert cm is not None, f"no ConfigMap {ref['name']} is rendered"
            assert cm["metadata"].get("namespace", "default") == namespace, \
                cm["metadata"]
            env[e["name"]] = cm["data"][ref["key"]]
    return env


def advertised(objects, ordinal=0):
    """What replica `ordinal` of the rendered StatefulSet passes to
    --advertise, with every $(VAR) expanded as the kubelet does."""
    ss = one(objects, "StatefulSet")
    namespace = ss["metadata"].get("namespace", "default")
    c = server_containers(pod_spec(ss))[0]
    env = pod_env(c, f"{ss['metadata']['name']}-{ordinal}", namespace, objects)
    value = flags(c)["--advertise"]
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def quantity(text):
    """Bytes of a Kubernetes quantity or of one of the server's sizes."""
    text = str(text)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|KiB|MiB|GiB|TiB|k|M|G)?",
                     text)
    assert m, f"unexpected size {text!r}"
    scale = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9}
    for i, unit in enumerate(("Ki", "Mi", "Gi", "Ti"), start=1):
        scale[unit] = scale[unit + "B"] = 1 << (10 * i)
    return int(float(m.group(1)) * scale[m.group(2)])


def cpu_quantity(text):
    text = str(text)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def all_pod_workloads(rendered, examples):
    for name, objects in list(rendered.items()) + list(examples.items()):
        for o in objects:
            if o["kind"] in ("StatefulSet", "Job", "Deployment"):
                yield name, o


# ---- rendering and schemas ------------------------------------------------


def test_every_object_validates_against_kubernetes_schemas(rendered, examples):
    checked = 0
    for group, sets in (("kustomize", rendered), ("examples", examples)):
        for name, objects in sets.items():
            assert objects, name
            for version in (LATEST, OLDEST[group]):
                for o in objects:
                    try:
                        kubernetes_validate.validate(o, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        pytest.fail(f"{name}: {o['kind']}/{o['metadata']['name']}"
                                    f" is invalid for Kubernetes {version}: "
                                    f"{e.message} at {list(e.path)}")
                    checked += 1
    print(f"{checked} object validations against Kubernetes {LATEST} and "
          "the oldest supported releases")


def test_overlays_render_the_same_objects(rendered):
    kinds = {n: sorted((o["kind"], o["metadata"]["name"]) for o in objs)
             for n, objs in rendered.items()}
    assert kinds["overlays/cpu"] == kinds["overlays/gpu"] == kinds["base"]
    assert {k for k, _ in kinds["base"]} == {
        "StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy",
        "ConfigMap"}
    for overlay in ("overlays/cpu", "overlays/gpu"):
        for o in rendered[overlay]:
            assert o["metadata"].get("namespace") == "materializer", o["kind"]


# ---- identity ---------------------------------------------------------------


def test_no_insecure_identity_anywhere(rendered, examples):
    # Every deployable file (the README may explain the flag).
    for f in (REPO / "deploy").rglob("*"):
        if f.is_file() and f.suffix != ".md":
            assert "allow_insecure_remote" not in f.read_text(errors="replace"), f
    for name, workload in all_pod_workloads(rendered, examples):
        for c in server_containers(pod_spec(workload)):
            f = flags(c)
            assert "--tls_cert" in f and "--tls_key" in f, (name, f)
            assert "--tls_client_ca" in f or "--token_file" in f, (name, f)
            if name in rendered:  # the replicas: mTLS and tokens both
                assert "--tls_client_ca" in f and "--token_file" in f, f


def test_certificates_and_tokens_come_from_secrets(rendered, examples):
    for name, workload in all_pod_workloads(rendered, examples):
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in server_containers(spec):
            f = flags(c)
            for flag in ("--tls_cert", "--tls_key", "--tls_client_ca",
                         "--token_file"):
                if flag not in f:
                    continue
                mounts = [m for m in c["volumeMounts"]
                          if f[flag].startswith(m["mountPath"].rstrip("/") + "/")]
                assert len(mounts) == 1, (name, flag, f[flag])
                assert mounts[0].get("readOnly") is True, (name, mounts[0])
                volume = volumes[mounts[0]["name"]]
                assert "secret" in volume, (name, flag, volume)
                assert volume["secret"].get("optional") is not True
                # Readable by the server's group only.
                assert volume["secret"]["defaultMode"] & 0o007 == 0, volume


# ---- security context -------------------------------------------------------


def test_security_context_is_locked_down(rendered, examples):
    for name, workload in all_pod_workloads(rendered, examples):
        spec = pod_spec(workload)
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] != 0 and pod["runAsGroup"] != 0, name
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert "add" not in sc["capabilities"], (name, c["name"])
            assert sc.get("privileged", False) is False, (name, c["name"])
            assert sc.get("runAsUser", pod["runAsUser"]) != 0
        for c in server_containers(spec):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            # What it writes goes to volumes.
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts, (name, mounts)
        assert not spec.get("hostIPC") and not spec.get("hostPID") and \
            not spec.get("hostNetwork"), name


# ---- resources ----------------------------------------------------------------


def test_guaranteed_qos_sized_from_the_cpu_pool(rendered):
    report = []
    for name, objects in rendered.items():
        spec = pod_spec(one(objects, "StatefulSet"))
        for c in spec["containers"] + spec.get("initContainers", []):
            requests = c["resources"]["requests"]
            limits = c["resources"]["limits"]
            # Guaranteed: cpu and memory limits set, requests equal to them
            # (and every extended resource the same).
            assert "cpu" in limits and "memory" in limits, (name, c["name"])
            assert requests == limits, (name, c["name"])
        server = server_containers(spec)[0]
        f = flags(server)
        memory = quantity(server["resources"]["limits"]["memory"])
        cpus = cpu_quantity(server["resources"]["limits"]["cpu"])
        assert int(f["--workers"]) == cpus, (name, f["--workers"], cpus)
        shm = next(v for v in spec["volumes"] if v["name"] == shm_volume(server))
        shm_bytes = quantity(shm["emptyDir"]["sizeLimit"])
        assert shm_bytes <= memory, name
        devices = f["--devices"].split(",")
        if "cpu" in devices or f["--devices"] == "auto":
            pool = quantity(f["--cpu_capacity"])
            # Exports are arenas too: /dev/shm holds any of them, inside
            # the pool, and the memory limit has room beyond the pool.
            assert shm_bytes >= pool, (name, shm_bytes, pool)
            assert memory >= pool + OVERHEAD_FLOOR, (name, memory, pool)
            report.append(f"{name}: pool {pool >> 30} GiB, memory "
                          f"{memory >> 30} GiB, /dev/shm {shm_bytes >> 30} GiB")
        else:
            assert all(d.startswith("cuda:") for d in devices), devices
            assert memory >= shm_bytes + OVERHEAD_FLOOR, name
            report.append(f"{name}: pool {','.join(devices)}, memory "
                          f"{memory >> 30} GiB, /dev/shm {shm_bytes >> 30} GiB")
    print("; ".join(report))


def shm_volume(container):
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert len(mounts) == 1, container["name"]
    return mounts[0]["name"]


def test_dev_shm_is_memory_backed_and_sized(rendered, examples):
    for name, workload in all_pod_workloads(rendered, examples):
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"] + spec.get("initContainers", []):
            mounts = [m for m in c.get("volumeMounts", [])
                      if m["mountPath"] == "/dev/shm"]
            for m in mounts:
                v = volumes[m["name"]]
                assert v["emptyDir"]["medium"] == "Memory", (name, v)
                assert quantity(v["emptyDir"]["sizeLimit"]) > 64 << 20, (name, v)
        # The replicas export CPU arenas: they must have one.
        if name in rendered:
            shm_volume(server_containers(spec)[0])


def test_gpu_overlay_requests_gpus_and_tolerates_their_taint(rendered):
    for name, objects in rendered.items():
        spec = pod_spec(one(objects, "StatefulSet"))
        server = server_containers(spec)[0]
        gpus = server["resources"]["limits"].get("nvidia.com/gpu")
        tolerations = [t for t in spec.get("tolerations", [])
                       if t["key"] == "nvidia.com/gpu"]
        devices = flags(server)["--devices"].split(",")
        if name == "overlays/gpu":
            assert gpus is not None and int(gpus) >= 1
            assert server["resources"]["requests"]["nvidia.com/gpu"] == gpus
            assert any(t["effect"] == "NoSchedule" and
                       t["operator"] in ("Exists", "Equal") for t in tolerations)
            assert devices == [f"cuda:{i}" for i in range(int(gpus))], devices
        else:
            assert gpus is None and not tolerations, name
            assert devices == ["cpu"], devices


# ---- probes and termination -------------------------------------------------


def test_probes_use_the_plaintext_health_listener(rendered, examples):
    for name, workload in all_pod_workloads(rendered, examples):
        for c in server_containers(pod_spec(workload)):
            f = flags(c)
            health = port_of(f["--health_listen"])
            assert health != port_of(f["--listen"]), name
            # The kubelet reaches the pod IP: not a loopback-only health port.
            assert f["--health_listen"].startswith("0.0.0.0:"), name
            probes = {k: c[k] for k in ("startupProbe", "readinessProbe",
                                        "livenessProbe") if k in c}
            assert "startupProbe" in probes, name
            for kind, probe in probes.items():
                assert "grpc" in probe, (name, kind)
                assert probe["grpc"]["port"] == health, (name, kind)
            if "readinessProbe" in probes:
                assert probes["readinessProbe"]["grpc"]["service"] == MAIN_SERVICE
            if name in rendered:
                assert {"startupProbe", "readinessProbe", "livenessProbe"} <= \
                    set(probes), name
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                assert ports["health"] == health


def server_drain_seconds():
    """The drain deadline main.cc gives Shutdown on SIGTERM."""
    text = (REPO / "server" / "main.cc").read_text()
    m = re.search(r"Shutdown\(absl::Seconds\((\d+)\)\)", text)
    assert m, "server/main.cc: no Shutdown(absl::Seconds(N)) on SIGTERM"
    return int(m.group(1))


def test_termination_grace_covers_the_drain(rendered):
    drain = server_drain_seconds()
    for name, objects in rendered.items():
        spec = pod_spec(one(objects, "StatefulSet"))
        c = server_containers(spec)[0]
        pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = spec["terminationGracePeriodSeconds"]
        # The preStop sleep and the drain run within the grace period, with
        # room for queued work and teardown.
        assert grace >= pre_stop + drain + 10, (name, grace, pre_stop, drain)
        # A draining server answers NOT_SERVING; liveness must not kill it
        # before the grace period is over.
        live = c["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > grace, name


# ---- disruption, network, metrics, scale-out --------------------------------


def test_pod_disruption_budget_covers_the_replicas(rendered):
    for name, objects in rendered.items():
        pdb = one(objects, "PodDisruptionBudget")
        labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), name
        assert pdb["spec"]["maxUnavailable"] == 1, name


def test_network_policy_admits_clients_and_prometheus_only(rendered):
    for name, objects in rendered.items():
        policy = one(objects, "NetworkPolicy")["spec"]
        ss = one(objects, "StatefulSet")
        labels = ss["spec"]["template"]["metadata"]["labels"]
        f = flags(server_containers(pod_spec(ss))[0])
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
        assert policy["egress"] == [], "the server needs no outbound traffic"
        admitted = {}
        for rule in policy["ingress"]:
            assert rule.get("from"), f"{name}: a rule admits every source"
            for p in rule["ports"]:
                admitted[p["port"]] = rule["from"]
        grpc, metrics = port_of(f["--listen"]), port_of(f["--metrics_listen"])
        assert set(admitted) == {grpc, metrics}, admitted
        assert admitted[grpc] == [{"podSelector": {"matchLabels": {
            "materializer-client": "true"}}}]
        assert all("namespaceSelector" in s for s in admitted[metrics])


def test_prometheus_scrapes_the_metrics_port(rendered):
    scrape = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    job = next(j for j in scrape if j["job_name"] == "materializerd")
    keep = {tuple(r["source_labels"]): r["regex"]
            for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == \
        "materializerd"
    for name, objects in rendered.items():
        template = one(objects, "StatefulSet")["spec"]["template"]
        c = server_containers(template["spec"])[0]
        port = port_of(flags(c)["--metrics_listen"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports[keep[("__meta_kubernetes_pod_container_port_name",)]] == port
        notes = template["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert int(notes["prometheus.io/port"]) == port
        assert notes["prometheus.io/path"] == job["metrics_path"] == "/metrics"
    namespaces = job["kubernetes_sd_configs"][0]["namespaces"]["names"]
    assert namespaces == [rendered["overlays/cpu"][0]["metadata"]["namespace"]]


def test_replicas_have_stable_advertised_names(rendered):
    for name, objects in rendered.items():
        ss, svc = one(objects, "StatefulSet"), one(objects, "Service")
        assert ss["spec"]["serviceName"] == svc["metadata"]["name"]
        assert svc["spec"]["clusterIP"] == "None", "headless"
        labels = ss["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        c = server_containers(pod_spec(ss))[0]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.namespace"
        f = flags(c)
        # Nothing of the namespace or the cluster domain is written in: the
        # pod's namespace from the downward API, the domain from the
        # settings ConfigMap (cluster.local unless an overlay says else).
        assert f["--advertise"] == (
            f"$(POD_NAME).{svc['metadata']['name']}.$(POD_NAMESPACE)"
            f".svc.$(CLUSTER_DOMAIN):{port_of(f['--listen'])}"), f["--advertise"]
        namespace = ss["metadata"].get("namespace", "default")
        assert advertised(objects, 1) == (
            f"{ss['metadata']['name']}-1.{svc['metadata']['name']}."
            f"{namespace}.svc.cluster.local:{port_of(f['--listen'])}")
        assert [p["port"] for p in svc["spec"]["ports"]] == \
            [port_of(f["--listen"])]


# ---- the image and a user's settings ------------------------------------


def test_images_are_placeholders_until_set(rendered, examples):
    """Until a user sets theirs, every image is a name under the reserved
    .invalid domain (a forgotten setting fails to pull under that name; it
    never pulls something else), and the server's is tagged with the image
    variant its pods need."""
    variant = {"overlays/cpu": "cpu", "overlays/gpu": "gpu",
               "colocated-trainer-cpu.yaml": "cpu",
               "colocated-trainer-gpu.yaml": "gpu"}
    for name, workload in all_pod_workloads(rendered, examples):
        spec = pod_spec(workload)
        for c in spec["containers"] + spec.get("initContainers", []):
            repository, tag, _ = image_parts(c["image"])
            assert repository.split("/")[0] == "registry.invalid", \
                (name, c["image"])
            assert tag != "latest", (name, c["image"])
        servers = server_containers(spec)
        assert servers, name
        for c in servers:
            assert image_parts(c["image"]) == \
                (PLACEHOLDER, variant.get(name), None), (name, c["image"])
        if name in variant:
            gpus = flags(servers[0])["--devices"].startswith("cuda:")
            assert (variant[name] == "gpu") == gpus, (name, c["image"])


USER_REPOSITORY = "registry.example.com:5000/ml/materializerd"
USER_DIGEST = "sha256:" + "0123456789abcdef" * 4
USER_NAMESPACE = "ml-serving"
USER_DOMAIN = "k8s.example.internal"


def with_user_settings(kustomization, image):
    """`kustomization` with the user's namespace, image (by the
    placeholder's name, as `kustomize edit set image` writes it) and
    cluster domain."""
    k = dict(kustomization)
    k["namespace"] = USER_NAMESPACE
    k["images"] = [i for i in k.get("images", [])
                   if i["name"] != PLACEHOLDER] + [image]
    k["configMapGenerator"] = k.get("configMapGenerator", []) + [{
        "name": SETTINGS, "behavior": "merge",
        "literals": [f"cluster-domain={USER_DOMAIN}"]}]
    return k


@pytest.mark.parametrize("where", ["own overlay", "edited overlay"])
@pytest.mark.parametrize("pin", ["tag", "digest"])
@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_user_sets_image_namespace_and_cluster_domain(overlay, pin, where,
                                                      tmp_path):
    """The two ways deploy/README.md gives: an overlay of one's own on top
    of ours, or ours edited in place. Either way the rendered replicas run
    the user's image in the user's namespace and advertise their names
    under the user's cluster domain, and nothing of the defaults is left."""
    variant = overlay.split("/")[1]
    image = {"name": PLACEHOLDER, "newName": USER_REPOSITORY}
    if pin == "tag":
        image["newTag"] = f"1.4.2-{variant}"
        expected = f"{USER_REPOSITORY}:1.4.2-{variant}"
    else:
        image["digest"] = USER_DIGEST
        expected = f"{USER_REPOSITORY}@{USER_DIGEST}"
    if where == "own overlay":
        root, name = tmp_path, "mine"
        (root / name).mkdir()
        theirs = {"apiVersion": "kustomize.config.k8s.io/v1beta1",
                  "kind": "Kustomization",
                  "resources": [os.path.relpath(K8S / overlay, root / name)]}
    else:
        root, name = tmp_path / "k8s", overlay
        shutil.copytree(K8S, root)
        theirs = yaml.safe_load((root / name / "kustomization.yaml").read_text())
    (root / name / "kustomization.yaml").write_text(
        yaml.safe_dump(with_user_settings(theirs, image)))
    objects = render(name, root)

    assert {o["metadata"].get("namespace") for o in objects} == \
        {USER_NAMESPACE}, [(o["kind"], o["metadata"]) for o in objects]
    ss = one(objects, "StatefulSet")
    assert [c["image"] for c in server_containers(pod_spec(ss))] == [expected]
    port = port_of(flags(server_containers(pod_spec(ss))[0])["--listen"])
    assert advertised(objects, 0) == (
        f"materializerd-0.materializerd.{USER_NAMESPACE}.svc.{USER_DOMAIN}"
        f":{port}")
    text = yaml.safe_dump_all(objects)
    assert "registry.invalid" not in text and "cluster.local" not in text
    for o in objects:
        kubernetes_validate.validate(o, LATEST, strict=True)


def test_every_flag_the_manifests_pass_is_a_server_flag(rendered, examples):
    """A flag the binary does not know stops it at start-up
    (crash-looping pods), so the manifests are checked against the
    server under test."""
    out = subprocess.run([serverproc.SERVER_BIN, "--helpfull"],
                         capture_output=True, text=True, timeout=60)
    known = set(re.findall(r"^\s+(--\w+)", out.stdout, re.MULTILINE))
    assert "--listen" in known, out.stdout[:2000]
    unknown = set()
    for name, workload in all_pod_workloads(rendered, examples):
        for c in server_containers(pod_spec(workload)):
            unknown |= {(name, f) for f in flags(c) if f not in known}
    assert not unknown, f"flags materializerd does not have: {sorted(unknown)}"


def test_example_trainers_set_only_variables_the_sdk_reads():
    """The co-located examples configure the trainer through the SDK's
    (and matctl's) MATERIALIZER_* variables, none it would ignore."""
    import re
    examples = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "examples"
    env_py = (pathlib.Path(__file__).resolve().parents[2] / "python" / "materializer"
              / "client" / "env.py").read_text()
    read = set(re.findall(r'"(MATERIALIZER_[A-Z_]+)"', env_py))
    used = set()
    for f in examples.glob("*.yaml"):
        used |= set(re.findall(r"name: (MATERIALIZER_[A-Z_]+)", f.read_text()))
    assert used and used <= read, used - read
