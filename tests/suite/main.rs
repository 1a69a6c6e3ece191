//! The integration tests, one binary: each file below is a module, run as
//! `cargo test --all-features --test suite -- client::` (a module's tests) or
//! `-- client::a_test_name` (one test). One binary links the dependencies once and runs
//! every file's tests side by side, where a binary per file was built and linked 23 times
//! and run one after another (issue 57).
//!
//! Four files stay binaries of their own, each for process-wide state a test in another
//! file would disturb: `spans.rs` (tracing's callsite interest, read once per callsite),
//! `metrics.rs` (the global recorder), `properties.rs` (a panic hook that counts every
//! panic in the process) and `layer_tower.rs` (also run with no features at all).
//!
//! A module that needs a feature is compiled only with it, as `required-features` did for
//! a test binary.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod bad_input;
mod client;
mod deployment;
mod failover;
mod faults;
mod fencing;
mod fencing_clock;
mod guard;
mod jepsen;
#[cfg(feature = "axum")]
mod layer_axum;
#[cfg(feature = "tonic")]
mod layer_tonic;
#[cfg(feature = "axum")]
mod namespaces;
mod node_loss;
mod releases;
#[cfg(feature = "axum")]
mod replay_contract;
#[cfg(feature = "axum")]
mod replay_matrix;
#[cfg(feature = "axum")]
mod replay_restarts;
#[cfg(all(feature = "testing", feature = "axum"))]
mod testing_lock;
mod tls;
mod waiting;
#[cfg(all(feature = "axum", feature = "json"))]
mod webhook_body;
#[cfg(all(feature = "axum", feature = "json", feature = "webhook-verify"))]
mod webhook_receivers;
