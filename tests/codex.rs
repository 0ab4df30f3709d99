//! Codex CLI (`@openai/codex`, pinned in `tests/clients/node`) against the gateway, as a
//! user runs it: `codex exec` with a custom provider whose `base_url` ends in `/api/v1`
//! and `wire_api = "responses"`. Each turn is one where the model asks for a tool (Codex
//! runs the command) and gets its result, answered through each provider API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, root};

/// Codex's configuration for the gateway: the provider, and its web search tool
/// turned off (a tool the provider runs, which waygate refuses; docs/contract.md).
fn codex_home(gw: &Gateway) -> std::path::PathBuf {
    let home = root().join(format!("target/codex-home-{}", gw.addr.port()));
    std::fs::create_dir_all(&home).unwrap();
    let config = format!(
        r#"web_search = "disabled"
model_provider = "waygate"

[model_providers.waygate]
name = "waygate"
base_url = "http://{}/api/v1"
env_key = "WAYGATE_API_KEY"
wire_api = "responses"
"#,
        gw.addr
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    home
}

#[test]
fn codex_exec_runs_a_tool_turn_through_every_provider_api() {
    let codex = root().join("tests/clients/node/node_modules/.bin/codex");
    assert!(codex.exists(), "Codex CLI is missing: run `make test` (it installs it)");
    let gw = Gateway::start();
    let home = codex_home(&gw);
    let work = home.join("work");
    std::fs::create_dir_all(&work).unwrap();
    for provider in ["fake", "fakeanthropic", "fakegemini"] {
        let model = format!("{provider}/agent");
        let out = std::process::Command::new(&codex)
            .args(["exec", "--skip-git-repo-check", "-m", &model, "List the files here."])
            .current_dir(&work)
            .env("CODEX_HOME", &home)
            .env("WAYGATE_API_KEY", DEV_KEY)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let explain = || format!("{model}:\n{stdout}\n{stderr}\n--- gateway log ---\n{}", gw.logs());
        assert!(out.status.success(), "{}", explain());
        // The last message is the model's answer quoting the command's output, which
        // Codex ran and sent back as the function call's output.
        let answer = stdout.trim_end();
        assert!(answer.starts_with("The tool said: "), "{}", explain());
        assert!(answer.contains("Process exited with code"), "{}", explain());
    }
    // Both turns of each were served, by the provider asked for.
    let logs = gw.logs();
    for provider in ["fake", "fakeanthropic", "fakegemini"] {
        let served = format!("model={provider}/agent provider={provider} attempts={provider}:200 status=200");
        assert_eq!(logs.matches(&served).count(), 2, "{provider}:\n{logs}");
    }
}
