//! Claude Code (`@anthropic-ai/claude-code`, pinned in `tests/clients/node`) against the
//! gateway, as a user runs it: `claude -p` with `ANTHROPIC_BASE_URL` at the gateway's
//! `/api` and the gateway key as `ANTHROPIC_API_KEY`, telemetry off. It streams every
//! turn; one turn per provider API is a tool turn (Claude Code runs the Bash command the
//! model asks for and sends its result back).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, root};

/// `claude -p PROMPT --model MODEL` with Bash as its only tool, allowed to run.
fn claude(gw: &Gateway, home: &std::path::Path, model: &str, prompt: &str) -> String {
    let claude = root().join("tests/clients/node/node_modules/.bin/claude");
    assert!(
        claude.exists(),
        "Claude Code is missing: run `make test` (it installs it)"
    );
    let out = std::process::Command::new(&claude)
        .args([
            "-p",
            prompt,
            "--model",
            model,
            "--tools",
            "Bash",
            "--allowedTools",
            "Bash",
        ])
        .current_dir(home)
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", format!("http://{}/api", gw.addr))
        .env("ANTHROPIC_API_KEY", DEV_KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        // The tool list as declared (no deferred-tool placeholder): the fake's agent
        // calls the first tool.
        .env("ENABLE_TOOL_SEARCH", "false")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{model}:\n{stdout}\n{stderr}\n--- gateway log ---\n{}",
        gw.logs()
    );
    stdout
}

#[test]
fn claude_code_answers_and_runs_a_tool_turn_through_every_provider_api() {
    let gw = Gateway::start();
    let home = root().join(format!("target/claude-home-{}", gw.addr.port()));
    std::fs::create_dir_all(&home).unwrap();
    for (provider, hello) in [
        ("fake", "Hello from openai fake."),
        ("fakeanthropic", "Hello from anthropic fake."),
        ("fakegemini", "Hello from gemini fake."),
    ] {
        let said = claude(&gw, &home, &format!("{provider}/ok"), "say hi");
        assert_eq!(said.lines().last(), Some(hello), "{provider}: {said}");
        // The model asks for Bash; Claude Code runs the command and sends its result.
        let said = claude(&gw, &home, &format!("{provider}/agent"), "List the files.");
        assert!(said.contains("The tool said: "), "{provider}: {said}");
        assert!(said.contains("command not found"), "{provider}: {said}");
    }
    let logs = gw.logs();
    for provider in ["fake", "fakeanthropic", "fakegemini"] {
        let served = format!("model={provider}/agent provider={provider} attempts={provider}:200 status=200");
        assert_eq!(logs.matches(&served).count(), 2, "{provider}:\n{logs}");
    }
}
