#!/usr/bin/env python3
# Owns the deployment checks: lints the Helm chart deploy/helm/kube-watchcache (strict), renders
# it with its default values and with every ci/*.yaml, validates every rendered object and every
# plain manifest under deploy/ and deploy/sidecar/ against the Kubernetes schemas
# (kubernetes-validate, strict), and runs the template assertions below. Called by .ci/run
# (before the cargo steps) with the .venv-ci interpreter, which has the pinned helm-python-sdk
# and kubernetes-validate; by hand: <venv>/bin/python deploy/helm/check.py
#
# Every check prints PASS or FAIL with its name; the exit status is 1 if any failed. Rendered
# manifests go to a temporary directory (they hold generated keys; never printed).
from __future__ import annotations

import base64
import copy
import os
import re
import ssl
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kube-watchcache"
KUBE_VERSION = "1.33"
RELEASE, NAMESPACE = "kwc", "kube-system"

# Kinds of CRDs that kubernetes-validate has no schema for. They are skipped by name (and
# printed as SKIP); any other kind without a schema is a failure.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}

# Flags the chart passes that src/config.rs does not define yet, with the work that adds them.
# They are exempt from the "every --flag is defined" checks; a NOTE says when one has landed.
PENDING_FLAGS: dict[str, str] = {}

failures: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f" — {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)
    return ok


# ---- what the Rust source defines (so the chart follows the code, not a copy of it)


def struct_body(src: str, name: str, where: str = "src/config.rs") -> str:
    m = re.search(r"pub struct " + name + r" \{(.*?)\n\}", src, re.S)
    if not m:
        raise SystemExit(f"check.py: struct {name} not found in {where}")
    return m.group(1)


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.capitalize() for p in rest)


def file_config_keys() -> set[str]:
    """The keys of the --config file: FileConfig's fields, camelCase (serde rename_all)."""
    body = struct_body((ROOT / "src" / "config.rs").read_text(), "FileConfig")
    return {camel(f) for f in re.findall(r"pub (\w+):", body)}


def serve_flags() -> set[str]:
    """Every long flag of `serve`: #[arg(long…)] fields of ServeArgs and its flattened parts,
    plus the global flags of Cli (crates/cli/src/cli.rs)."""
    config = (ROOT / "src" / "config.rs").read_text()
    cli = (ROOT / "crates" / "cli" / "src" / "cli.rs").read_text()
    flags = set()
    for name, src, where in (
        ("Cli", cli, "crates/cli/src/cli.rs"),
        ("ServeArgs", config, "src/config.rs"),
        ("UpstreamArgs", config, "src/config.rs"),
        ("SecurityArgs", config, "src/config.rs"),
    ):
        body = struct_body(src, name, where)
        for m in re.finditer(r"#\[arg\((.*?)\)\]\s*pub (\w+):", body, re.S):
            attrs, field = m.groups()
            if re.search(r"\blong\b", attrs):
                explicit = re.search(r'long\s*=\s*"([^"]+)"', attrs)
                flags.add("--" + (explicit.group(1) if explicit else field.replace("_", "-")))
    return flags


# ---- rendering and validation


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(values: dict) -> tuple[list[dict], str, dict[str, str]]:
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    notes, objs = "", []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
        else:
            objs.extend(load_docs(text))
    return objs, notes, out


def validate(obj: dict, where: str) -> None:
    kind, api = obj.get("kind"), obj.get("apiVersion")
    name = f"{where}: schema {kind}/{obj.get('metadata', {}).get('name')}"
    if (api, kind) in CRD_KINDS:
        print(f"SKIP {name} (CRD {api} {kind}: not in kubernetes-validate's schemas)")
        return
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        check(name, True)
    except kubernetes_validate.ValidationError as e:
        check(name, False, f"{'.'.join(map(str, e.path))}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError as e:
        check(name, False, f"no schema (add it to CRD_KINDS only if it is a CRD): {e}")


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def expected_resource_rules(resources: list[str]) -> dict[str, list[str]]:
    # The wildcard needs list/watch on everything (RBAC cannot express its exclusions).
    if "*" in resources:
        return {"*": ["*"]}
    rules: dict[str, list[str]] = {}
    for r in resources:
        group, res = group_resource(r)
        rules.setdefault(group, []).append(res)
    return rules


def group_resource(r: str) -> tuple[str, str]:
    # As the proxy reads them (src/wanted.rs): `group/resource`, `resource.group`, `resource`;
    # `core/pods` is the core group.
    if "/" in r:
        group, _, res = r.rpartition("/")
    elif "." in r:
        res, _, group = r.partition(".")
    else:
        group, res = "", r
    return ("" if group == "core" else group, res)


def arg_value(args: list[str], flag: str) -> str | None:
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def secs(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|s|m|h)", duration))


def decode_cert(pem: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as f:
        f.write(pem)
    try:
        return ssl._ssl._test_decode_cert(f.name)  # CPython's PEM decoder (no extra package)
    finally:
        os.unlink(f.name)


# ---- assertions on one rendering


def assert_chart(case: str, values: dict, objs: list[dict], notes: str) -> None:
    v = helm.Chart.load(str(CHART)).merge_values(values)
    full = f"{RELEASE}-kube-watchcache"
    c = lambda what, ok, detail="": check(f"{case}: {what}", ok, detail)  # noqa: E731

    dep = one(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    ctr = next(x for x in pod["containers"] if x["name"] == "kube-watchcache")
    args = ctr["args"]
    mounts = {m["name"]: m for m in ctr.get("volumeMounts", [])}
    vols = {x["name"]: x for x in pod.get("volumes", [])}
    client_ca = bool(v["clientCA"]["configMap"] or v["clientCA"]["secret"])

    # every flag the chart passes exists in the proxy (or is a listed pending one)
    known = serve_flags()
    unknown = sorted({a.split("=", 1)[0] for a in args if a.startswith("--")} - known - set(PENDING_FLAGS))
    c("every --flag is defined in src/config.rs or crates/cli/src/cli.rs", not unknown, f"unknown: {unknown}")

    # replicas, PDB, spread, priority class
    c("replicas follow replicaCount", dep["spec"]["replicas"] == v["replicaCount"])
    pdbs = of_kind(objs, "PodDisruptionBudget")
    c("PodDisruptionBudget selects the pods", len(pdbs) == 1 and pdbs[0]["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items())
    tsc = pod.get("topologySpreadConstraints", [])
    c("topology spread across nodes", any(t["topologyKey"] == "kubernetes.io/hostname" for t in tsc))
    c("priorityClassName follows values", pod.get("priorityClassName", "") == v["priorityClassName"])

    # probes
    scheme = "HTTPS"
    for probe, path in (("startupProbe", None), ("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        p = ctr.get(probe, {}).get("httpGet", {})
        c(f"{probe} on {path or 'any path'} over {scheme}", bool(p) and (path is None or p.get("path") == path) and p.get("scheme") == scheme and p.get("port") == "https")

    # shutdown budget
    delay, grace = v["shutdown"]["delaySeconds"], v["shutdown"]["gracePeriodSeconds"]
    tgps = pod["terminationGracePeriodSeconds"]
    c(f"terminationGracePeriodSeconds {tgps} > shutdown delay {delay} + grace {grace}", tgps > delay + grace)
    c("--shutdown-grace-period matches the value", secs(arg_value(args, "--shutdown-grace-period") or "") == grace)
    sdd = arg_value(args, "--shutdown-delay-duration")
    c("--shutdown-delay-duration passed iff delaySeconds > 0", (sdd is not None and secs(sdd) == delay) if delay > 0 else sdd is None)
    cml = arg_value(args, "--cache-memory-limit")
    want_cml = v.get("cacheMemoryLimit", "")
    c("--cache-memory-limit passed iff cacheMemoryLimit is set, with its value", cml == want_cml if want_cml else cml is None)
    ccp = arg_value(args, "--consistency-check-period")
    c("--consistency-check-period passed with consistencyCheckPeriod's value", ccp is not None and ccp == v["consistencyCheckPeriod"])
    gc = arg_value(args, "--goaway-chance")
    want = v.get("goawayChance", 0)
    c("--goaway-chance passed iff goawayChance > 0, with its value", (gc is not None and float(gc) == float(want)) if want > 0 else gc is None)

    # security contexts and resources
    psc, csc = pod.get("securityContext", {}), ctr.get("securityContext", {})
    c("pod runAsNonRoot + RuntimeDefault seccomp", psc.get("runAsNonRoot") is True and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault")
    c("container non-root, read-only root fs, no privilege escalation",
      csc.get("runAsNonRoot") is True and csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False)
    c("container drops ALL capabilities, adds none", csc.get("capabilities", {}).get("drop") == ["ALL"] and not csc.get("capabilities", {}).get("add"))
    c("container seccomp RuntimeDefault", csc.get("seccompProfile", {}).get("type") == "RuntimeDefault")
    res = ctr.get("resources", {})
    c("requests and limits set", bool(res.get("requests")) and bool(res.get("limits")))

    # config file: every FileConfig key, mounted, passed with --config
    cm = next(o for o in of_kind(objs, "ConfigMap") if o["metadata"]["name"] == full)
    conf = yaml.safe_load(cm["data"]["config.yaml"])
    c("ConfigMap holds exactly the FileConfig keys", set(conf) == file_config_keys(), f"{sorted(conf)} vs {sorted(file_config_keys())}")
    c("ConfigMap holds the configured values", conf == v["config"])
    cfg = arg_value(args, "--config") or ""
    cm_mount = mounts.get("config", {}).get("mountPath", "")
    c("--config points into the mounted ConfigMap", cfg == f"{cm_mount}/config.yaml" and vols.get("config", {}).get("configMap", {}).get("name") == full)
    c("--resources not passed (the config file is the one source)", arg_value(args, "--resources") is None)

    # RBAC
    roles = {o["metadata"]["name"]: o for o in of_kind(objs, "ClusterRole")}
    bindings = of_kind(objs, "ClusterRoleBinding")
    own = roles.get(full, {"rules": []})
    named = [r for r in own["rules"] if r.get("resourceNames")]
    got = {r["apiGroups"][0]: r["resources"] for r in own["rules"] if not r.get("resourceNames")}
    c("ClusterRole rules follow config.resources (group/resource split)", got == expected_resource_rules(v["config"]["resources"]), f"{got}")
    c("ClusterRole verbs are list/watch only (no get: on * it grants nodes/proxy, pods/exec)", all(sorted(r["verbs"]) == ["list", "watch"] for r in own["rules"] if not r.get("resourceNames")))
    # Warm restarts read the kube-system Namespace (the cluster's identity, src/state).
    needs_ns = v["state"]["enabled"]
    want_named = [{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}] if needs_ns else []
    c("state on with named resources: get of the kube-system Namespace granted, nothing more by name", named == want_named, f"{named}")
    impersonating = [n for n, r in roles.items() if any("impersonate" in x.get("verbs", []) for x in r["rules"])]
    if client_ca:
        imp = roles.get(f"{full}-impersonate", {"rules": []})
        covered = {(g, res) for x in imp["rules"] for g in x["apiGroups"] for res in x["resources"]}
        want = {("", "users"), ("", "groups"), ("", "serviceaccounts"), ("authentication.k8s.io", "*")}
        c("clientCA on: impersonate granted for users/groups/serviceaccounts/uids/userextras", covered == want, f"{covered}")
        c("clientCA on: impersonate role bound", any(b["roleRef"]["name"] == f"{full}-impersonate" for b in bindings))
        c("clientCA on: --client-ca-file passed and mounted", arg_value(args, "--client-ca-file") == mounts.get("client-ca", {}).get("mountPath", "?") + "/ca.crt")
    else:
        c("clientCA off: no impersonate verb in any ClusterRole", not impersonating, f"{impersonating}")
        c("clientCA off: no --client-ca-file", arg_value(args, "--client-ca-file") is None)
    delegator = [b for b in bindings if b["roleRef"]["name"] == "system:auth-delegator"]
    sa = pod["serviceAccountName"]
    c("system:auth-delegator bound to the pod's service account", len(delegator) == 1 and delegator[0]["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}])
    review_rules = [n for n, r in roles.items() for x in r["rules"] if {"tokenreviews", "subjectaccessreviews"} & set(x.get("resources", []))]
    c("no own tokenreview/subjectaccessreview rules (auth-delegator has them)", not review_rules, f"{review_rules}")

    # Service
    svc = one(objs, "Service")
    c("Service targets the https port and selects the pods",
      svc["spec"]["ports"][0]["targetPort"] == "https" and svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items())
    c("Service has the fixed ClusterIP, if any", svc["spec"].get("clusterIP", "") == v["service"]["clusterIP"])

    # TLS per mode
    mode = v["tls"]["mode"]
    tls_secret = vols["tls"]["secret"]["secretName"]
    secrets = of_kind(objs, "Secret")
    host = f"{full}.{NAMESPACE}.svc"
    c("kubeconfig example in NOTES points at the Service", f"server: https://{host}:{v['service']['port']}" in notes)
    if mode == "selfSigned":
        s = [x for x in secrets if x["metadata"]["name"] == tls_secret]
        ok = len(s) == 1 and {"tls.crt", "tls.key", "ca.crt"} <= set(s[0]["data"])
        c("selfSigned: Secret with tls.crt, tls.key, ca.crt", ok)
        if ok:
            pem = base64.b64decode(s[0]["data"]["tls.crt"]).decode()
            key = base64.b64decode(s[0]["data"]["tls.key"]).decode()
            cert = decode_cert(pem)
            sans = {x[1] for x in cert.get("subjectAltName", ())}
            c("selfSigned: certificate names the Service", host in sans and f"{host}.{v['clusterDomain']}" in sans, f"{sans}")
            c("selfSigned: extra SANs included", set(v["tls"]["extraDNSNames"]) | set(v["tls"]["extraIPAddresses"]) <= sans, f"{sans}")
            c("selfSigned: a fixed ClusterIP is named", not v["service"]["clusterIP"] or v["service"]["clusterIP"] in sans, f"{sans}")
            c("selfSigned: key is a PEM private key", "PRIVATE KEY-----" in key)
            ann = s[0]["metadata"].get("annotations", {})
            not_after = ann.get("kube-watchcache.io/not-after", "")
            try:
                said = datetime.fromisoformat(not_after.replace("Z", "+00:00")).timestamp()
                real = ssl.cert_time_to_seconds(cert["notAfter"])
                c("selfSigned: the not-after annotation is the certificate's", abs(said - real) < 120, f"{not_after} vs {cert['notAfter']}")
            except ValueError as e:
                c("selfSigned: the not-after annotation is a time", False, f"{not_after!r}: {e}")
            c("selfSigned: the SAN digest annotation is set", len(ann.get("kube-watchcache.io/sans", "")) == 64, str(ann))
        c("selfSigned: NOTES says how to get the CA", f"get secret {tls_secret}" in notes and "ca\\.crt" in notes)
    elif mode == "certManager":
        cert = one(objs, "Certificate")
        c("certManager: Certificate writes the mounted Secret", cert["spec"]["secretName"] == tls_secret)
        c("certManager: Certificate names the Service", host in cert["spec"]["dnsNames"])
        ref = cert["spec"]["issuerRef"]
        want_ref = v["tls"]["certManager"]["issuerRef"]["name"] or f"{full}-selfsigned"
        c("certManager: issuerRef", ref["name"] == want_ref)
        if v["tls"]["certManager"]["createSelfSignedIssuer"]:
            c("certManager: own Issuer rendered", any(o["kind"] == "Issuer" and o["metadata"]["name"] == ref["name"] for o in objs))
        c("certManager: no Secret rendered by the chart", not secrets)
        c("certManager: NOTES says how to get the CA", f"get secret {tls_secret}" in notes and "ca\\.crt" in notes)
    else:
        c("existingSecret: the given Secret is mounted", tls_secret == v["tls"]["existingSecret"])
        c("existingSecret: no Secret rendered by the chart", not secrets)
        c("existingSecret: NOTES says where the CA comes from", "the CA that issued it" in notes)

    # extras
    sm = of_kind(objs, "ServiceMonitor")
    c("ServiceMonitor iff enabled", bool(sm) == v["serviceMonitor"]["enabled"])
    if sm:
        ep = sm[0]["spec"]["endpoints"][0]
        c("ServiceMonitor scrapes https /watchcache/metrics", ep["port"] == "https" and ep["scheme"] == "https" and ep["path"] == "/watchcache/metrics")
    np = of_kind(objs, "NetworkPolicy")
    c("NetworkPolicy iff enabled", bool(np) == v["networkPolicy"]["enabled"])
    if np:
        ports = [p["port"] for r in np[0]["spec"]["ingress"] for p in r.get("ports", [])]
        c("NetworkPolicy opens the container port", ports == [v["containerPort"]])
    mr = roles.get(f"{full}-metrics-reader")
    c("metrics reader ClusterRole iff enabled", bool(mr) == v["metricsReader"]["enabled"])
    if mr:
        c("metrics reader: get on nonResourceURLs /watchcache/metrics only", mr["rules"] == [{"nonResourceURLs": ["/watchcache/metrics"], "verbs": ["get"]}])

    for o in objs:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            if o["metadata"].get("namespace") != NAMESPACE:
                c(f"{o['kind']}/{o['metadata']['name']} in the release namespace", False)


def self_signed_keep_cases() -> None:
    """kwc.selfSignedKeep (the chart's own _helpers.tpl, in a scratch chart whose one template
    calls it with a Secret as `lookup` would find it): which Secrets an upgrade keeps."""
    now = datetime.now(timezone.utc)
    at = lambda days: (now + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    files = {"tls.crt": "Y3J0", "tls.key": "a2V5", "ca.crt": "Y2E="}
    def secret(ann: dict | None, data: dict = files) -> dict:
        return {"metadata": {"annotations": ann} if ann is not None else {}, "data": data}
    cases = [
        ("nothing found", {}, False),
        ("an older chart's Secret (no annotations)", secret(None), True),
        ("same names, valid for 100 days", secret({"kube-watchcache.io/not-after": at(100), "kube-watchcache.io/sans": "d1"}), True),
        ("same names, expiring in 10 days", secret({"kube-watchcache.io/not-after": at(10), "kube-watchcache.io/sans": "d1"}), False),
        ("expired", secret({"kube-watchcache.io/not-after": at(-1), "kube-watchcache.io/sans": "d1"}), False),
        ("other names (a clusterIP set since)", secret({"kube-watchcache.io/not-after": at(100), "kube-watchcache.io/sans": "d0"}), False),
        ("an unreadable time", secret({"kube-watchcache.io/not-after": "soon", "kube-watchcache.io/sans": "d1"}), False),
        ("a file missing", secret(None, {"tls.crt": "Y3J0", "ca.crt": "Y2E="}), False),
    ]
    with tempfile.TemporaryDirectory(prefix="kwc-keep-") as tmp:
        root = Path(tmp) / "keep"
        (root / "templates").mkdir(parents=True)
        (root / "Chart.yaml").write_text("apiVersion: v2\nname: keep\nversion: 0.0.1\n")
        (root / "templates" / "_helpers.tpl").write_text((CHART / "templates" / "_helpers.tpl").read_text())
        (root / "templates" / "keep.yaml").write_text(
            'keep: "{{ include "kwc.selfSignedKeep" (dict "existing" .Values.existing "sans" "d1" "now" now) }}"\n')
        chart = helm.Chart.load(str(root))
        for name, existing, want in cases:
            out = chart.render({"existing": existing}, name=RELEASE, namespace=NAMESPACE)
            got = yaml.safe_load(out["keep/templates/keep.yaml"])["keep"] == "true"
            check(f"selfSigned upgrade keeps the Secret: {name}: {want}", got == want, f"got {got}")


def must_fail(name: str, values: dict) -> None:
    try:
        render(values)
    except Exception as e:  # noqa: BLE001 - any render/schema error is the expected outcome
        check(f"rejected: {name}", True)
        print(f"     ({type(e).__name__}: {' '.join(str(e).split())[:240]})")
        return
    check(f"rejected: {name}", False, "rendered without error")


def main() -> int:
    print(f"== helm {helm.__name__} (Helm SDK {helm._native.helm_sdk_version()}); kubernetes-validate -k {KUBE_VERSION} --strict")
    cases = [("default", {})] + [(f"ci/{p.name}", yaml.safe_load(p.read_text()) or {}) for p in sorted((CHART / "ci").glob("*.yaml"))]
    check("ci/*.yaml value files exist", len(cases) > 1)
    with tempfile.TemporaryDirectory(prefix="kwc-chart-") as tmp:
        for case, values in cases:
            print(f"-- {case}")
            report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
            bad = report.get("errors", []) + [m["error"] for m in report.get("messages", []) if m["severity"] >= 2]
            check(f"{case}: helm lint --strict", not bad, "; ".join(map(str, bad)))
            try:
                objs, notes, files = render(values)
            except Exception as e:  # noqa: BLE001
                check(f"{case}: render", False, str(e))
                continue
            check(f"{case}: render", bool(objs))
            out = Path(tmp) / case.replace("/", "_")
            out.mkdir()
            for path, text in files.items():
                (out / path.replace("/", "_")).write_text(text)
            for o in objs:
                validate(o, case)
            assert_chart(case, values, objs, notes)

    print("-- a self-signed Secret found at an upgrade: kept, or made anew")
    self_signed_keep_cases()

    print("-- the values schema is strict and the templates refuse bad combinations")
    must_fail("unknown top-level key", {"bogus": 1})
    must_fail("unknown nested key", {"tls": {"mode": "selfSigned", "bogus": True}})
    must_fail("unknown key in config (the proxy's FileConfig denies it too)", {"config": {"resources": ["pods"], "bogusKey": 1}})
    must_fail("unknown TLS mode", {"tls": {"mode": "plain"}})
    must_fail("resource with two slashes", {"config": {"resources": ["a/b/c"]}})
    must_fail("a cacheMemoryLimit the proxy cannot read", {"cacheMemoryLimit": "1Gb"})
    must_fail("an exclusion that is not a resource name", {"config": {"resources": ["*", "-"]}})
    must_fail("existingSecret without a name", {"tls": {"mode": "existingSecret"}})
    must_fail("certManager without an issuer", {"tls": {"mode": "certManager"}})
    must_fail("terminationGracePeriodSeconds not above delay + grace", {"shutdown": {"delaySeconds": 5, "gracePeriodSeconds": 30}, "terminationGracePeriodSeconds": 35})
    must_fail("clientCA from both a ConfigMap and a Secret", {"clientCA": {"configMap": "a", "secret": "b"}})

    must_fail("a period the proxy cannot read", {"consistencyCheckPeriod": "5x"})
    # What the proxy reads as a period: `0` (never / at shutdown only) and Go's compound
    # durations (the schema refused both before 2026-11-29).
    for key, flag, period in [("consistencyCheckPeriod", "--consistency-check-period", "0"),
                              ("consistencyCheckPeriod", "--consistency-check-period", "1m30s"),
                              ("state.syncPeriod", "--state-sync-period", "0"),
                              ("state.syncPeriod", "--state-sync-period", "1m30s")]:
        values = {"state": {"enabled": True, "syncPeriod": period}} if key.startswith("state.") else {key: period}
        try:
            args = one(render(values)[0], "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
            check(f"{key}={period} renders {flag}={period}", arg_value(args, flag) == period, str(arg_value(args, flag)))
        except Exception as e:  # noqa: BLE001
            check(f"{key}={period} renders", False, str(e))

    print("-- plain manifests (deploy/*.yaml, deploy/sidecar/*.yaml)")
    plain = sorted((ROOT / "deploy").glob("*.yaml")) + sorted((ROOT / "deploy" / "sidecar").glob("*.yaml"))
    check("plain manifests found", len(plain) >= 4)
    by_file = {}
    for f in plain:
        rel = str(f.relative_to(ROOT))
        by_file[rel] = load_docs(f.read_text())
        for o in by_file[rel]:
            validate(o, rel)
    verbs = lambda rel: {vb for o in by_file.get(rel, []) if o["kind"] == "ClusterRole" for r in o["rules"] for vb in r["verbs"]}  # noqa: E731
    check("deploy/rbac.yaml grants no impersonate", "impersonate" not in verbs("deploy/rbac.yaml"))
    check("deploy/rbac-impersonate.yaml is the impersonation (optional)", verbs("deploy/rbac-impersonate.yaml") == {"impersonate"})
    check("deploy/rbac.yaml binds system:auth-delegator", any(o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "system:auth-delegator" for o in by_file.get("deploy/rbac.yaml", [])))
    rbac_rules = {(g, r) for o in by_file.get("deploy/rbac.yaml", []) if o["kind"] == "ClusterRole" for x in o["rules"] for g in x["apiGroups"] for r in x["resources"]}
    known = serve_flags()
    for rel, docs in by_file.items():
        for o in docs:
            spec = o.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec) if o["kind"] in ("Deployment", "Pod") else None
            for ctr in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                if not ctr.get("image", "").startswith("kube-watchcache"):
                    continue
                args = ctr.get("args", [])
                flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
                check(f"{rel}: {ctr['name']}: every --flag is defined in src/config.rs or crates/cli/src/cli.rs", flags <= known, f"unknown: {sorted(flags - known)}")
                res = (arg_value(args, "--resources") or "").split(",")
                if rel in ("deploy/deployment.yaml", "deploy/sidecar/kube-apiserver.yaml"):
                    need = {group_resource(r) for r in res}
                    check(f"{rel}: --resources covered by deploy/rbac.yaml", need <= rbac_rules, f"missing {sorted(need - rbac_rules)}")

    for flag, why in PENDING_FLAGS.items():
        state = "now defined in src/config.rs: remove it from PENDING_FLAGS" if flag in known else "not in src/config.rs yet"
        print(f"NOTE pending flag {flag} ({why}): {state}")

    print(f"== chart checks: {'FAILED: ' + ', '.join(failures) if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
