//! Model-id globs for `keys[].models`: `*` matches any run of characters,
//! everything else matches itself.

/// A compiled glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    /// The literal pieces between `*`s.
    parts: Vec<String>,
    leading_star: bool,
    trailing_star: bool,
}

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        Glob {
            parts: pattern.split('*').map(str::to_string).collect(),
            leading_star: pattern.starts_with('*'),
            trailing_star: pattern.ends_with('*'),
        }
    }

    /// Greedy-free matching: each literal piece is found at its earliest
    /// position, which is correct for `*`-only globs and runs in linear time.
    pub fn matches(&self, text: &str) -> bool {
        let parts = &self.parts;
        if parts.len() == 1 {
            return parts.first().is_some_and(|p| p == text);
        }
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return false;
        };
        if !self.leading_star && !text.starts_with(first.as_str()) {
            return false;
        }
        if !self.trailing_star && !text.ends_with(last.as_str()) {
            return false;
        }
        let mut rest = match text.get(first.len()..) {
            Some(r) => r,
            None => return false,
        };
        let middle = parts.get(1..parts.len() - 1).unwrap_or(&[]);
        for piece in middle {
            match rest.find(piece.as_str()) {
                Some(at) => rest = rest.get(at + piece.len()..).unwrap_or(""),
                None => return false,
            }
        }
        rest.len() >= last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn star_matches_any_run() {
        let g = Glob::new("openai/*");
        assert!(g.matches("openai/gpt-4o"));
        assert!(g.matches("openai/"));
        assert!(!g.matches("anthropic/claude"));
        assert!(Glob::new("*").matches("anything/at-all"));
        assert!(Glob::new("*/gpt-*-mini").matches("openai/gpt-4o-mini"));
        assert!(!Glob::new("*/gpt-*-mini").matches("openai/gpt-4o"));
        assert!(Glob::new("a*b*c").matches("abc"));
        assert!(!Glob::new("a*bc*c").matches("abc"));
    }

    #[test]
    fn no_star_is_an_exact_match() {
        let g = Glob::new("anthropic/claude-3-5-haiku");
        assert!(g.matches("anthropic/claude-3-5-haiku"));
        assert!(!g.matches("anthropic/claude-3-5-haiku-latest"));
    }

    #[test]
    fn prefix_and_suffix_may_not_overlap() {
        assert!(!Glob::new("ab*ba").matches("aba"));
        assert!(Glob::new("ab*ba").matches("abba"));
    }
}
