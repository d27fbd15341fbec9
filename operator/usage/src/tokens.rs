//! Token counts of model calls, by kind, as the egress proxy reads them from answers
//! (`protobot_egress::usage`). Fields default to 0 when read, so a ledger written before a
//! kind was counted still reads.

use serde::{Deserialize, Serialize};

/// Tokens of one or more calls, by kind.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TokenCounts {
    /// Input read fresh (not from the cache, not written to it).
    pub input: u64,
    /// Generated tokens, reasoning included.
    pub output: u64,
    /// Input read from the prompt cache.
    pub cache_read: u64,
    /// Input written to the prompt cache.
    pub cache_write: u64,
    /// The part of `output` reported as reasoning (not counted twice).
    pub reasoning: u64,
}

impl TokenCounts {
    /// Every kind with its label value (`protobot_model_tokens_total{kind}`).
    pub fn by_kind(&self) -> [(TokenKind, u64); 5] {
        [
            (TokenKind::Input, self.input),
            (TokenKind::Output, self.output),
            (TokenKind::CacheRead, self.cache_read),
            (TokenKind::CacheWrite, self.cache_write),
            (TokenKind::Reasoning, self.reasoning),
        ]
    }

    /// Adds `other` (saturating: a hostile count cannot wrap a total).
    pub fn add(&mut self, other: &TokenCounts) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
    }

    /// Input of every kind plus output (reasoning is inside output).
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// A kind of token (the `kind` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// [`TokenCounts::input`].
    Input,
    /// [`TokenCounts::output`].
    Output,
    /// [`TokenCounts::cache_read`].
    CacheRead,
    /// [`TokenCounts::cache_write`].
    CacheWrite,
    /// [`TokenCounts::reasoning`].
    Reasoning,
}

impl TokenKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::Output => "output",
            TokenKind::CacheRead => "cache-read",
            TokenKind::CacheWrite => "cache-write",
            TokenKind::Reasoning => "reasoning",
        }
    }
}
