#!/usr/bin/env python3
"""Checks every deployment config the repository ships, without Envoy, Docker or Kubernetes.

- Envoy: every `envoy/*.yaml` bootstrap, and every Envoy proto embedded in `envoy/istio/*.yaml`
  (EnvoyFilter patch values, the ECDS `TypedExtensionConfig`), is parsed into Envoy's own API
  types (PyPI `xds-protos`) with `json_format.ParseDict(..., ignore_unknown_fields=False)`:
  unknown fields and wrong types fail, every `@type` must resolve to a known message. Then the
  protoc-gen-validate rules Envoy enforces at load (required messages and oneofs, string
  lengths, repeated sizes, number and duration bounds) are checked, and deprecated fields are
  refused.
- The plugin configuration (contract section 8) embedded in each Wasm filter is checked in a
  basic way: known fields and types, ids, digests, providers, and its wiring into the config
  around it: one header-matched route per provider cluster that drops the header, no generic
  `cluster_header` route, a JSON 404 under `base_path`, the listener buffer at least
  `max_request_bytes`, every `api_key_env` exported to the VM, `allow_on_headers_stop_iteration`
  and `failure_policy: FAIL_RELOAD`.
- Kubernetes manifests (`envoy/istio/*.yaml`): each object has apiVersion, kind,
  metadata.name, and the spec fields Istio needs, with unknown keys refused where we know the
  schema.
- `docker-compose.yml`: validated against the Compose specification's JSON schema (shipped in
  the pinned PyPI `docker-compose` package), and cross-checked against `envoy/envoy.yaml`
  (mounts, fake provider address, key variables, `.env.example`).

Usage: check_configs.py [--root DIR]   (exit status 1 and one line per problem on failure)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

BOOTSTRAP = "envoy.config.bootstrap.v3.Bootstrap"
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
WASM = "envoy.extensions.filters.http.wasm.v3.Wasm"
STRING_VALUE = "google.protobuf.StringValue"
TYPE_PREFIX = "type.googleapis.com/"
# What the filter publishes with proxy-wasm set_property (Envoy: filter state `wasm.<name>`),
# and every access log must print.
USAGE_FILTER_STATE = ("wasm.waygate_provider", "wasm.waygate_prompt_tokens", "wasm.waygate_completion_tokens")


class Problems:
    """Every problem found, each with where it is."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.lines.append(f"{where}: {message}")

    def __bool__(self) -> bool:
        return bool(self.lines)


# ---- Envoy protos ------------------------------------------------------------------------


def _import_package_of(full_name: str) -> None:
    """Imports every `*_pb2` module of the proto package that declares `full_name`, so that
    its messages are in the default descriptor pool (json_format resolves `@type` there)."""
    parts = full_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:cut])
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            if info.name.endswith("_pb2"):
                importlib.import_module(f"{package}.{info.name}")
        return


def message_class(full_name: str) -> type[Message] | None:
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName(full_name)
    except KeyError:
        _import_package_of(full_name)
        try:
            descriptor = pool.FindMessageTypeByName(full_name)
        except KeyError:
            return None
    return message_factory.GetMessageClass(descriptor)


def _preload_types(value: Any) -> list[str]:
    """Imports the packages of every `@type` in `value`; returns the ones that stay unknown."""
    unknown = []
    if isinstance(value, dict):
        type_url = value.get("@type")
        if isinstance(type_url, str):
            name = type_url.split("/")[-1]
            if message_class(name) is None:
                unknown.append(type_url)
        for v in value.values():
            unknown += _preload_types(v)
    elif isinstance(value, list):
        for v in value:
            unknown += _preload_types(v)
    return unknown


def parse_envoy(value: Any, full_name: str, where: str, problems: Problems, partial: bool = False) -> Message | None:
    """`value` (from YAML) as Envoy message `full_name`, strictly; then the PGV rules. A
    `partial` message (an EnvoyFilter MERGE) may leave out its own required fields."""
    cls = message_class(full_name)
    if cls is None:
        problems.add(where, f"no such Envoy message type `{full_name}`")
        return None
    for type_url in _preload_types(value):
        problems.add(where, f"`@type: {type_url}` is not a known Envoy/xDS message")
    try:
        # A JSON round trip first: YAML may hold values JSON cannot (dates, ...).
        plain = json.loads(json.dumps(value))
        msg = json_format.ParseDict(plain, cls(), ignore_unknown_fields=False)
    except (json_format.ParseError, TypeError, ValueError) as e:
        problems.add(where, f"not a valid {full_name}: {e}")
        return None
    validate_rules(msg, where, problems, partial)
    return msg


_VALIDATE = None


def _validate_module():
    global _VALIDATE
    if _VALIDATE is None:
        _VALIDATE = importlib.import_module("validate.validate_pb2")
    return _VALIDATE


def _field_rules(field: FieldDescriptor):
    v = _validate_module()
    options = field.GetOptions()
    if options.HasExtension(v.rules):
        return options.Extensions[v.rules]
    return None


def _seconds(duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def _check_scalar(rules, kind: str, value, where: str, problems: Problems) -> None:
    """Bounds (gt, gte, lt, lte, const, in) on numbers and durations."""
    if kind == "duration":
        get = _seconds
    else:

        def get(x):
            return x

    for bound, ok in (
        ("gt", lambda v, b: v > b),
        ("gte", lambda v, b: v >= b),
        ("lt", lambda v, b: v < b),
        ("lte", lambda v, b: v <= b),
    ):
        if rules.HasField(bound):
            b = get(getattr(rules, bound))
            if not ok(get(value), b):
                problems.add(where, f"must be {bound} {b} (protoc-gen-validate), is {get(value)}")
    if kind != "duration" and rules.HasField("const") and value != rules.const:
        problems.add(where, f"must be {rules.const}")


def validate_rules(msg: Message, where: str, problems: Problems, partial: bool = False) -> None:
    """The protoc-gen-validate rules Envoy checks when it loads a config (the usual ones)."""
    v = _validate_module()
    descriptor = msg.DESCRIPTOR
    for oneof in descriptor.oneofs:
        options = oneof.GetOptions()
        if options.HasExtension(v.required) and options.Extensions[v.required] and not partial:
            if msg.WhichOneof(oneof.name) is None:
                names = ", ".join(f.name for f in oneof.fields)
                problems.add(where, f"one of {names} is required")
    for field in descriptor.fields:
        path = f"{where}.{field.name}"
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        is_message = field.type == FieldDescriptor.TYPE_MESSAGE
        is_map = is_message and field.message_type.GetOptions().map_entry
        value = getattr(msg, field.name)
        present = len(value) > 0 if repeated else (msg.HasField(field.name) if field.has_presence else value != field.default_value)
        if present and field.GetOptions().deprecated:
            problems.add(path, "deprecated field (Envoy warns or refuses it)")
        rules = _field_rules(field)
        # A oneof member (or proto3 `optional`) is validated only when it is the one set.
        if rules is not None and field.containing_oneof is not None and not present:
            rules = None
        if partial and not present:
            rules = None
        if rules is not None:
            which = rules.WhichOneof("type")
            if rules.message.required and not present:
                problems.add(path, "is required")
            if which in ("duration", "timestamp", "any") and getattr(rules, which).required and not present:
                problems.add(path, "is required")
            if repeated and not is_map and which == "repeated":
                r = rules.repeated
                if r.min_items and len(value) < r.min_items:
                    problems.add(path, f"needs at least {r.min_items} item(s)")
            elif is_map and which == "map":
                if rules.map.min_pairs and len(value) < rules.map.min_pairs:
                    problems.add(path, f"needs at least {rules.map.min_pairs} entr(y/ies)")
            elif not repeated and which == "string":
                r = rules.string
                if r.min_len and len(value) < r.min_len:
                    problems.add(path, f"needs at least {r.min_len} character(s)")
                if r.min_bytes and len(value.encode()) < r.min_bytes:
                    problems.add(path, f"needs at least {r.min_bytes} byte(s)")
            elif not repeated and which in ("uint32", "uint64", "int32", "int64", "double", "float") and present:
                # On a wrapper (google.protobuf.UInt64Value, ...) the rules bound its value.
                scalar = value.value if is_message else value
                _check_scalar(getattr(rules, which), which, scalar, path, problems)
            elif not repeated and which == "duration" and present:
                _check_scalar(rules.duration, "duration", value, path, problems)
        if not is_message:
            continue
        if is_map:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                for key, item in value.items():
                    _validate_nested(item, f"{path}[{key}]", problems)
        elif repeated:
            for i, item in enumerate(value):
                _validate_nested(item, f"{path}[{i}]", problems)
        elif present:
            # A MERGE's typed_config merges into the existing extension's (Istio merges
            # the unpacked messages), so it too may leave out its required fields.
            _validate_nested(value, path, problems, partial and value.DESCRIPTOR.full_name == "google.protobuf.Any")


def _validate_nested(msg: Message, where: str, problems: Problems, partial: bool = False) -> None:
    if msg.DESCRIPTOR.full_name == "google.protobuf.Any":
        if not msg.type_url:
            return
        cls = message_class(msg.type_url.split("/")[-1])
        if cls is None:
            return  # already reported by the parse
        inner = cls()
        msg.Unpack(inner)
        validate_rules(inner, f"{where}<{inner.DESCRIPTOR.name}>", problems, partial)
    else:
        validate_rules(msg, where, problems)


# ---- the plugin configuration (contract section 8) ----------------------------------------

PLUGIN_FIELDS = {
    "routing_field": str,
    "base_path": str,
    "cluster_header": str,
    "max_request_bytes": "count",
    "max_provider_tries": "count",
    "fallback": str,
    "limits": str,
    "keys": list,
    "providers": list,
    "models": list,
    "health": dict,
}
HEALTH_FIELDS = {
    "enabled": bool,
    "failures": "count",
    "cooldown_ms": "count",
    "max_cooldown_ms": "count",
    "failure_percent": "count",
    "window_ms": "count",
    "min_requests": "count",
}
KEY_FIELDS = {"id": str, "sha256": str, "models": list, "requests_per_minute": "count", "tokens_per_minute": "count"}
PROVIDER_FIELDS = {
    "id": str,
    "api": str,
    "cluster": str,
    "authority": str,
    "path_prefix": str,
    "api_key_env": str,
    "api_key": str,
    "credentials": list,
    "legacy_completions": bool,
    "responses": bool,
    "timeout_ms": "count",
    "default_max_tokens": "count",
}
MODEL_FIELDS = {"id": str, "endpoints": list, "strategy": str}
ENDPOINT_FIELDS = {"provider": str, "model": str, "weight": "count", "priority": "count"}
CREDENTIAL_FIELDS = {"id": str, "api_key_env": str, "api_key": str, "weight": "count"}
APIS = ("openai", "anthropic", "gemini")
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
ENVOY_DEFAULT_BUFFER_LIMIT = 1024 * 1024


def _typed_fields(obj: Any, fields: dict, required: tuple, where: str, problems: Problems) -> bool:
    if not isinstance(obj, dict):
        problems.add(where, "must be an object")
        return False
    for key, value in obj.items():
        kind = fields.get(key)
        if kind is None:
            problems.add(where, f"unknown field `{key}` (known: {', '.join(fields)})")
        elif kind == "count":
            # Istio's pluginConfig is a Struct: whole numbers may arrive as doubles.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
                problems.add(f"{where}.{key}", "must be a whole number")
        elif not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            problems.add(f"{where}.{key}", f"must be of type {kind.__name__}")
    for key in required:
        if key not in obj:
            problems.add(where, f"missing required field `{key}`")
    return True


class Route:
    """A route as the plugin configuration needs it, from Envoy or from an Istio VirtualService."""

    def __init__(self, header_matches: dict, target: str | None, removes: set, timeout: str | None, prefix: str | None, direct_status: int | None, generic_cluster_header: bool, direct_body: str | None = None, present: set | None = None, slot_clusters: list | None = None, retry: dict | None = None):
        self.header_matches = header_matches  # header name (lower case) -> exact value
        self.target = target  # cluster / destination host, None for a direct response
        self.removes = removes  # request headers removed (lower case)
        self.timeout = timeout
        self.prefix = prefix
        self.direct_status = direct_status
        self.generic_cluster_header = generic_cluster_header
        self.direct_body = direct_body
        self.present = present or set()  # headers matched on presence (lower case)
        self.slot_clusters = slot_clusters or []  # router fallback: the clusters each slot map names
        self.retry = retry  # the route's retry_policy, as written
        self.counts_attempts = False  # its virtual host sets include_request_attempt_count


class Surroundings:
    """What the plugin configuration is wired into."""

    def __init__(self, routes: list[Route], targets: set[str], buffer_limit: int | None, env_keys: set[str], target_of: Callable[[dict], str], unset_timeout_is_none: bool = False, upstream_role: set | None = None, later_filters: list | None = None, clusters: set | None = None, retries_by_default: bool = False, max_retries: dict | None = None, auto_sni: set | None = None):
        self.routes = routes
        self.max_retries = max_retries or {}  # cluster -> its circuit breaker's max_retries, where set
        self.auto_sni = auto_sni or set()  # clusters whose SNI follows the request's :authority
        self.retries_by_default = retries_by_default  # Istio: a route without `retries` retries
        self.later_filters = later_filters  # HTTP filters after waygate's (None: not known here)
        self.clusters = clusters or set()  # every cluster the bootstrap defines
        self.upstream_role = upstream_role or set()  # clusters running the filter's upstream role
        self.targets = targets  # clusters (Envoy) or ServiceEntry hosts (Istio)
        self.buffer_limit = buffer_limit
        self.env_keys = env_keys
        self.target_of = target_of  # where a provider's route must go
        self.unset_timeout_is_none = unset_timeout_is_none  # Istio: yes; Envoy: 15 s


def check_plugin_config(text: str, where: str, around: Surroundings, problems: Problems) -> None:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        problems.add(where, f"the plugin configuration is not JSON: {e}")
        return
    if not _typed_fields(config, PLUGIN_FIELDS, (), where, problems):
        return
    if str(config.get("base_path", "/api/v1")).rstrip("/") == "" or not str(config.get("base_path", "/api/v1")).startswith("/"):
        problems.add(f"{where}.base_path", "must start with `/`")
    if isinstance(config.get("health"), dict):
        _typed_fields(config["health"], HEALTH_FIELDS, (), f"{where}.health", problems)
    key_ids = set()
    for i, key in enumerate(config.get("keys", []) if isinstance(config.get("keys"), list) else []):
        kw = f"{where}.keys[{i}]"
        if _typed_fields(key, KEY_FIELDS, ("id", "sha256"), kw, problems):
            if key.get("id") in key_ids:
                problems.add(kw, f"duplicate key id `{key.get('id')}`")
            key_ids.add(key.get("id"))
            if isinstance(key.get("sha256"), str) and not re.fullmatch(r"[0-9a-f]{64}", key["sha256"]):
                problems.add(f"{kw}.sha256", "must be 64 lowercase hex digits")
    providers = {}
    provider_list = config.get("providers", []) if isinstance(config.get("providers"), list) else []
    for i, provider in enumerate(provider_list):
        pw = f"{where}.providers[{i}]"
        if not _typed_fields(provider, PROVIDER_FIELDS, ("id", "api", "cluster", "authority"), pw, problems):
            continue
        pid = provider.get("id")
        if pid in providers:
            problems.add(pw, f"duplicate provider id `{pid}`")
        providers[pid] = provider
        if provider.get("api") not in APIS:
            problems.add(f"{pw}.api", f"must be one of {', '.join(APIS)}")
        if sum(k in provider for k in ("api_key", "api_key_env", "credentials")) != 1:
            problems.add(pw, "exactly one of `api_key`, `api_key_env` and `credentials`")
        sources = [(pw, provider)]
        for j, credential in enumerate(provider.get("credentials", []) if isinstance(provider.get("credentials"), list) else []):
            cw = f"{pw}.credentials[{j}]"
            if _typed_fields(credential, CREDENTIAL_FIELDS, ("id",), cw, problems):
                if ("api_key" in credential) == ("api_key_env" in credential):
                    problems.add(cw, "exactly one of `api_key` and `api_key_env`")
                sources.append((cw, credential))
        for sw, source in sources:
            env = source.get("api_key_env")
            if isinstance(env, str) and env not in around.env_keys:
                problems.add(f"{sw}.api_key_env", f"`{env}` is not passed to the VM (vm_config.environment_variables)")
    for i, model in enumerate(config.get("models", []) if isinstance(config.get("models"), list) else []):
        mw = f"{where}.models[{i}]"
        if not _typed_fields(model, MODEL_FIELDS, ("id", "endpoints"), mw, problems):
            continue
        if model.get("strategy", "weighted") not in ("weighted", "fewest_in_flight"):
            problems.add(f"{mw}.strategy", "must be one of weighted, fewest_in_flight")
        for j, endpoint in enumerate(model.get("endpoints", []) if isinstance(model.get("endpoints"), list) else []):
            ew = f"{mw}.endpoints[{j}]"
            if _typed_fields(endpoint, ENDPOINT_FIELDS, ("provider", "model"), ew, problems):
                if endpoint.get("provider") not in providers:
                    problems.add(ew, f"names unknown provider `{endpoint.get('provider')}`")

    # The clusters the filter names itself: fallback calls and router slots address a
    # provider's `cluster` directly, so it must be a cluster Envoy has.
    for provider in providers.values():
        cluster = provider.get("cluster")
        if isinstance(cluster, str) and around.clusters and cluster not in around.clusters:
            problems.add(f"{where}: provider `{provider.get('id')}`", f"cluster `{cluster}` is not a cluster this Envoy has (the filter's fallback calls and router slots name it)")

    # Wiring into the routes around the filter.
    header = str(config.get("cluster_header", "x-waygate-cluster")).lower()
    for route in around.routes:
        if route.generic_cluster_header:
            problems.add(where, "a route takes its cluster from a request header: a bypassed filter would let clients pick any cluster")
    fallback = config.get("fallback", "http_call")
    if fallback not in FALLBACKS:
        problems.add(f"{where}.fallback", f"must be one of {', '.join(FALLBACKS)}")
    if fallback == "router":
        check_router_fallback(providers, where, around, problems)
    check_limits(config, where, around, problems)
    for provider in providers.values() if fallback != "router" else []:
        cluster = provider.get("cluster")
        if not isinstance(cluster, str):
            continue
        matching = [r for r in around.routes if r.header_matches.get(header) == cluster]
        pw = f"{where}: provider `{provider.get('id')}` (cluster `{cluster}`)"
        if not matching:
            problems.add(pw, f"no route matches `{header}: {cluster}` exactly")
            continue
        for route in matching:
            if route.target is None:
                problems.add(pw, "its route answers directly instead of going to the cluster")
                continue
            if route.target not in around.targets:
                problems.add(pw, f"its route goes to `{route.target}`, which is not defined")
            elif route.target != around.target_of(provider):
                problems.add(pw, f"its route goes to `{route.target}`, expected `{around.target_of(provider)}`")
            if header not in route.removes:
                problems.add(pw, f"its route does not remove `{header}` before the request goes upstream")
            if around.retries_by_default and (route.retry or {}).get("attempts") != 0:
                problems.add(pw, "its route needs `retries: {attempts: 0}`: Istio's default retries a failed provider on itself instead of the next one")
            if route.timeout != "0s" and not (route.timeout is None and around.unset_timeout_is_none):
                problems.add(pw, f"its route has timeout {route.timeout or 'unset (15s)'}: streams need `0s`")
    base = str(config.get("base_path", "/api/v1")).rstrip("/")
    if not any(r.direct_status == 404 and r.prefix is not None and r.prefix.rstrip("/") == base and not r.header_matches and _is_json(r.direct_body) for r in around.routes):
        problems.add(where, f"no catch-all route answering a JSON 404 under `{base}`")
    limit = around.buffer_limit
    max_bytes = config.get("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES)
    if isinstance(max_bytes, (int, float)):
        effective = ENVOY_DEFAULT_BUFFER_LIMIT if limit is None else limit
        if effective < max_bytes:
            problems.add(where, f"per_connection_buffer_limit_bytes ({effective}) is below max_request_bytes ({int(max_bytes)})")


FALLBACKS = ("http_call", "router")
LIMITS = ("local", "global")
RATE_LIMIT_FILTER = "envoy.extensions.filters.http.ratelimit.v3.RateLimit"


def check_limits(config: dict, where: str, around: Surroundings, problems: Problems) -> None:
    """`"limits": "global"` (docs/operating.md "Limits and stats") needs Envoy's rate limit filter after
    waygate, in domain `waygate`, with the descriptors the service counts; `local` must not
    have one (a key would be counted twice)."""
    limits = config.get("limits", "local")
    if limits not in LIMITS:
        problems.add(f"{where}.limits", f"must be one of {', '.join(LIMITS)}")
        return
    if around.later_filters is None:
        return
    ours = [f.get("typed_config", {}) for f in around.later_filters
            if f.get("typed_config", {}).get("@type") == TYPE_PREFIX + RATE_LIMIT_FILTER
            and f.get("typed_config", {}).get("domain") == "waygate"]
    if limits == "local":
        if ours:
            problems.add(where, "limits `local` but a rate limit filter in domain `waygate` follows: keys would be counted twice")
        return
    if len(ours) != 1:
        problems.add(where, "limits `global`: exactly one envoy.filters.http.ratelimit in domain `waygate` must follow the waygate filter")
        return
    rl = ours[0]
    cluster = rl.get("rate_limit_service", {}).get("grpc_service", {}).get("envoy_grpc", {}).get("cluster_name")
    if cluster not in around.clusters:
        problems.add(where, f"limits `global`: the rate limit service cluster `{cluster}` is not defined")
    def reads_key_id(rate_limit: dict, descriptor_key: str) -> bool:
        return any(
            a.get("extension", {}).get("typed_config", {}).get("descriptor_key") == descriptor_key
            and "wasm.waygate_key_id" in a.get("extension", {}).get("typed_config", {}).get("text", "")
            for a in rate_limit.get("actions", [])
        )

    rate_limits = rl.get("rate_limits", [])
    if not any(reads_key_id(r, "waygate_key") and not r.get("apply_on_stream_done") for r in rate_limits):
        problems.add(where, "limits `global`: no descriptor `waygate_key` from filter state wasm.waygate_key_id")
    charged = [r for r in rate_limits if r.get("apply_on_stream_done") and reads_key_id(r, "waygate_tokens")
               and "wasm.waygate_total_tokens" in json.dumps(r.get("hits_addend", {}))]
    token_limited = any(isinstance(k, dict) and "tokens_per_minute" in k for k in config.get("keys", []) or [])
    if token_limited and not charged:
        problems.add(where, "limits `global`: tokens_per_minute needs a descriptor charged on stream done with hits_addend %FILTER_STATE(wasm.waygate_total_tokens:PLAIN)%")
ROUTED_HEADER = "x-waygate-routed"
ENVOY_DEFAULT_MAX_RETRIES = 3
MIN_MAX_RETRIES = 100  # concurrent fallbacks a provider cluster must allow
RETRIED_STATUSES = {401, 403, 404, 408, 409, 429}


def check_router_fallback(providers: dict, where: str, around: Surroundings, problems: Problems) -> None:
    """`"fallback": "router"` (docs/deploying.md "Routing and fallback"): one route for the requests the
    filter marks, choosing each attempt's cluster from the filter's slots and retrying on the
    contract's failures, and the filter's upstream role on every provider cluster."""
    routed = [r for r in around.routes if ROUTED_HEADER in r.present]
    if not routed:
        problems.add(where, f"fallback `router`: no route matches the `{ROUTED_HEADER}` header")
    clusters = sorted({p.get("cluster") for p in providers.values() if isinstance(p.get("cluster"), str)})
    for route in routed:
        rw = f"{where}: the `{ROUTED_HEADER}` route"
        if ROUTED_HEADER not in route.removes:
            problems.add(rw, f"does not remove `{ROUTED_HEADER}` before the request goes upstream")
        if route.timeout != "0s":
            problems.add(rw, f"has timeout {route.timeout or 'unset (15s)'}: streams need `0s`")
        if not route.slot_clusters:
            problems.add(rw, "does not pick its cluster with the matcher cluster specifier")
        for i, slot in enumerate(route.slot_clusters):
            for cluster in clusters:
                if cluster not in slot:
                    problems.add(rw, f"its cluster matcher's map {i} has no entry for provider cluster `{cluster}`")
        retry = route.retry or {}
        if retry.get("refresh_cluster_on_retry") is not True:
            problems.add(rw, "needs retry_policy.refresh_cluster_on_retry: true (Envoy >= 1.39)")
        retry_on = {c.strip() for c in str(retry.get("retry_on", "")).split(",")}
        if "5xx" not in retry_on or "retriable-status-codes" not in retry_on:
            problems.add(rw, "retry_policy.retry_on must include `5xx` and `retriable-status-codes`")
        missing = RETRIED_STATUSES - set(retry.get("retriable_status_codes", []))
        if missing:
            problems.add(rw, f"retry_policy.retriable_status_codes lacks {sorted(missing)}")
        if not route.counts_attempts:
            problems.add(rw, "its virtual host needs include_request_attempt_count: true (the slot matcher reads x-envoy-attempt-count)")
    for cluster in clusters:
        if cluster not in around.upstream_role:
            problems.add(where, f"fallback `router`: cluster `{cluster}` does not run the filter's upstream role (http_filters with configuration {{\"role\": \"upstream\"}})")
        if around.max_retries.get(cluster, ENVOY_DEFAULT_MAX_RETRIES) < MIN_MAX_RETRIES:
            problems.add(where, f"fallback `router`: cluster `{cluster}` allows {around.max_retries.get(cluster, ENVOY_DEFAULT_MAX_RETRIES)} concurrent retries (circuit breaker max_retries; Envoy's default is 3): fallback would be capped under load")
        if cluster in around.auto_sni:
            problems.add(where, f"fallback `router`: cluster `{cluster}` has auto_sni, but the router picks SNI before the upstream role sets :authority")


def _cluster_maps(node: Any) -> list[set]:
    """For every `exact_match_map` in a matcher cluster specifier, the clusters it maps from
    their own name (the filter's slot holds a provider's cluster; the entry must go there)."""
    found = []
    if isinstance(node, dict):
        table = node.get("map")
        actions = {k: v["action"] for k, v in table.items() if isinstance(v, dict) and "action" in v} if isinstance(table, dict) else {}
        if actions:
            found.append({k for k, a in actions.items() if a.get("typed_config", {}).get("cluster") == k})
        for value in node.values():
            found.extend(_cluster_maps(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_cluster_maps(value))
    return found


def _upstream_roles(clusters: dict) -> dict:
    """The Wasm config of the filter's upstream role, by the cluster that runs it."""
    roles = {}
    for name, cluster in clusters.items():
        options = cluster.get("typed_extension_protocol_options", {}).get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {})
        for flt in options.get("http_filters", []):
            config = flt.get("typed_config", {}).get("config", {})
            value = config.get("configuration", {}).get("value")
            try:
                if json.loads(value or "null") == {"role": "upstream"}:
                    roles[name] = config
            except json.JSONDecodeError:
                pass
    return roles


def _breaker_max_retries(clusters: dict) -> dict:
    """Each cluster's default-priority circuit breaker `max_retries`, where it sets one."""
    found = {}
    for name, cluster in clusters.items():
        for threshold in cluster.get("circuit_breakers", {}).get("thresholds", []):
            if threshold.get("priority", "DEFAULT") == "DEFAULT" and "max_retries" in threshold:
                found[name] = threshold["max_retries"]
    return found


def _auto_sni_clusters(clusters: dict) -> set:
    options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    return {
        name for name, cluster in clusters.items()
        if cluster.get("typed_extension_protocol_options", {}).get(options, {}).get("upstream_http_protocol_options", {}).get("auto_sni") is True
    }


def _without_newer_fields(node: Any) -> Any:
    """A copy without the fields Envoy has that the pinned xds-protos predates
    (`retry_policy.refresh_cluster_on_retry`, Envoy 1.39): the router-fallback
    bootstrap is run by the tests in Envoy 1.40 itself."""
    if isinstance(node, dict):
        return {k: _without_newer_fields(v) for k, v in node.items() if k not in NEWER_THAN_XDS_PROTOS}
    if isinstance(node, list):
        return [_without_newer_fields(v) for v in node]
    return node


NEWER_THAN_XDS_PROTOS = {"refresh_cluster_on_retry"}


def _is_json(text: str | None) -> bool:
    try:
        return text is not None and isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def check_wasm_plugin(plugin: dict, where: str, around: Surroundings, problems: Problems) -> None:
    """The wasm `PluginConfig` (as a dict, already parsed by protobuf) and its configuration."""
    if plugin.get("allow_on_headers_stop_iteration") is not True:
        problems.add(where, "allow_on_headers_stop_iteration must be true (Envoy >= 1.35)")
    if plugin.get("failure_policy") != "FAIL_RELOAD":
        problems.add(where, "failure_policy must be FAIL_RELOAD (a trap fails its request closed, then the VM is reloaded)")
    configuration = plugin.get("configuration")
    if not isinstance(configuration, dict) or configuration.get("@type") != TYPE_PREFIX + STRING_VALUE:
        problems.add(f"{where}.configuration", f"must be a {STRING_VALUE} holding the JSON of contract section 8")
        return
    check_plugin_config(configuration.get("value", ""), f"{where}.configuration", around, problems)


# ---- Envoy bootstraps ---------------------------------------------------------------------


def _envoy_routes(route_config: dict) -> list[Route]:
    routes = []
    for vh in route_config.get("virtual_hosts", []):
        vh_removes = {h.lower() for h in vh.get("request_headers_to_remove", [])}
        for r in vh.get("routes", []):
            route = _envoy_route(r, vh_removes)
            route.counts_attempts = vh.get("include_request_attempt_count") is True
            routes.append(route)
    return routes


def _envoy_route(r: dict, vh_removes: set) -> Route:
    """One Envoy `config.route.v3.Route`, in a virtual host removing `vh_removes`."""
    match = r.get("match", {})
    headers = {}
    present = set()
    for h in match.get("headers", []):
        exact = h.get("string_match", {}).get("exact")
        if exact is not None:
            headers[h.get("name", "").lower()] = exact
        if h.get("present_match") is True:
            present.add(h.get("name", "").lower())
    action = r.get("route")
    direct = r.get("direct_response")
    return Route(
        header_matches=headers,
        target=action.get("cluster") if action else None,
        removes=vh_removes | {h.lower() for h in r.get("request_headers_to_remove", [])},
        timeout=action.get("timeout") if action else None,
        prefix=match.get("prefix", match.get("path")),
        direct_status=direct.get("status") if direct else None,
        generic_cluster_header=bool(action and "cluster_header" in action),
        direct_body=direct.get("body", {}).get("inline_string") if direct else None,
        present=present,
        slot_clusters=_cluster_maps(action.get("inline_cluster_specifier_plugin")) if action else [],
        retry=action.get("retry_policy") if action else None,
    )


class BootstrapInfo:
    def __init__(self) -> None:
        self.wasm_files: list[str] = []
        self.env_keys: set[str] = set()
        self.clusters: dict[str, dict] = {}
        self.listener_ports: list[int] = []
        self.admin_port: int | None = None


def check_bootstrap(path: Path, root: Path, problems: Problems) -> BootstrapInfo | None:
    where = str(path.relative_to(root))
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        problems.add(where, f"not YAML: {e}")
        return None
    if parse_envoy(_without_newer_fields(doc), BOOTSTRAP, where, problems) is None:
        return None
    info = BootstrapInfo()
    static = doc.get("static_resources", {})
    info.clusters = {c["name"]: c for c in static.get("clusters", [])}
    info.admin_port = doc.get("admin", {}).get("address", {}).get("socket_address", {}).get("port_value")
    wasm_filters = 0
    for li, listener in enumerate(static.get("listeners", [])):
        lw = f"{where}: listeners[{li}]"
        info.listener_ports.append(listener.get("address", {}).get("socket_address", {}).get("port_value"))
        for ci, chain in enumerate(listener.get("filter_chains", [])):
            for fi, flt in enumerate(chain.get("filters", [])):
                hcm = flt.get("typed_config", {})
                if hcm.get("@type") != TYPE_PREFIX + HCM:
                    continue
                routes = _envoy_routes(hcm.get("route_config", {}))
                for ai, log in enumerate(hcm.get("access_log", [])):
                    fmt = json.dumps(log.get("typed_config", {}).get("log_format", {}))
                    for key in USAGE_FILTER_STATE:
                        if f"%FILTER_STATE({key}:PLAIN)%" not in fmt:
                            problems.add(f"{lw}: access_log[{ai}]", f"the format does not print %FILTER_STATE({key}:PLAIN)%")
                for route in routes:
                    if route.target is not None and route.target not in info.clusters:
                        problems.add(lw, f"a route goes to unknown cluster `{route.target}`")
                filters = hcm.get("http_filters", [])
                if not filters or filters[-1].get("typed_config", {}).get("@type", "").split("/")[-1] != "envoy.extensions.filters.http.router.v3.Router":
                    problems.add(lw, "the HTTP filter chain must end with the router")
                for hi, http_filter in enumerate(filters):
                    typed = http_filter.get("typed_config", {})
                    if typed.get("@type") != TYPE_PREFIX + WASM:
                        continue
                    wasm_filters += 1
                    plugin = typed.get("config", {})
                    fw = f"{lw}.filter_chains[{ci}].filters[{fi}].http_filters[{hi}].config"
                    local = plugin.get("vm_config", {}).get("code", {}).get("local", {})
                    if "filename" in local:
                        info.wasm_files.append(local["filename"])
                    env = plugin.get("vm_config", {}).get("environment_variables", {})
                    info.env_keys |= set(env.get("host_env_keys", []))
                    around = Surroundings(
                        routes=routes,
                        targets=set(info.clusters),
                        buffer_limit=listener.get("per_connection_buffer_limit_bytes"),
                        env_keys=set(env.get("host_env_keys", [])) | set(env.get("key_values", {})),
                        target_of=lambda provider: provider.get("cluster"),
                        upstream_role=set(_upstream_roles(info.clusters)),
                        later_filters=filters[hi + 1:],
                        clusters=set(info.clusters),
                        max_retries=_breaker_max_retries(info.clusters),
                        auto_sni=_auto_sni_clusters(info.clusters),
                    )
                    check_wasm_plugin(plugin, fw, around, problems)
                    # Router fallback hands each request to its attempts inside one VM.
                    for name, role in _upstream_roles(info.clusters).items():
                        if role.get("vm_config") != plugin.get("vm_config"):
                            problems.add(f"{where}: clusters.{name}", "the filter's upstream role has another vm_config than the filter: they would not share a VM")
    if wasm_filters == 0:
        problems.add(where, "no envoy.filters.http.wasm filter")
    for name, cluster in info.clusters.items():
        socket = cluster.get("transport_socket")
        if socket is None:
            continue
        tls = socket.get("typed_config", {})
        if not tls.get("sni"):
            problems.add(f"{where}: cluster `{name}`", "TLS without `sni`")
        if not tls.get("common_tls_context", {}).get("validation_context", {}).get("trusted_ca"):
            problems.add(f"{where}: cluster `{name}`", "TLS without certificate validation (validation_context.trusted_ca)")
    return info


# ---- Kubernetes / Istio manifests ---------------------------------------------------------

# Schemas as nested dicts of the keys each object may carry: a dict maps keys to sub-schemas,
# [schema] is a list of them, a type checks the value, ANY accepts anything.
ANY = object()
STR, INT, BOOL = str, int, bool
LABELS = {"*": STR}

PORT_SELECTOR = {"number": INT}
HEADER_OPS = {"set": LABELS, "add": LABELS, "remove": [STR]}
STRING_MATCH = {"exact": STR, "prefix": STR, "regex": STR}
ISTIO_TLS = {
    "mode": STR,
    "clientCertificate": STR,
    "privateKey": STR,
    "caCertificates": STR,
    "credentialName": STR,
    "subjectAltNames": [STR],
    "sni": STR,
    "insecureSkipVerify": BOOL,
    "caCrl": STR,
}
TRAFFIC_POLICY = {
    "loadBalancer": ANY,
    "connectionPool": ANY,
    "outlierDetection": ANY,
    "tls": ISTIO_TLS,
    "portLevelSettings": [{"port": PORT_SELECTOR, "loadBalancer": ANY, "connectionPool": ANY, "outlierDetection": ANY, "tls": ISTIO_TLS}],
    "tunnel": ANY,
    "proxyProtocol": ANY,
    "retryBudget": ANY,
}
ENVOY_FILTER_MATCH = {
    "context": STR,
    "proxy": {"proxyVersion": STR, "metadata": LABELS},
    "listener": {
        "portNumber": INT,
        "name": STR,
        "listenerFilter": STR,
        "filterChain": {
            "name": STR,
            "sni": STR,
            "transportProtocol": STR,
            "applicationProtocols": STR,
            "destinationPort": INT,
            "filter": {"name": STR, "subFilter": {"name": STR}},
        },
    },
    "routeConfiguration": ANY,
    "cluster": ANY,
}
SPECS: dict[str, dict] = {
    "EnvoyFilter": {
        "workloadSelector": {"labels": LABELS},
        "targetRefs": ANY,
        "priority": INT,
        "configPatches": [{"applyTo": STR, "match": ENVOY_FILTER_MATCH, "patch": {"operation": STR, "value": ANY, "filterClass": STR}}],
    },
    "ServiceEntry": {
        "hosts": [STR],
        "addresses": [STR],
        "ports": [{"number": INT, "protocol": STR, "name": STR, "targetPort": INT}],
        "location": STR,
        "resolution": STR,
        "endpoints": ANY,
        "workloadSelector": ANY,
        "exportTo": [STR],
        "subjectAltNames": [STR],
    },
    "DestinationRule": {"host": STR, "trafficPolicy": TRAFFIC_POLICY, "subsets": ANY, "exportTo": [STR], "workloadSelector": ANY},
    "VirtualService": {
        "hosts": [STR],
        "gateways": [STR],
        "exportTo": [STR],
        "tls": ANY,
        "tcp": ANY,
        "http": [
            {
                "name": STR,
                "match": [
                    {
                        "name": STR,
                        "uri": STRING_MATCH,
                        "scheme": STRING_MATCH,
                        "method": STRING_MATCH,
                        "authority": STRING_MATCH,
                        "headers": {"*": STRING_MATCH},
                        "withoutHeaders": {"*": STRING_MATCH},
                        "port": INT,
                        "queryParams": ANY,
                        "ignoreUriCase": BOOL,
                        "sourceLabels": LABELS,
                        "gateways": [STR],
                        "sourceNamespace": STR,
                        "statPrefix": STR,
                    }
                ],
                "route": [{"destination": {"host": STR, "subset": STR, "port": PORT_SELECTOR}, "weight": INT, "headers": {"request": HEADER_OPS, "response": HEADER_OPS}}],
                "redirect": ANY,
                "directResponse": {"status": INT, "body": {"string": STR, "bytes": STR}},
                "delegate": ANY,
                "rewrite": {"uri": STR, "authority": STR, "uriRegexRewrite": ANY},
                "timeout": STR,
                "retries": {"attempts": INT, "perTryTimeout": STR, "retryOn": STR, "retryRemoteLocalities": BOOL, "retryIgnorePreviousHosts": BOOL, "backoff": STR},
                "fault": ANY,
                "mirror": ANY,
                "mirrors": ANY,
                "mirrorPercentage": ANY,
                "corsPolicy": ANY,
                "headers": {"request": HEADER_OPS, "response": HEADER_OPS},
            }
        ],
    },
    "Gateway": {
        "selector": LABELS,
        "servers": [{"port": {"number": INT, "protocol": STR, "name": STR, "targetPort": INT}, "bind": STR, "hosts": [STR], "tls": ANY, "name": STR, "defaultEndpoint": STR}],
    },
    "Deployment": {
        "replicas": INT,
        "selector": {"matchLabels": LABELS, "matchExpressions": ANY},
        "template": {"metadata": {"labels": LABELS, "annotations": LABELS}, "spec": ANY},
        "strategy": ANY,
        "minReadySeconds": INT,
        "revisionHistoryLimit": INT,
        "progressDeadlineSeconds": INT,
        "paused": BOOL,
    },
    "Service": {
        "type": STR,
        "selector": LABELS,
        "ports": [{"name": STR, "port": INT, "targetPort": ANY, "protocol": STR, "appProtocol": STR, "nodePort": INT}],
        "clusterIP": STR,
        "externalTrafficPolicy": STR,
        "internalTrafficPolicy": STR,
        "loadBalancerClass": STR,
        "sessionAffinity": STR,
        "ipFamilyPolicy": STR,
    },
}
API_VERSIONS = {
    "EnvoyFilter": {"networking.istio.io/v1alpha3"},
    "ServiceEntry": {"networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"},
    "DestinationRule": {"networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"},
    "VirtualService": {"networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"},
    "Gateway": {"networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3"},
    "Deployment": {"apps/v1"},
    "Service": {"v1"},
    "ServiceAccount": {"v1"},
    "Namespace": {"v1"},
    "Secret": {"v1"},
}
REQUIRED_SPEC = {
    "EnvoyFilter": ("configPatches",),
    "ServiceEntry": ("hosts", "ports", "resolution"),
    "DestinationRule": ("host",),
    "VirtualService": ("hosts",),
    "Gateway": ("selector", "servers"),
    "Deployment": ("selector", "template"),
    "Service": ("ports",),
}
APPLY_TO = {
    "LISTENER": "envoy.config.listener.v3.Listener",
    "FILTER_CHAIN": "envoy.config.listener.v3.FilterChain",
    "NETWORK_FILTER": "envoy.config.listener.v3.Filter",
    "HTTP_FILTER": "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
    "ROUTE_CONFIGURATION": "envoy.config.route.v3.RouteConfiguration",
    "VIRTUAL_HOST": "envoy.config.route.v3.VirtualHost",
    "HTTP_ROUTE": "envoy.config.route.v3.Route",
    "CLUSTER": "envoy.config.cluster.v3.Cluster",
    "EXTENSION_CONFIG": "envoy.config.core.v3.TypedExtensionConfig",
    "BOOTSTRAP": "envoy.config.bootstrap.v3.Bootstrap",
    "LISTENER_FILTER": "envoy.config.listener.v3.ListenerFilter",
}
PATCH_OPERATIONS = {"MERGE", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"}
PATCH_CONTEXTS = {"ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"}
RESOLUTIONS = {"NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"}
TLS_MODES = {"DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"}


def check_keys(value: Any, schema: Any, where: str, problems: Problems) -> None:
    if schema is ANY:
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            problems.add(where, "must be a list")
            return
        for i, item in enumerate(value):
            check_keys(item, schema[0], f"{where}[{i}]", problems)
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            problems.add(where, "must be a mapping")
            return
        for key, item in value.items():
            if key in schema:
                check_keys(item, schema[key], f"{where}.{key}", problems)
            elif "*" in schema:
                check_keys(item, schema["*"], f"{where}.{key}", problems)
            else:
                problems.add(where, f"unknown field `{key}`")
    elif schema is INT:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.add(where, "must be an integer")
    elif not isinstance(value, schema):
        problems.add(where, f"must be of type {schema.__name__}")


def load_manifests(path: Path, root: Path, problems: Problems) -> list[tuple[str, dict]]:
    where = str(path.relative_to(root))
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        problems.add(where, f"not YAML: {e}")
        return []
    out = []
    for i, doc in enumerate(docs):
        dw = f"{where}[{i}]"
        if not isinstance(doc, dict):
            problems.add(dw, "a manifest must be a mapping")
            continue
        kind = doc.get("kind")
        name = (doc.get("metadata") or {}).get("name")
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str):
                problems.add(dw, f"missing `{key}`")
        if not isinstance(name, str) or not name:
            problems.add(dw, "missing `metadata.name`")
        dw = f"{where}: {kind}/{name}"
        if kind not in API_VERSIONS:
            problems.add(dw, f"unexpected kind `{kind}`")
            continue
        if doc.get("apiVersion") not in API_VERSIONS[kind]:
            problems.add(dw, f"apiVersion `{doc.get('apiVersion')}` is not one of {sorted(API_VERSIONS[kind])}")
        for key in doc:
            if key not in ("apiVersion", "kind", "metadata", "spec", "data", "stringData", "type"):
                problems.add(dw, f"unknown top-level field `{key}`")
        if kind in SPECS:
            spec = doc.get("spec")
            if not isinstance(spec, dict):
                problems.add(dw, "missing `spec`")
                continue
            check_keys(spec, SPECS[kind], f"{dw} spec", problems)
            for key in REQUIRED_SPEC.get(kind, ()):
                if key not in spec:
                    problems.add(dw, f"missing `spec.{key}`")
        out.append((dw, doc))
    return out


def check_istio(directory: Path, root: Path, problems: Problems) -> None:
    objects: list[tuple[str, dict]] = []
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        objects += load_manifests(path, root, problems)
    by_kind: dict[str, list[tuple[str, dict]]] = {}
    for where, doc in objects:
        by_kind.setdefault(doc["kind"], []).append((where, doc))

    service_hosts = {}
    for where, se in by_kind.get("ServiceEntry", []):
        spec = se["spec"]
        if spec.get("resolution") not in RESOLUTIONS:
            problems.add(where, f"spec.resolution must be one of {sorted(RESOLUTIONS)}")
        for host in spec.get("hosts", []):
            service_hosts[host] = se
    tls_hosts = set()
    for where, dr in by_kind.get("DestinationRule", []):
        policy = dr["spec"].get("trafficPolicy", {})
        settings = [policy.get("tls")] + [p.get("tls") for p in policy.get("portLevelSettings", [])]
        for tls in [t for t in settings if t]:
            if tls.get("mode") not in TLS_MODES:
                problems.add(where, f"tls.mode must be one of {sorted(TLS_MODES)}")
            if tls.get("mode") == "SIMPLE":
                if not tls.get("sni"):
                    problems.add(where, "TLS origination without `sni`")
                tls_hosts.add(dr["spec"].get("host"))
        if dr["spec"].get("host") not in service_hosts:
            problems.add(where, f"spec.host `{dr['spec'].get('host')}` has no ServiceEntry")
    for host in service_hosts:
        if host not in tls_hosts:
            problems.add(f"ServiceEntry {host}", "no DestinationRule originates TLS (mode SIMPLE) for it")

    # Routes (VirtualService) in the neutral form the plugin configuration check uses.
    routes: list[Route] = []
    for where, vs in by_kind.get("VirtualService", []):
        for i, http in enumerate(vs["spec"].get("http", [])):
            removes = {h.lower() for h in http.get("headers", {}).get("request", {}).get("remove", [])}
            destinations = http.get("route", [])
            for d in destinations:
                removes |= {h.lower() for h in d.get("headers", {}).get("request", {}).get("remove", [])}
            matches = http.get("match") or [{}]
            for match in matches:
                headers = {k.lower(): v.get("exact") for k, v in match.get("headers", {}).items() if "exact" in v}
                uri = match.get("uri", {})
                direct = http.get("directResponse")
                target = None
                if destinations:
                    if len(destinations) != 1:
                        problems.add(f"{where} http[{i}]", "one destination per provider route")
                    target = destinations[0].get("destination", {}).get("host")
                routes.append(
                    Route(
                        header_matches=headers,
                        target=target,
                        removes=removes,
                        timeout=http.get("timeout"),
                        prefix=uri.get("prefix", "/" if not uri else None),
                        direct_status=direct.get("status") if direct else None,
                        generic_cluster_header=False,
                        direct_body=direct.get("body", {}).get("string") if direct else None,
                        retry=http.get("retries"),
                    )
                )

    # Environment variables the gateway's Envoy process has (istio-proxy container).
    proxy_env: set[str] = set()
    for where, dep in by_kind.get("Deployment", []):
        spec = dep["spec"]
        labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
        for k, v in spec.get("selector", {}).get("matchLabels", {}).items():
            if labels.get(k) != v:
                problems.add(where, f"selector label `{k}` is not on the pod template")
        for container in (spec.get("template", {}).get("spec") or {}).get("containers", []):
            if container.get("name") == "istio-proxy":
                proxy_env |= {e.get("name") for e in container.get("env", [])}

    buffer_limit = None
    for where, ef in by_kind.get("EnvoyFilter", []):
        for i, patch in enumerate(ef["spec"].get("configPatches", [])):
            pw = f"{where} configPatches[{i}]"
            apply_to = patch.get("applyTo")
            operation = patch.get("patch", {}).get("operation")
            if operation not in PATCH_OPERATIONS:
                problems.add(pw, f"patch.operation must be one of {sorted(PATCH_OPERATIONS)}")
            context = patch.get("match", {}).get("context", "ANY")
            if context not in PATCH_CONTEXTS:
                problems.add(pw, f"match.context must be one of {sorted(PATCH_CONTEXTS)}")
            if apply_to not in APPLY_TO:
                problems.add(pw, f"applyTo must be one of {sorted(APPLY_TO)}")
                continue
            if operation == "REMOVE":
                continue
            value = patch.get("patch", {}).get("value")
            msg = parse_envoy(_without_newer_fields(value), APPLY_TO[apply_to], f"{pw} patch.value", problems, partial=operation == "MERGE")
            if msg is None:
                continue
            if apply_to == "LISTENER" and "per_connection_buffer_limit_bytes" in value:
                buffer_limit = value["per_connection_buffer_limit_bytes"]
    # HTTP filters patched in after waygate's, and the clusters Istio makes of Services
    # (`outbound|<port>||<name>.<namespace>.svc.cluster.local`).
    after_waygate = [
        patch.get("patch", {}).get("value") or {}
        for _, ef in by_kind.get("EnvoyFilter", [])
        for patch in ef["spec"].get("configPatches", [])
        if patch.get("applyTo") == "HTTP_FILTER" and patch.get("patch", {}).get("operation") == "INSERT_AFTER"
        and patch.get("match", {}).get("listener", {}).get("filterChain", {}).get("filter", {}).get("subFilter", {}).get("name") == "waygate.waygate"
    ]
    service_clusters = {
        f"outbound|{port.get('port')}||{svc['metadata'].get('name')}.{svc['metadata'].get('namespace', 'default')}.svc.cluster.local"
        for _, svc in by_kind.get("Service", [])
        for port in svc.get("spec", {}).get("ports", [])
    } | {
        f"outbound|{port.get('number')}||{host}"
        for host, se in service_hosts.items()
        for port in se["spec"].get("ports", [])
    }
    patches = [
        (f"{where} configPatches[{i}]", patch)
        for where, ef in by_kind.get("EnvoyFilter", [])
        for i, patch in enumerate(ef["spec"].get("configPatches", []))
    ]
    router = _istio_router_fallback(patches, by_kind, problems)
    for pw, patch in patches:
        value = patch.get("patch", {}).get("value") or {}
        typed = value.get("typed_config", {}) if isinstance(value, dict) else {}
        if patch.get("applyTo") == "EXTENSION_CONFIG" and typed.get("@type") == TYPE_PREFIX + WASM and value.get("name") not in router.upstream_roles:
                where, i = pw.rsplit(" configPatches[", 1)[0], int(pw.rsplit("[", 1)[1].rstrip("]"))
                plugin = typed.get("config", {})
                env = plugin.get("vm_config", {}).get("environment_variables", {})
                around = Surroundings(
                    routes=routes + router.routes,
                    targets=set(service_hosts),
                    buffer_limit=buffer_limit,
                    env_keys=set(env.get("host_env_keys", [])) | set(env.get("key_values", {})),
                    # In the mesh a provider's route goes to its ServiceEntry host, its authority.
                    target_of=lambda provider: provider.get("authority"),
                    unset_timeout_is_none=True,
                    later_filters=after_waygate,
                    clusters=service_clusters,
                    retries_by_default=True,
                    upstream_role=router.upstream_role_clusters,
                    max_retries=router.max_retries,
                )
                for key in env.get("host_env_keys", []):
                    if key not in proxy_env:
                        problems.add(f"{where} configPatches[{i}]", f"host_env_keys `{key}` is not in the istio-proxy container's env")
                check_wasm_plugin(plugin, f"{where} configPatches[{i}] patch.value.typed_config.config", around, problems)
                if router.routes:
                    # Applied together with router-fallback.yaml, the plugin says "router"
                    # (docs/deploying.md "Load into Istio" switches it with sed on this very text).
                    if '"fallback": "http_call"' not in plugin.get("configuration", {}).get("value", ""):
                        problems.add(f"{where} configPatches[{i}]", 'the plugin configuration must say `"fallback": "http_call"` literally: docs/deploying.md switches it to router with sed')
                    check_wasm_plugin(_switched_to_router(plugin), f"{where} configPatches[{i}] (\"fallback\": \"router\", with the router fallback patches) patch.value.typed_config.config", around, problems)
                for name, upstream in router.upstream_roles.items():
                    if upstream.get("vm_config") != plugin.get("vm_config"):
                        problems.add(f"{where} configPatches[{i}]", f"the upstream role `{name}` has another vm_config than the filter: they would not share a VM")
                names = {
                    p.get("patch", {}).get("value", {}).get("name")
                    for _, e in by_kind.get("EnvoyFilter", [])
                    for p in e["spec"].get("configPatches", [])
                    if p.get("applyTo") == "HTTP_FILTER"
                }
                if value.get("name") not in names:
                    problems.add(f"{where} configPatches[{i}]", f"no HTTP_FILTER patch refers to extension config `{value.get('name')}`")


class IstioRouterFallback:
    """Router fallback as EnvoyFilter patches (envoy/istio/router-fallback.yaml)."""

    def __init__(self) -> None:
        self.routes: list[Route] = []  # routes patched into the gateway's route configuration
        self.upstream_roles: dict[str, dict] = {}  # ECDS name -> Wasm config of the upstream role
        self.upstream_role_clusters: set[str] = set()
        self.max_retries: dict[str, int] = {}  # cluster -> DestinationRule connectionPool.http.maxRetries


def _istio_router_fallback(patches: list, by_kind: dict, problems: Problems) -> IstioRouterFallback:
    found = IstioRouterFallback()
    for _, patch in patches:
        value = patch.get("patch", {}).get("value") or {}
        typed = value.get("typed_config", {}) if isinstance(value, dict) else {}
        if patch.get("applyTo") == "EXTENSION_CONFIG" and typed.get("@type") == TYPE_PREFIX + WASM:
            plugin = typed.get("config", {})
            if _is_upstream_role(plugin.get("configuration", {}).get("value")):
                found.upstream_roles[value.get("name")] = plugin
    counts_attempts = any(
        patch.get("applyTo") == "VIRTUAL_HOST" and patch.get("patch", {}).get("operation") == "MERGE"
        and (patch.get("patch", {}).get("value") or {}).get("include_request_attempt_count") is True
        for _, patch in patches
    )
    referred = set()
    for pw, patch in patches:
        value = patch.get("patch", {}).get("value") or {}
        operation = patch.get("patch", {}).get("operation")
        if patch.get("applyTo") == "HTTP_ROUTE" and operation in ("INSERT_FIRST", "ADD"):
            route = _envoy_route(value, set())
            route.counts_attempts = counts_attempts
            found.routes.append(route)
        if patch.get("applyTo") == "CLUSTER" and operation == "MERGE":
            match = patch.get("match", {}).get("cluster", {})
            cluster = f"outbound|{match.get('portNumber')}||{match.get('service')}"
            options = value.get("typed_extension_protocol_options", {}).get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {})
            names = {f.get("name") for f in options.get("http_filters", []) if "config_discovery" in f}
            if names & set(found.upstream_roles):
                found.upstream_role_clusters.add(cluster)
                referred |= names
    for name, plugin in found.upstream_roles.items():
        if name not in referred:
            problems.add(f"extension config `{name}`", "no CLUSTER patch runs this upstream role")
        if plugin.get("failure_policy") != "FAIL_RELOAD" or plugin.get("allow_on_headers_stop_iteration") is not True:
            problems.add(f"extension config `{name}`", "the upstream role needs failure_policy FAIL_RELOAD and allow_on_headers_stop_iteration")
    for _, dr in by_kind.get("DestinationRule", []):
        for port in dr["spec"].get("trafficPolicy", {}).get("portLevelSettings", []):
            retries = port.get("connectionPool", {}).get("http", {}).get("maxRetries")
            if retries is not None:
                found.max_retries[f"outbound|{port.get('port', {}).get('number')}||{dr['spec'].get('host')}"] = retries
    return found


def _is_upstream_role(configuration: str | None) -> bool:
    try:
        return json.loads(configuration or "null") == {"role": "upstream"}
    except json.JSONDecodeError:
        return False


def _switched_to_router(plugin: dict) -> dict:
    """The Wasm config with its plugin configuration saying `"fallback": "router"`."""
    switched = json.loads(json.dumps(plugin))
    configuration = switched.get("configuration", {})
    try:
        config = json.loads(configuration.get("value", ""))
    except json.JSONDecodeError:
        return plugin
    if isinstance(config, dict):
        config["fallback"] = "router"
        configuration["value"] = json.dumps(config)
    return switched


# ---- docker compose -----------------------------------------------------------------------


def compose_schema() -> dict | None:
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "config" / "compose_spec.json"
    return json.loads(path.read_text()) if path.exists() else None


def check_compose(root: Path, info: BootstrapInfo | None, problems: Problems) -> None:
    path = root / "docker-compose.yml"
    where = "docker-compose.yml"
    if not path.exists():
        problems.add(where, "missing")
        return
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        problems.add(where, f"not YAML: {e}")
        return
    schema = compose_schema()
    if schema is None:
        problems.add(where, "the Compose JSON schema is not installed (pip install --no-deps docker-compose, see Makefile)")
    else:
        import jsonschema

        validator = jsonschema.Draft7Validator(schema)
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            loc = ".".join(str(p) for p in error.absolute_path) or "(top)"
            problems.add(f"{where}: {loc}", error.message)
    if not isinstance(doc, dict):
        return
    services = doc.get("services") or {}
    envoy = services.get("envoy")
    fakes = services.get("fakes")
    if not isinstance(envoy, dict) or not isinstance(fakes, dict):
        problems.add(where, "services `envoy` and `fakes` are required")
        return
    image = str(envoy.get("image", ""))
    if not re.fullmatch(r"envoyproxy/envoy:v1\.(3[5-9]|[4-9][0-9])\.[0-9]+", image):
        problems.add(f"{where}: services.envoy.image", f"`{image}` must be a pinned envoyproxy/envoy:v1.X.Y with X >= 35")
    mounts = {}
    for volume in envoy.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            if len(parts) >= 2:
                mounts[parts[1]] = parts[0]
        elif isinstance(volume, dict):
            mounts[volume.get("target")] = volume.get("source")
    expected = {"/etc/envoy/envoy.yaml": "./envoy/envoy.yaml"}
    if info is not None:
        for wasm in info.wasm_files:
            expected[wasm] = "./target/wasm32-wasip1/wasm/waygate.wasm"
    for target, source in expected.items():
        if mounts.get(target) != source:
            problems.add(f"{where}: services.envoy.volumes", f"must mount {source} at {target}")
    command = envoy.get("command") or []
    if "/etc/envoy/envoy.yaml" not in command:
        problems.add(f"{where}: services.envoy.command", "must run envoy -c /etc/envoy/envoy.yaml")
    environment = envoy.get("environment") or {}
    names = set(environment) if isinstance(environment, dict) else {e.split("=")[0] for e in environment}
    env_example = (root / ".env.example").read_text() if (root / ".env.example").exists() else ""
    if not env_example:
        problems.add(".env.example", "missing")
    if info is not None:
        for key in sorted(info.env_keys):
            if key not in names:
                problems.add(f"{where}: services.envoy.environment", f"`{key}` (host_env_keys) is not passed to Envoy")
            if not re.search(rf"^#?\s*{re.escape(key)}=", env_example, re.M):
                problems.add(".env.example", f"does not document `{key}`")
        fake = info.clusters.get("fake")
        if fake is None:
            problems.add("envoy/envoy.yaml", "no `fake` cluster")
        else:
            address = fake["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            if address.get("address") not in services:
                problems.add("envoy/envoy.yaml", f"cluster `fake` points at `{address.get('address')}`, which is not a compose service")
            fake_command = " ".join(str(c) for c in (fakes.get("command") or []))
            if f"0.0.0.0:{address.get('port_value')}" not in fake_command:
                problems.add(f"{where}: services.fakes.command", f"must listen on 0.0.0.0:{address.get('port_value')} (the `fake` cluster's port)")
        check_compose_rate_limiting(services, info, where, problems)
        published = " ".join(str(p) for p in envoy.get("ports", []))
        for port in info.listener_ports:
            if f":{port}" not in published:
                problems.add(f"{where}: services.envoy.ports", f"listener port {port} is not published")
    build = fakes.get("build") or {}
    dockerfile = root / (build.get("context", ".") if isinstance(build, dict) else build) / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
    if not dockerfile.exists():
        problems.add(f"{where}: services.fakes.build", f"{dockerfile.relative_to(root)} does not exist")


def check_compose_rate_limiting(services: dict, info: BootstrapInfo, where: str, problems: Problems) -> None:
    """envoy/envoy.yaml's `ratelimit` cluster is the compose service that serves Envoy's rate
    limit API, on that port, reading its keys from the envoy.yaml the gateways run."""
    cluster = info.clusters.get("ratelimit")
    if cluster is None:
        return
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    service = services.get(address.get("address"))
    if not isinstance(service, dict):
        problems.add("envoy/envoy.yaml", f"cluster `ratelimit` points at `{address.get('address')}`, which is not a compose service")
        return
    sw = f"{where}: services.{address.get('address')}"
    command = [str(c) for c in service.get("command") or []]
    if f"0.0.0.0:{address.get('port_value')}" not in command:
        problems.add(f"{sw}.command", f"must listen on 0.0.0.0:{address.get('port_value')} (the `ratelimit` cluster's port)")
    config = command[command.index("--plugin-config") + 1] if "--plugin-config" in command[:-1] else None
    mounted = {str(v).split(":")[1]: str(v).split(":")[0] for v in service.get("volumes", []) if isinstance(v, str) and ":" in v}
    if config is None or mounted.get(config) != "./envoy/envoy.yaml":
        problems.add(f"{sw}.command", "must read its keys (--plugin-config) from the mounted ./envoy/envoy.yaml")
    redis = next((c for c in command if c.startswith("redis://")), "")
    redis_host = redis.removeprefix("redis://").split(":")[0].split("/")[0]
    if redis_host not in services:
        problems.add(f"{sw}.command", f"its Redis `{redis_host}` is not a compose service")


def check_dockerfiles(root: Path, problems: Problems) -> None:
    oci = root / "envoy/istio/Dockerfile"
    if not oci.exists():
        problems.add("envoy/istio/Dockerfile", "missing")
    else:
        instructions = [line.strip() for line in oci.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
        if not instructions or instructions[0] != "FROM scratch":
            problems.add("envoy/istio/Dockerfile", "must start FROM scratch (Istio's Wasm OCI image)")
        if not any(re.match(r"COPY\s+\S+\s+\.?/plugin\.wasm$", i) for i in instructions):
            problems.add("envoy/istio/Dockerfile", "must COPY the module to /plugin.wasm")


# ---- main -----------------------------------------------------------------------------------


def run(root: Path) -> Problems:
    problems = Problems()
    shipped = None
    bootstraps = sorted((root / "envoy").glob("*.yaml"))
    if not bootstraps:
        problems.add("envoy/", "no bootstrap found")
    for path in bootstraps:
        info = check_bootstrap(path, root, problems)
        if path.name == "envoy.yaml":
            shipped = info
    if (root / "envoy/istio").is_dir():
        check_istio(root / "envoy/istio", root, problems)
    else:
        problems.add("envoy/istio/", "missing")
    check_compose(root, shipped, problems)
    check_dockerfiles(root, problems)
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    problems = run(args.root.resolve())
    if problems:
        for line in problems.lines:
            print(line, file=sys.stderr)
        print(f"check-configs: {len(problems.lines)} problem(s)", file=sys.stderr)
        return 1
    print("check-configs: every Envoy config parses into Envoy's API types; manifests and compose file are consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
