//! git machinery of the Job Site: projections, patch bundles, integration, digests, merges.
