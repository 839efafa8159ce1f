#!/usr/bin/env bash
# it_k8s_manifests.sh - the Kubernetes manifests (deploy/kubernetes) render
# and are valid, and agree with the config they carry.
#
# Each kustomization (the base, overlays/replicas) is rendered with
# `kubectl kustomize` and validated offline against the Kubernetes JSON
# schemas of two versions (1.29, the oldest with everything used here,
# and kubernetes-validate's newest) with `kubernetes-validate --strict`
# (unknown fields are errors), from PyPI in a venv made once under
# build/k8s-venv; a copy with a misspelt field must fail, so the validator
# is known to look. Then what the schemas cannot see: the config in the
# ConfigMap loads in ps-server; one shard pod per cluster.servers entry,
# named as the servers are (ps-shard-K.ps-shards: StatefulSet name, ordinal,
# headless Service); backups likewise; the Job's completions are
# cluster.workers; the programs run without a wrapper (ps-server --shard
# auto, ps-worker with no rank); the key files the config names are the
# Secret files mounted there; workers hold no replication key or metrics
# token; probes and the scrape annotation name the stats.http port.
#
# Skipped with the reason without kubectl (Debian's kubernetes-client) or
# when the venv cannot be made (no PyPI). Prints "N%: Checks" for
# run-tests.sh.
set -u
cd "$(dirname "$0")/.." || exit 1
skip() { echo "SKIP: it_k8s_manifests: $*"; exit 77; }

command -v kubectl > /dev/null ||
  skip "kubectl not found (scripts/install-deps.sh installs Debian's kubernetes-client)"
python3 -c 'import yaml' 2> /dev/null || skip "python3-yaml missing (scripts/install-deps.sh)"
[ -x bin/ps-server ] || skip "run 'make' first"

venv=build/k8s-venv
kv=$venv/bin/kubernetes-validate
if [ ! -x "$kv" ]; then
  rm -rf "$venv"
  mkdir -p build
  if ! out=$( (python3 -m venv "$venv" &&
    timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate) 2>&1); then
    rm -rf "$venv"
    skip "cannot make the venv with kubernetes-validate from PyPI: $(printf '%s' "$out" | tail -1)"
  fi
fi

tmp=$(mktemp -d /tmp/ps-k8s-manifests.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

for k in base overlays/replicas; do
  name=${k##*/}
  if ! kubectl kustomize "deploy/kubernetes/$k" > "$tmp/$name.yaml" 2> "$tmp/$name.err"; then
    bad "kubectl kustomize deploy/kubernetes/$k: $(cat "$tmp/$name.err")"
    continue
  fi
  ok
  for v in 1.29.0 ""; do
    if "$kv" --quiet --strict ${v:+-k "$v"} "$tmp/$name.yaml" > "$tmp/kv.out" 2>&1; then
      ok
    else
      bad "$k does not validate against Kubernetes ${v:-(newest)}: $(cat "$tmp/kv.out")"
    fi
  done
  # the validator rejects what it should: an unknown field
  sed 's/publishNotReadyAddresses:/publishNotReadyAdresses:/' "$tmp/$name.yaml" > "$tmp/bad.yaml"
  if "$kv" --quiet --strict "$tmp/bad.yaml" > "$tmp/kv.out" 2>&1; then
    bad "kubernetes-validate --strict accepted a misspelt field"
  elif grep -q "publishNotReadyAdresses" "$tmp/kv.out"; then
    ok
  else
    bad "kubernetes-validate failed on the misspelt field without naming it: $(cat "$tmp/kv.out")"
  fi
  # what the schemas cannot see
  if python3 - "$tmp/$name.yaml" "$tmp" "deploy/kubernetes/examples/servicemonitor.yaml" \
    > "$tmp/py.out" 2>&1 <<'EOF'; then
import os, re, subprocess, sys, yaml

path, tmp, monitor = sys.argv[1:4]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
errors = []
def check(cond, what):
    if not cond:
        errors.append(what)

cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("ps-config")]
check(len(cms) == 1, f"one ConfigMap ps-config expected, found {len(cms)}")
cm = cms[0]
cfg_text = cm["data"]["cluster.yaml"]
cfg = yaml.safe_load(cfg_text)
open(os.path.join(tmp, "cluster.yaml"), "w").write(cfg_text)
r = subprocess.run(["bin/ps-server", "--config", os.path.join(tmp, "cluster.yaml"), "--dump-config"],
                   capture_output=True, text=True)
check(r.returncode == 0, f"ps-server does not load the ConfigMap's config: {r.stderr.strip()}")
cl = cfg["cluster"]
check(cl.get("listen_any") is True, "cluster.listen_any must be true: a pod binds its own address")
http_port = int(cfg["stats"]["http"].rsplit(":", 1)[1])
check(cfg["stats"].get("port_per_shard") is False,
      "stats.port_per_shard must be false: every pod serves its probes on one port")

def pod(obj):
    return obj["spec"]["template"]["spec"]
def container(obj):
    cs = pod(obj)["containers"]
    check(len(cs) == 1, f"{obj['metadata']['name']}: one container expected")
    return cs[0]
def mounts(obj):
    """path -> (secret or configmap name, key files) of the container's mounts"""
    vols = {v["name"]: v for v in pod(obj)["volumes"]}
    out = {}
    for m in container(obj).get("volumeMounts", []):
        v = vols.get(m["name"])
        if v is None:
            continue
        src = v.get("secret", {}).get("secretName") or v.get("configMap", {}).get("name")
        out[m["mountPath"].rstrip("/")] = (src, v)
    return out
def secret_mounted(obj, file_path):
    d = os.path.dirname(file_path)
    m = mounts(obj).get(d)
    return m[0] if m else None

def check_set(sts_name, svc_name, entries, replica):
    sts = by.get(("StatefulSet", sts_name))
    svc = by.get(("Service", svc_name))
    check(sts is not None and svc is not None, f"StatefulSet {sts_name} and Service {svc_name} expected")
    if sts is None or svc is None:
        return
    check(sts["spec"]["serviceName"] == svc_name, f"{sts_name}: serviceName is not {svc_name}")
    check(sts["spec"]["replicas"] == len(entries),
          f"{sts_name}: replicas {sts['spec']['replicas']}, the config names {len(entries)}")
    check(sts["spec"].get("podManagementPolicy") == "Parallel", f"{sts_name}: pods must start at once")
    for k, e in enumerate(entries):
        host, port = e.rsplit(":", 1)
        check(host == f"{sts_name}-{k}.{svc_name}",
              f"{sts_name}: config entry {k} is {host}, its pod is {sts_name}-{k}.{svc_name}")
    check(svc["spec"].get("clusterIP") == "None", f"{svc_name}: not headless")
    check(svc["spec"].get("publishNotReadyAddresses") is True,
          f"{svc_name}: names must exist before the pods are ready")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
          f"{svc_name}: its selector does not select {sts_name}'s pods")
    c = container(sts)
    cmd = c["command"] + c.get("args", [])
    check(cmd[0] == "ps-server", f"{sts_name}: runs {cmd[0]}, not ps-server (no wrapper script)")
    check(cmd[cmd.index("--shard") + 1] == "auto" if "--shard" in cmd else False,
          f"{sts_name}: --shard auto expected: {cmd}")
    check(("--replica" in cmd and cmd[cmd.index("--replica") + 1] == "1") == (replica == 1),
          f"{sts_name}: --replica 1 on backups only: {cmd}")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get("ps") == int(entries[0].rsplit(":", 1)[1]), f"{sts_name}: port ps is not the servers port")
    check(ports.get("metrics") == http_port, f"{sts_name}: port metrics is not stats.http's")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"),
                        ("startupProbe", "/healthz")):
        g = c.get(probe, {}).get("httpGet", {})
        check(g.get("path") == path and g.get("port") in ("metrics", http_port),
              f"{sts_name}: {probe} should GET {path} on the metrics port: {g}")
    ann = sts["spec"]["template"]["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(http_port),
          f"{sts_name}: the scrape annotations do not name port {http_port}")
    check(pod(sts).get("terminationGracePeriodSeconds", 30) >= 60,
          f"{sts_name}: terminationGracePeriodSeconds leaves no time for a checkpoint")
    sec = cfg["security"]
    check(secret_mounted(sts, sec["secret_file"]) == "ps-cluster-key",
          f"{sts_name}: {sec['secret_file']} is not Secret ps-cluster-key")
    check(secret_mounted(sts, cfg["stats"]["token_file"]) == "ps-metrics-token",
          f"{sts_name}: {cfg['stats']['token_file']} is not Secret ps-metrics-token")
    if cl.get("replicas", 0):
        check(secret_mounted(sts, sec["repl_key_file"]) == "ps-repl-key",
              f"{sts_name}: {sec['repl_key_file']} is not Secret ps-repl-key")
    ckpt = cfg["checkpoint"]["dir"]
    check(any(m["name"] == "data" and (ckpt + "/").startswith(m["mountPath"].rstrip("/") + "/")
              for m in c.get("volumeMounts", [])),
          f"{sts_name}: checkpoint.dir {ckpt} is not on the volume 'data'")
    check(any(t["metadata"]["name"] == "data" for t in sts["spec"].get("volumeClaimTemplates", [])),
          f"{sts_name}: no volumeClaimTemplates 'data' for the checkpoints")

check_set("ps-shard", "ps-shards", cl["servers"], 0)
if cl.get("replicas", 0):
    check_set("ps-backup", "ps-backups", cl["backups"], 1)
else:
    check(("StatefulSet", "ps-backup") not in by, "backups without cluster.replicas")

job = by.get(("Job", "ps-workers"))
check(job is not None, "Job ps-workers expected")
if job:
    s = job["spec"]
    check(s.get("completionMode") == "Indexed", "the workers' Job must be Indexed (JOB_COMPLETION_INDEX)")
    check(s.get("completions") == cl["workers"] and s.get("parallelism") == cl["workers"],
          f"Job completions/parallelism {s.get('completions')}/{s.get('parallelism')}, "
          f"cluster.workers {cl['workers']}")
    c = container(job)
    cmd = c["command"] + c.get("args", [])
    check(cmd[0] == "ps-worker" and "--rank" not in cmd and "-r" not in cmd,
          f"workers: ps-worker without --rank expected (the rank is JOB_COMPLETION_INDEX): {cmd}")
    check(not any(e["name"] in ("PS_RANK",) for e in c.get("env", [])), "workers: PS_RANK would override the index")
    srcs = {v[0] for v in mounts(job).values()}
    check(secret_mounted(job, cfg["security"]["secret_file"]) == "ps-cluster-key",
          "workers: the cluster key is not mounted where the config names it")
    check("ps-repl-key" not in srcs and "ps-metrics-token" not in srcs,
          f"workers must not hold the replication key or the metrics token: {sorted(srcs)}")
    rules = s.get("podFailurePolicy", {}).get("rules", [])
    check(any(r["action"] == "FailJob" and 2 in r.get("onExitCodes", {}).get("values", [])
              for r in rules), "workers: exit status 2 (config) should fail the Job")

# the ServiceMonitor example selects the shards' Service and names its port
mon = yaml.safe_load(open(monitor))
svc = by[("Service", "ps-shards")]
check(all(svc["metadata"]["labels"].get(k) == v for k, v in mon["spec"]["selector"]["matchLabels"].items()),
      "examples/servicemonitor.yaml does not select Service ps-shards")
check(mon["spec"]["endpoints"][0]["port"] in [p["name"] for p in svc["spec"]["ports"]],
      "examples/servicemonitor.yaml names a port the Service lacks")

for e in errors:
    print(e)
sys.exit(1 if errors else 0)
EOF
    ok
  else
    bad "deploy/kubernetes/$k: $(cat "$tmp/py.out")"
  fi
done

echo "$(((checks - fails) * 100 / (checks ? checks : 1)))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
