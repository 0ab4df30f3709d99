//! The official OpenAI and Anthropic clients (Python, Node), the Vercel AI SDK and the
//! OpenAI Agents SDK against the running gateway: what a real user's code sees (typed
//! answers, stream iteration, typed exceptions). `make test` installs the pinned clients: Python's into
//! `target/pyenv`, Node's into `tests/clients/node/node_modules`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, root};

/// Runs one of `tests/clients/` with the pinned Python client against a fresh
/// gateway.
fn run_client_script(script: &str, args: &[&str]) {
    let python = root().join("target/pyenv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (it installs the OpenAI client)",
        python.display()
    );
    run_client(
        &python.to_string_lossy(),
        &root().join("tests/clients").join(script),
        args,
    );
}

/// Runs `script` with `program` against a fresh gateway, from a developer's
/// environment; the script asserts what it sees and ends by printing "all checks passed".
fn run_client(program: &str, script: &std::path::Path, args: &[&str]) {
    let gw = Gateway::start();
    let base_url = format!("http://{}/api/v1", gw.addr);
    let out = std::process::Command::new(program)
        .arg(script)
        .arg(&base_url)
        .arg(DEV_KEY)
        .args(args)
        // A developer's environment as it often is: the client sends these as
        // `OpenAI-Organization` and `OpenAI-Project`, which the gateway's key does not
        // belong to (the fake OpenAI refuses a foreign organization, as OpenAI does).
        .env("OPENAI_ORG_ID", "org-developers-own")
        .env("OPENAI_PROJECT_ID", "proj_developers_own")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{stderr}\n--- gateway log ---\n{}",
        script.display(),
        gw.logs()
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[test]
fn the_official_python_client_works_against_the_gateway() {
    run_client_script("openai_client.py", &[]);
}

#[test]
fn the_official_python_client_works_against_anthropic_and_gemini_backed_models() {
    run_client_script("openai_client_providers.py", &[]);
}

/// Envoy's listener takes HTTP/2 too (`codec_type: AUTO`): in a mesh the
/// client's sidecar speaks it. The request body then ends on a data frame
/// rather than on an empty one, and streams go out as HTTP/2 data frames.
#[test]
fn the_official_python_client_works_over_http2() {
    run_client_script("openai_client.py", &["http2"]);
}

/// The official OpenAI Node SDK and the Vercel AI SDK (`tests/clients/node`, pinned by
/// its lock file, installed by `make test`).
#[test]
fn the_official_node_client_and_the_ai_sdk_work_against_the_gateway() {
    let script = root().join("tests/clients/node/clients.mjs");
    assert!(
        root().join("tests/clients/node/node_modules/openai").exists(),
        "the Node clients are missing: run `make test` (it installs them)"
    );
    run_client("node", &script, &[]);
}

/// The Responses API with the official Python client: answers, streams, a function
/// tool round trip and refusals, through each provider API (`tests/clients/openai_responses.py`).
#[test]
fn the_official_python_client_speaks_the_responses_api_to_every_provider_api() {
    run_client_script("openai_responses.py", &[]);
}

/// The clients that default to the Responses API: the OpenAI Node SDK, the AI SDK's
/// `openai(model)` with a tool round trip, and the OpenAI Agents SDK with a function
/// tool, through each provider API (`tests/clients/node/responses.mjs`).
#[test]
fn the_node_sdk_the_ai_sdk_default_and_the_agents_sdk_speak_responses_to_every_provider_api() {
    let script = root().join("tests/clients/node/responses.mjs");
    assert!(
        root().join("tests/clients/node/node_modules/@openai/agents").exists(),
        "the Node clients are missing: run `make test` (it installs them)"
    );
    run_client("node", &script, &[]);
}

/// Anthropic's Messages API with the official Anthropic Python client: answers, streams,
/// a tool round trip, an image, errors in Anthropic's envelope, through each provider API
/// (`tests/clients/anthropic_messages.py`).
#[test]
fn the_official_anthropic_python_client_speaks_messages_to_every_provider_api() {
    run_client_script("anthropic_messages.py", &[]);
}

/// Anthropic's Messages API with the official Anthropic TypeScript SDK, through each
/// provider API (`tests/clients/node/anthropic.mjs`).
#[test]
fn the_official_anthropic_typescript_sdk_speaks_messages_to_every_provider_api() {
    let script = root().join("tests/clients/node/anthropic.mjs");
    assert!(
        root()
            .join("tests/clients/node/node_modules/@anthropic-ai/sdk")
            .exists(),
        "the Node clients are missing: run `make test` (it installs them)"
    );
    run_client("node", &script, &[]);
}
