//! A header map as Envoy's `HeaderMapImpl` shows it to a plugin: lowercase keys, pseudo
//! headers first, duplicates kept, `get` answering the first value only (context.cc has a
//! TODO about that), values as raw bytes (non-UTF-8 allowed, so a plugin's UTF-8 unwraps
//! can be tested).

use std::borrow::Cow;
use std::ops::ControlFlow;

use proxy_wasm_host::{HeaderMap, NotAllowed, PairVisitor};

#[derive(Debug, Clone, Default)]
pub struct Headers {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Set while lent read-only (`on_log`): writes answer `BadArgument`, as Envoy's
    /// const access-log maps do.
    pub read_only: bool,
}

impl Headers {
    pub fn new(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        Self {
            pairs,
            read_only: false,
        }
    }

    pub fn first(&self, key: &str) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(k, _)| k.as_slice() == key.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    pub fn first_str(&self, key: &str) -> Option<&str> {
        self.first(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn all(&self, key: &str) -> impl Iterator<Item = &[u8]> {
        self.pairs
            .iter()
            .filter(move |(k, _)| k.as_slice() == key.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    pub fn pairs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.pairs
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn set(&mut self, key: &str, value: &[u8]) {
        let _ = HeaderMap::set(self, key.as_bytes(), value);
    }

    pub fn add(&mut self, key: &str, value: &[u8]) {
        self.pairs.push((key.as_bytes().to_vec(), value.to_vec()));
    }

    pub fn remove(&mut self, key: &str) {
        self.pairs.retain(|(k, _)| k.as_slice() != key.as_bytes());
    }

    pub fn contains(&self, key: &str) -> bool {
        self.first(key).is_some()
    }

    fn writable(&self) -> Result<(), NotAllowed> {
        if self.read_only { Err(NotAllowed) } else { Ok(()) }
    }
}

fn lower(key: &[u8]) -> Vec<u8> {
    key.to_ascii_lowercase()
}

impl HeaderMap for Headers {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let key = lower(key);
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| Cow::Borrowed(v.as_slice()))
    }

    fn for_each_pair(&self, f: &mut PairVisitor<'_>) -> ControlFlow<()> {
        for (k, v) in &self.pairs {
            f(k, v)?;
        }
        ControlFlow::Continue(())
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), NotAllowed> {
        self.writable()?;
        let key = lower(key);
        // Envoy `setCopy`: the first entry takes the value, later duplicates go.
        let mut kept = false;
        self.pairs.retain_mut(|(k, v)| {
            if *k != key {
                return true;
            }
            if kept {
                return false;
            }
            kept = true;
            *v = value.to_vec();
            true
        });
        if !kept {
            self.pairs.push((key, value.to_vec()));
        }
        Ok(())
    }

    fn add(&mut self, key: &[u8], value: &[u8]) -> Result<(), NotAllowed> {
        self.writable()?;
        self.pairs.push((lower(key), value.to_vec()));
        Ok(())
    }

    fn remove(&mut self, key: &[u8]) -> Result<(), NotAllowed> {
        self.writable()?;
        let key = lower(key);
        self.pairs.retain(|(k, _)| *k != key);
        Ok(())
    }

    fn replace_all(&mut self, pairs: &[(&[u8], &[u8])]) -> Result<(), NotAllowed> {
        self.writable()?;
        self.pairs = pairs.iter().map(|(k, v)| (lower(k), v.to_vec())).collect();
        Ok(())
    }

    fn len(&self) -> usize {
        self.pairs.len()
    }
}
