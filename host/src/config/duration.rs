//! Protobuf JSON `Duration` strings (`"15s"`, `"0.250s"`), as Envoy's YAML carries them.

use std::time::Duration;

/// Parses a protobuf JSON duration: decimal seconds followed by `s`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let digits = text
        .strip_suffix('s')
        .ok_or_else(|| format!("`{text}` is not a duration (expected e.g. \"15s\" or \"0.5s\")"))?;
    let (whole, fraction) = match digits.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (digits, ""),
    };
    let bad = || format!("`{text}` is not a duration (expected e.g. \"15s\" or \"0.5s\")");
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let seconds: u64 = whole.parse().map_err(|_| bad())?;
    let nanos: u32 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<9}").parse().map_err(|_| bad())?
    };
    Ok(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_whole_and_fractional_seconds() {
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("0.25s"), Ok(Duration::from_millis(250)));
        assert!(parse("15").is_err());
        assert!(parse("1m").is_err());
        assert!(parse("-1s").is_err());
    }
}
