#!/usr/bin/env python3
"""Proves scripts/check_configs.py fails where it must: each test copies the shipped configs
into a temporary directory, makes one realistic mistake (mostly a misspelled field), and
asserts the check reports it. `make check-configs` runs this after the check itself."""

from __future__ import annotations

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_configs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["envoy", "docker-compose.yml", ".env.example", "fakes/Dockerfile"]


class CheckConfigsFails(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="check-configs-"))
        for rel in SHIPPED:
            src, dst = ROOT / rel, self.tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                shutil.copy(src, dst)

    def tearDown(self) -> None:
        shutil.rmtree(self.tmp)

    def mutate(self, rel: str, old: str, new: str) -> None:
        path = self.tmp / rel
        text = path.read_text()
        self.assertIn(old, text, f"the test's premise: `{old}` is in {rel}")
        path.write_text(text.replace(old, new, 1))

    def assert_fails(self, *needles: str) -> None:
        problems = check_configs.run(self.tmp)
        report = "\n".join(problems.lines)
        self.assertTrue(problems, "the check passed, but it must fail")
        for needle in needles:
            self.assertIn(needle, report, f"expected `{needle}` in:\n{report}")

    # The baseline: the copy as shipped passes, so every failure below is the mutation's.
    def test_shipped_configs_pass(self) -> None:
        problems = check_configs.run(self.tmp)
        self.assertFalse(problems, "\n".join(problems.lines))

    # ---- Envoy bootstraps: Envoy's own API types --------------------------------------
    def test_misspelled_bootstrap_field(self) -> None:
        self.mutate("envoy/envoy.yaml", "per_connection_buffer_limit_bytes:", "per_connection_buffer_limit_byte:")
        self.assert_fails("envoy/envoy.yaml", "per_connection_buffer_limit_byte")

    def test_misspelled_field_inside_a_typed_config(self) -> None:
        self.mutate("envoy/envoy.yaml", "allow_on_headers_stop_iteration: true", "allow_on_header_stop_iteration: true")
        self.assert_fails("envoy/envoy.yaml", "allow_on_header_stop_iteration")

    def test_misspelled_access_log_field(self) -> None:
        self.mutate("envoy/envoy.yaml", "text_format_source:", "text_format_sources:")
        self.assert_fails("envoy/envoy.yaml", "text_format_sources")

    def test_misspelled_tls_field(self) -> None:
        self.mutate("envoy/envoy.yaml", "validation_context:", "validation_contxt:")
        self.assert_fails("envoy/envoy.yaml", "validation_contxt")

    def test_access_log_without_usage(self) -> None:
        self.mutate("envoy/envoy.yaml", "%FILTER_STATE(wasm.waygate_prompt_tokens:PLAIN)%", "%FILTER_STATE(wasm.prompt_tokens:PLAIN)%")
        self.assert_fails("access_log[0]", "wasm.waygate_prompt_tokens")

    def test_unknown_type_url(self) -> None:
        self.mutate("envoy/envoy.yaml", "access_loggers.stream.v3.StdoutAccessLog", "access_loggers.stream.v3.StdoutAccesLog")
        self.assert_fails("envoy/envoy.yaml", "StdoutAccesLog")

    def test_wrong_type(self) -> None:
        self.mutate("envoy/envoy.yaml", "port_value: 9901", "port_value: nine")
        self.assert_fails("envoy/envoy.yaml", "port_value")

    def test_missing_required_field(self) -> None:
        # ClusterLoadAssignment.cluster_name: (validate.rules).string.min_len = 1.
        self.mutate("envoy/envoy.yaml", "      cluster_name: openai\n", "")
        self.assert_fails("envoy/envoy.yaml", "cluster_name")

    def test_local_yaml_is_checked_too(self) -> None:
        self.mutate("envoy/local.yaml", "stat_prefix:", "stats_prefix:")
        self.assert_fails("envoy/local.yaml", "stats_prefix")

    # ---- router fallback (envoy/local-router.yaml) ------------------------------------
    def test_router_fallback_without_cluster_refresh(self) -> None:
        self.mutate("envoy/local-router.yaml", "refresh_cluster_on_retry: true", "refresh_cluster_on_retry: false")
        self.assert_fails("envoy/local-router.yaml", "refresh_cluster_on_retry: true")

    def test_router_fallback_slot_without_a_provider_cluster(self) -> None:
        self.mutate("envoy/local-router.yaml", "cluster: gemini}}}}}", "cluster: openai}}}}}")
        self.assert_fails("envoy/local-router.yaml", "no entry for provider cluster `gemini`")

    def test_router_fallback_cluster_without_the_upstream_role(self) -> None:
        self.mutate("envoy/local-router.yaml", "value: '{\"role\": \"upstream\"}'", "value: '{\"role\": \"downstream\"}'")
        self.assert_fails("envoy/local-router.yaml", "does not run the filter's upstream role")

    def test_router_fallback_upstream_role_in_another_vm(self) -> None:
        self.mutate("envoy/local-router.yaml", "              vm_config: *waygate_vm", "              vm_config: {vm_id: other, runtime: envoy.wasm.runtime.v8, code: {local: {filename: target/wasm32-wasip1/wasm/waygate.wasm}}}")
        self.assert_fails("envoy/local-router.yaml", "has another vm_config than the filter")

    def test_router_fallback_not_retrying_a_contract_failure(self) -> None:
        self.mutate("envoy/local-router.yaml", "retriable_status_codes: [401, 403, 404, 408, 409, 429]", "retriable_status_codes: [429]")
        self.assert_fails("envoy/local-router.yaml", "lacks [401, 403, 404, 408, 409]")

    def test_unknown_fallback(self) -> None:
        self.mutate("envoy/local-router.yaml", '   "fallback": "router",', '   "fallback": "retry",')
        self.assert_fails("envoy/local-router.yaml", "fallback: must be one of http_call, router")

    # ---- the plugin configuration embedded in the bootstrap ---------------------------
    def test_misspelled_credential_field(self) -> None:
        self.mutate("envoy/envoy.yaml", '"api_key_env": "OPENAI_API_KEY"', '"credentials": [{"id": "a", "api_key_envv": "OPENAI_API_KEY"}]')
        self.assert_fails("envoy/envoy.yaml", "credentials[0]: unknown field `api_key_envv`")

    def test_unknown_strategy(self) -> None:
        self.mutate("envoy/envoy.yaml", '"endpoints": [', '"strategy": "round_robin", "endpoints": [')
        self.assert_fails("envoy/envoy.yaml", "strategy: must be one of weighted, fewest_in_flight")

    def test_misspelled_health_field(self) -> None:
        self.mutate("envoy/envoy.yaml", '"limits": "global",', '"limits": "global", "health": {"cooldown": 30000},')
        self.assert_fails("envoy/envoy.yaml", "health: unknown field `cooldown`")

    # ---- global limits (envoy/envoy.yaml) ----------------------------------------------
    def test_global_limits_without_the_rate_limit_filter(self) -> None:
        self.mutate("envoy/envoy.yaml", "domain: waygate", "domain: elsewhere")
        self.assert_fails("envoy/envoy.yaml", "exactly one envoy.filters.http.ratelimit in domain `waygate`")

    def test_global_limits_without_the_token_charge(self) -> None:
        self.mutate("envoy/envoy.yaml", "apply_on_stream_done: true", "apply_on_stream_done: false")
        self.assert_fails("envoy/envoy.yaml", "tokens_per_minute needs a descriptor charged on stream done")

    def test_global_limits_without_the_key_descriptor(self) -> None:
        self.mutate("envoy/envoy.yaml", "descriptor_key: waygate_key", "descriptor_key: key")
        self.assert_fails("envoy/envoy.yaml", "no descriptor `waygate_key`")

    def test_local_limits_counted_twice(self) -> None:
        self.mutate("envoy/envoy.yaml", '"limits": "global",', '"limits": "local",')
        self.assert_fails("envoy/envoy.yaml", "keys would be counted twice")

    def test_unknown_limits(self) -> None:
        self.mutate("envoy/envoy.yaml", '"limits": "global",', '"limits": "redis",')
        self.assert_fails("envoy/envoy.yaml", "limits: must be one of local, global")

    def test_rate_limit_service_not_reading_envoy_yaml(self) -> None:
        self.mutate("docker-compose.yml", '"--plugin-config", "/etc/envoy/envoy.yaml"]', '"--plugin-config", "/etc/waygate.json"]')
        self.assert_fails("docker-compose.yml", "must read its keys (--plugin-config) from the mounted ./envoy/envoy.yaml")

    def test_istio_rate_limit_service_without_its_service(self) -> None:
        self.mutate("envoy/istio/ratelimit.yaml", "  name: waygate-ratelimit\n  namespace: waygate\nspec:\n  selector", "  name: ratelimit\n  namespace: waygate\nspec:\n  selector")
        self.assert_fails("envoy/istio/waygate-filter.yaml", "the rate limit service cluster `outbound|8081||waygate-ratelimit.waygate.svc.cluster.local` is not defined")

    def test_istio_global_limits_without_the_rate_limit_filter(self) -> None:
        self.mutate("envoy/istio/waygate-filter.yaml", "subFilter: { name: waygate.waygate }", "subFilter: { name: envoy.filters.http.router }")
        self.assert_fails("envoy/istio/waygate-filter.yaml", "exactly one envoy.filters.http.ratelimit in domain `waygate`")

    def test_misspelled_plugin_config_field(self) -> None:
        self.mutate("envoy/envoy.yaml", '"max_request_bytes": 4194304', '"max_request_byte": 4194304')
        self.assert_fails("envoy/envoy.yaml", "unknown field `max_request_byte`")

    def test_misspelled_provider_field(self) -> None:
        self.mutate("envoy/envoy.yaml", '"api_key_env": "GEMINI_API_KEY"', '"api_key_environment": "GEMINI_API_KEY"')
        self.assert_fails("unknown field `api_key_environment`")

    def test_provider_cluster_without_route(self) -> None:
        self.mutate("envoy/local.yaml", "string_match: { exact: anthropic }", "string_match: { exact: anthropics }")
        self.assert_fails("provider `anthropic`", "no route matches `x-waygate-cluster: anthropic`")

    def test_route_keeps_the_cluster_header(self) -> None:
        self.mutate("envoy/local.yaml", "request_headers_to_remove: [x-waygate-cluster]", "request_headers_to_remove: []")
        self.assert_fails("does not remove `x-waygate-cluster`")

    def test_no_json_404_under_base_path(self) -> None:
        self.mutate("envoy/envoy.yaml", "match: { prefix: /api/v1 }", "match: { prefix: /api/v2 }")
        self.assert_fails("no catch-all route answering a JSON 404 under `/api/v1`")

    def test_buffer_below_max_request_bytes(self) -> None:
        self.mutate("envoy/envoy.yaml", "per_connection_buffer_limit_bytes: 8388608", "per_connection_buffer_limit_bytes: 1048576")
        self.assert_fails("below max_request_bytes")

    def test_route_with_the_default_timeout(self) -> None:
        self.mutate("envoy/local.yaml", "                  timeout: 0s            # the 15 s default would cut SSE streams\n", "")
        self.assert_fails("provider `fake`", "streams need `0s`")

    def test_fail_open(self) -> None:
        self.mutate("envoy/envoy.yaml", "failure_policy: FAIL_RELOAD", "failure_policy: FAIL_OPEN")
        self.assert_fails("failure_policy must be FAIL_RELOAD")

    def test_a_trap_that_would_refuse_every_request_after_it(self) -> None:
        self.mutate("envoy/istio/router-fallback.yaml", "failure_policy: FAIL_RELOAD", "failure_policy: FAIL_CLOSED")
        self.assert_fails("the upstream role needs failure_policy FAIL_RELOAD")

    def test_key_env_not_passed_to_the_vm(self) -> None:
        self.mutate("envoy/envoy.yaml", "host_env_keys: [OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY]", "host_env_keys: [OPENAI_API_KEY, ANTHROPIC_API_KEY]")
        self.assert_fails("`GEMINI_API_KEY` is not passed to the VM")

    # ---- Istio: Envoy protos embedded in EnvoyFilter patches, and the manifests ---------
    def test_misspelled_field_in_envoyfilter_patch(self) -> None:
        self.mutate("envoy/istio/waygate-filter.yaml", "initial_fetch_timeout: 0s", "initial_fetch_timout: 0s")
        self.assert_fails("waygate-filter.yaml", "initial_fetch_timout")

    def test_misspelled_field_in_ecds_wasm_config(self) -> None:
        self.mutate("envoy/istio/waygate-filter.yaml", "allow_on_headers_stop_iteration: true", "allow_on_headers_stop_iterations: true")
        self.assert_fails("waygate-filter.yaml", "allow_on_headers_stop_iterations")

    def test_misspelled_plugin_config_in_istio(self) -> None:
        self.mutate("envoy/istio/waygate-filter.yaml", '"cluster_header":', '"clusterheader":')
        self.assert_fails("waygate-filter.yaml", "unknown field `clusterheader`")

    def test_istio_local_reply_mapper_without_its_filter(self) -> None:
        # The NETWORK_FILTER MERGE leaves out the connection manager's own required
        # fields (Istio merges it into the gateway's); what it adds is checked whole.
        text = (ROOT / "envoy/istio/waygate-filter.yaml").read_text()
        start = text.index("            - filter:\n                extension_filter:")
        end = text.index("              body_format_override:", start)
        self.mutate("envoy/istio/waygate-filter.yaml", text[start:end], "            - status_code: 502\n")
        self.assert_fails("waygate-filter.yaml", "filter: is required")

    def test_misspelled_envoyfilter_field(self) -> None:
        self.mutate("envoy/istio/waygate-filter.yaml", "configPatches:", "configPatch:")
        self.assert_fails("EnvoyFilter/waygate", "unknown field `configPatch`")

    def test_manifest_without_name(self) -> None:
        self.mutate("envoy/istio/egress.yaml", "  name: openai\n  namespace: waygate\nspec:\n  hosts:", "  namespace: waygate\nspec:\n  hosts:")
        self.assert_fails("egress.yaml", "missing `metadata.name`")

    def test_misspelled_virtualservice_field(self) -> None:
        self.mutate("envoy/istio/routes.yaml", "gateways: [waygate]", "gateway: [waygate]")
        self.assert_fails("VirtualService/waygate", "unknown field `gateway`")

    def test_misspelled_destinationrule_field(self) -> None:
        self.mutate("envoy/istio/egress.yaml", "subjectAltNames:", "subjectAltName:")
        self.assert_fails("DestinationRule/openai", "unknown field `subjectAltName`")

    def test_istio_route_without_header_removal(self) -> None:
        self.mutate("envoy/istio/routes.yaml", "request: { remove: [x-waygate-cluster] }", "request: { remove: [] }")
        self.assert_fails("does not remove `x-waygate-cluster`")

    def test_istio_provider_named_by_its_route_not_its_cluster(self) -> None:
        # Istio's cluster for the ServiceEntry is outbound|80||api.openai.com; a fallback call
        # to `openai` would be refused by Envoy.
        self.mutate("envoy/istio/waygate-filter.yaml", '"cluster": "outbound|80||api.openai.com"', '"cluster": "openai"')
        self.mutate("envoy/istio/routes.yaml", 'exact: "outbound|80||api.openai.com"', "exact: openai")
        self.assert_fails("provider `openai`: cluster `openai` is not a cluster this Envoy has")

    def test_istio_provider_route_with_default_retries(self) -> None:
        self.mutate("envoy/istio/routes.yaml", "    retries: { attempts: 0 }\n", "")
        self.assert_fails("provider `openai`", "needs `retries: {attempts: 0}`")

    def test_istio_router_fallback_without_the_upstream_role_on_a_cluster(self) -> None:
        self.mutate("envoy/istio/router-fallback.yaml", "cluster: { service: api.anthropic.com, portNumber: 80 }", "cluster: { service: api.anthropic.com, portNumber: 443 }")
        self.assert_fails("\"fallback\": \"router\"", "cluster `outbound|80||api.anthropic.com` does not run the filter's upstream role")

    def test_istio_router_fallback_upstream_role_in_another_vm(self) -> None:
        self.mutate("envoy/istio/router-fallback.yaml", "vm_id: waygate", "vm_id: waygate-upstream")
        self.assert_fails("the upstream role `waygate.waygate_upstream` has another vm_config than the filter")

    def test_istio_router_fallback_without_attempt_count(self) -> None:
        self.mutate("envoy/istio/router-fallback.yaml", "include_request_attempt_count: true", "include_request_attempt_count: false")
        self.assert_fails("needs include_request_attempt_count: true")

    def test_istio_router_fallback_capped_by_retry_breakers(self) -> None:
        self.mutate("envoy/istio/egress.yaml", "http: { maxRetries: 1000 }", "http: { http2MaxRequests: 1000 }")
        self.assert_fails("cluster `outbound|80||api.openai.com` allows 3 concurrent retries")

    def test_istio_router_fallback_slot_without_a_provider(self) -> None:
        self.mutate("envoy/istio/router-fallback.yaml", '"outbound|80||generativelanguage.googleapis.com": {action', '"gemini": {action')
        self.assert_fails("has no entry for provider cluster `outbound|80||generativelanguage.googleapis.com`")

    def test_router_fallback_capped_by_retry_breakers(self) -> None:
        self.mutate("envoy/local-router.yaml", "    circuit_breakers: { thresholds: [{ max_retries: 1000 }] }   # Envoy's default caps retries at 3\n", "")
        self.assert_fails("local-router.yaml", "cluster `fake` allows 3 concurrent retries")

    def test_key_env_missing_from_the_proxy(self) -> None:
        self.mutate("envoy/istio/gateway.yaml", "- name: GEMINI_API_KEY", "- name: GEMINI_KEY")
        self.assert_fails("`GEMINI_API_KEY` is not in the istio-proxy container's env")

    def test_oci_image_not_from_scratch(self) -> None:
        self.mutate("envoy/istio/Dockerfile", "FROM scratch", "FROM alpine")
        self.assert_fails("envoy/istio/Dockerfile")

    # ---- docker compose ---------------------------------------------------------------
    def test_misspelled_compose_field(self) -> None:
        self.mutate("docker-compose.yml", "    volumes:\n", "    volume:\n")
        self.assert_fails("docker-compose.yml", "volume")

    def test_unpinned_envoy_image(self) -> None:
        self.mutate("docker-compose.yml", "envoyproxy/envoy:v1.40.0", "envoyproxy/envoy:latest")
        self.assert_fails("services.envoy.image")

    def test_fake_cluster_not_a_compose_service(self) -> None:
        self.mutate("envoy/envoy.yaml", "address: fakes,", "address: fake,")
        self.assert_fails("cluster `fake` points at `fake`")

    def test_env_example_missing_a_key(self) -> None:
        self.mutate(".env.example", "GEMINI_API_KEY=", "")
        self.assert_fails(".env.example", "GEMINI_API_KEY")


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CheckConfigsFails)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"check-configs tests: {result.testsRun - failed} passed, {failed} failed")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
