//! Nothing: the package's benches are its only targets (see `Cargo.toml`).
