//! Request checks of the fake Gemini API, like the real one: proto field names
//! (camelCase or snake_case; unknown names refused), `contents` / `parts` shapes, roles,
//! function call / response turns, generation config ranges, tool declarations.

use serde_json::{Map, Value};

use super::{Checked, camel, field, field_of, invalid, snake};
use crate::reply::Reply;

const REQUEST: &[&str] = &[
    "model",
    "contents",
    "tools",
    "toolConfig",
    "safetySettings",
    "systemInstruction",
    "generationConfig",
    "cachedContent",
];
const CONTENT: &[&str] = &["parts", "role"];
const PART: &[&str] = &[
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
    "thought",
    "thoughtSignature",
    "videoMetadata",
    "mediaResolution",
];
const PART_DATA: &[&str] = &[
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
];
const GENERATION: &[&str] = &[
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "responseModalities",
    "candidateCount",
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
    "logprobs",
    "enableEnhancedCivicAnswers",
    "speechConfig",
    "thinkingConfig",
    "mediaResolution",
    "imageConfig",
];
const TOOL: &[&str] = &[
    "functionDeclarations",
    "googleSearch",
    "googleSearchRetrieval",
    "codeExecution",
    "urlContext",
    "computerUse",
    "fileSearch",
    "googleMaps",
];
const DECLARATION: &[&str] = &[
    "name",
    "description",
    "parameters",
    "parametersJsonSchema",
    "response",
    "responseJsonSchema",
    "behavior",
];
const MIME_TYPES: &[&str] = &[
    "text/plain",
    "application/json",
    "application/xml",
    "application/yaml",
    "text/x.enum",
];

pub(super) fn validate(body: &Map<String, Value>) -> Checked {
    known(body, REQUEST, None)?;
    let contents = match body.get("contents").and_then(Value::as_array) {
        Some(c) if !c.is_empty() => c,
        _ => {
            return Err(invalid(
                "* GenerateContentRequest.contents: contents is not specified\n",
            ));
        }
    };
    let mut previous_calls = 0;
    for (i, content) in contents.iter().enumerate() {
        previous_calls = validate_content(i, content, previous_calls)?;
    }
    if let Some(system) = field(body, "systemInstruction") {
        let Some(map) = system.as_object() else {
            return Err(invalid(
                "Invalid JSON payload received. Unknown name \"system_instruction\": Proto field is not repeating, cannot start list.",
            ));
        };
        known(map, CONTENT, Some("system_instruction"))?;
    }
    validate_generation(body)?;
    validate_tools(body)
}

/// Checks `contents[i]`; returns how many function calls it holds.
fn validate_content(i: usize, content: &Value, previous_calls: usize) -> Result<usize, Reply> {
    let at = format!("contents[{i}]");
    let Some(map) = content.as_object() else {
        return Err(invalid(&format!(
            "Invalid JSON payload received. Unknown name at '{at}': Cannot bind a list to a message."
        )));
    };
    known(map, CONTENT, Some(&at))?;
    match map.get("role").and_then(Value::as_str) {
        None | Some("user" | "model" | "") => {}
        Some(_) => return Err(invalid("Please use a valid role: user, model.")),
    }
    let parts = match map.get("parts").and_then(Value::as_array) {
        Some(p) if !p.is_empty() => p,
        _ => {
            return Err(invalid(&format!(
                "* GenerateContentRequest.{at}.parts: contents.parts must not be empty.\n"
            )));
        }
    };
    let (mut calls, mut responses) = (0, 0);
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}.parts[{j}]");
        let Some(part) = part.as_object() else {
            return Err(invalid(&format!(
                "Invalid JSON payload received. Unknown name at '{at}': Cannot bind a list to a message."
            )));
        };
        known(part, PART, Some(&at))?;
        let data: Vec<String> = part
            .keys()
            .map(|k| camel(k))
            .filter(|k| PART_DATA.contains(&k.as_str()))
            .collect();
        match data.as_slice() {
            [] => {
                return Err(invalid(&format!(
                    "* GenerateContentRequest.{at}.data: required oneof field 'data' must have one initialized field\n"
                )));
            }
            [one] => validate_data(&at, one, part)?,
            _ => {
                return Err(invalid(&format!(
                    "Invalid JSON payload received. Multiple values for oneof \"data\" at '{at}'."
                )));
            }
        }
        calls += usize::from(data.first().is_some_and(|d| d == "functionCall"));
        responses += usize::from(data.first().is_some_and(|d| d == "functionResponse"));
    }
    if responses > 0 && previous_calls == 0 {
        return Err(invalid(
            "Please ensure that function response turn comes immediately after a function call turn.",
        ));
    }
    if responses > 0 && responses != previous_calls {
        return Err(invalid(
            "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.",
        ));
    }
    Ok(calls)
}

fn validate_data(at: &str, kind: &str, part: &Map<String, Value>) -> Checked {
    let value = part
        .get(kind)
        .or_else(|| part.get(snake(kind).as_str()))
        .unwrap_or(&Value::Null);
    let need = |key: &str| {
        value
            .get(key)
            .or_else(|| value.get(snake(key).as_str()))
            .is_some_and(|v| !v.is_null())
    };
    let missing = match kind {
        "text" if !value.is_string() => Some("text"),
        "inlineData" if !need("mimeType") => Some("inline_data.mime_type"),
        "inlineData" if !need("data") => Some("inline_data.data"),
        "fileData" if !need("fileUri") => Some("file_data.file_uri"),
        "functionCall" if !need("name") => Some("function_call.name"),
        "functionResponse" if !need("name") => Some("function_response.name"),
        "functionResponse" if !value.get("response").is_some_and(Value::is_object) => {
            Some("function_response.response")
        }
        _ => None,
    };
    match missing {
        Some(what) => Err(invalid(&format!(
            "* GenerateContentRequest.{at}.{what}: field is required and must be valid.\n"
        ))),
        None => Ok(()),
    }
}

fn validate_generation(body: &Map<String, Value>) -> Checked {
    let Some(config) = field(body, "generationConfig") else {
        return Ok(());
    };
    let Some(config) = config.as_object() else {
        return Err(invalid(
            "Invalid JSON payload received. Unknown name \"generation_config\": Cannot bind a list to a message.",
        ));
    };
    known(config, GENERATION, Some("generation_config"))?;
    let get = |k: &str| config.get(k).or_else(|| config.get(snake(k).as_str()));
    let bad = |key: &str, ok: &dyn Fn(&Value) -> bool| get(key).is_some_and(|v| !ok(v));
    if bad("candidateCount", &|v| v.as_u64().is_some_and(|n| (1..=8).contains(&n))) {
        return Err(invalid(
            "* GenerateContentRequest.generation_config.candidate_count: candidate_count must be in [1, 8].\n",
        ));
    }
    if bad("maxOutputTokens", &|v| v.as_u64().is_some_and(|m| m >= 1)) {
        return Err(invalid(
            "* GenerateContentRequest.generation_config.max_output_tokens: max_output_tokens must be positive.\n",
        ));
    }
    if bad("temperature", &|v| v.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t))) {
        return Err(invalid(
            "* GenerateContentRequest.generation_config.temperature: temperature must be in [0.0, 2.0]\n",
        ));
    }
    if bad("responseMimeType", &|v| {
        v.as_str().is_some_and(|m| MIME_TYPES.contains(&m))
    }) {
        return Err(invalid(
            "* GenerateContentRequest.generation_config.response_mime_type: allowed mimetypes are `text/plain`, `application/json`, `application/xml`, `application/yaml` and `text/x.enum`.\n",
        ));
    }
    Ok(())
}

fn validate_tools(body: &Map<String, Value>) -> Checked {
    for (i, tool) in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("tools[{i}]");
        let Some(tool) = tool.as_object() else {
            return Err(invalid(&format!(
                "Invalid JSON payload received. Unknown name at '{at}': Cannot bind a list to a message."
            )));
        };
        known(tool, TOOL, Some(&at))?;
        let declarations = tool
            .get("functionDeclarations")
            .or_else(|| tool.get("function_declarations"));
        for (j, d) in declarations.and_then(Value::as_array).into_iter().flatten().enumerate() {
            let at = format!("{at}.function_declarations[{j}]");
            if let Some(map) = d.as_object() {
                known(map, DECLARATION, Some(&at))?;
            }
            if d.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err(invalid(&format!(
                    "* GenerateContentRequest.{at}.name: Name cannot be empty.\n"
                )));
            }
        }
    }
    let mode = field(body, "toolConfig")
        .and_then(|c| field_of(c, "functionCallingConfig"))
        .and_then(|c| c.get("mode"));
    match mode {
        None => Ok(()),
        Some(Value::String(m)) if ["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"].contains(&m.as_str()) => {
            Ok(())
        }
        Some(other) => Err(invalid(&format!(
            "Invalid value at 'tool_config.function_calling_config.mode' (type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), {other}"
        ))),
    }
}

/// Refuses field names the proto does not have (camelCase or snake_case accepted).
fn known(map: &Map<String, Value>, allowed: &[&str], at: Option<&str>) -> Checked {
    match map.keys().find(|k| !allowed.contains(&camel(k).as_str())) {
        None => Ok(()),
        Some(k) => {
            let place = at.map(|a| format!(" at '{a}'")).unwrap_or_default();
            Err(invalid(&format!(
                "Invalid JSON payload received. Unknown name \"{k}\"{place}: Cannot find field."
            )))
        }
    }
}
