//! The proxy's price table file (`protobot egress-proxy --prices`, the chart's
//! `egressProxy.prices`): the proxy-wide default prices. The table, its
//! parsing and the integer cost arithmetic are the pure core's
//! ([`protobot_usage::price`], re-exported here).

pub use protobot_usage::price::*;

/// Reads a price table file (YAML or JSON: model name → prices).
pub fn load(path: &std::path::Path) -> Result<PriceTable, PriceTableError> {
    let text = std::fs::read_to_string(path).map_err(|source| PriceTableError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_yaml_ng::from_str(&text).map_err(|source| PriceTableError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Why a price table file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PriceTableError {
    /// The file could not be read.
    #[error("failed to read the price table {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a price table.
    #[error(
        "failed to parse the price table {path}: {source}; expected `<model>: {{input: \"3\", output: \"15\", cacheRead: \"0.3\", cacheWrite: \"3.75\"}}` (dollars per million tokens)"
    )]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// The parser's error.
        #[source]
        source: serde_yaml_ng::Error,
    },
}
