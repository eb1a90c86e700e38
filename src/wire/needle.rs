//! Substring tests on raw JSON-RPC lines with the searcher built once per needle.
//!
//! `memchr::memmem::find` builds its SIMD searcher on every call; the forwarding hot path asks
//! a handful of these questions per call, so each needle keeps its built searcher.

use std::sync::OnceLock;

use memchr::memmem::Finder;

/// A needle searched for in many haystacks (a `static`).
pub struct Needle {
    bytes: &'static [u8],
    finder: OnceLock<Finder<'static>>,
}

impl Needle {
    /// A needle; its searcher is built on first use.
    pub const fn new(bytes: &'static [u8]) -> Self {
        Self {
            bytes,
            finder: OnceLock::new(),
        }
    }

    /// Whether `haystack` contains the needle.
    pub fn found_in(&self, haystack: &[u8]) -> bool {
        self.finder
            .get_or_init(|| Finder::new(self.bytes))
            .find(haystack)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_needle_is_found_wherever_it_is_and_nowhere_else() {
        static N: Needle = Needle::new(b"tools/call");
        assert!(N.found_in(br#"{"method":"tools/call"}"#));
        assert!(N.found_in(b"tools/call"));
        assert!(!N.found_in(b"tools/cal"));
        assert!(!N.found_in(b""));
        // The searcher, once built, answers the same.
        assert!(N.found_in(b"xxtools/callxx"));
    }
}
